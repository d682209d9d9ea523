"""No import circle anywhere in fid (issue 47). The layer contracts in pyproject.toml order the
stages and the modules inside fid.models, fid.retrieval and fid.training; this checks every
package, the others too, function-level imports included (a deferred import is still a circle:
a module that needs its importer back cannot be read, tested or moved alone)."""

from __future__ import annotations

import grimp


def test_no_module_of_fid_imports_itself_back():
    graph = grimp.build_graph("fid", cache_dir=None)
    circles = []
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back is not None:
                circles.append(" -> ".join((module, *back)))
    assert not circles, "import circles:\n" + "\n".join(circles)
