"""benchmarks/README.md lists every benchmark (issue 47.4): a script added or removed without
its row fails here, so the list a newcomer reads stays the list there is; and a script in a
group folder is listed in that group's section."""

from __future__ import annotations

import re
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SHARED = {"harness.py", "__init__.py"}  # the harness and the package, described in prose
ROW = re.compile(r"^\| `([\w/]+\.py)` \|", re.M)


def _sections() -> dict[str, list[str]]:
    """Each `## Title (`folder/`)` section's folder and the scripts its rows name."""
    found = {}
    for section in re.split(r"^## ", (BENCHMARKS / "README.md").read_text(), flags=re.M)[1:]:
        folder = re.search(r"\(`(\w+)/`\)", section.splitlines()[0])
        found[folder.group(1) if folder else section.splitlines()[0]] = ROW.findall(section)
    return found


def test_the_readme_lists_every_benchmark_and_no_other():
    listed = [script for scripts in _sections().values() for script in scripts]
    scripts = {str(path.relative_to(BENCHMARKS)) for path in BENCHMARKS.rglob("*.py")} - SHARED
    assert len(listed) == len(set(listed)), f"listed twice: {sorted(listed)}"
    assert not scripts - set(listed), f"scripts without a row: {sorted(scripts - set(listed))}"
    assert not set(listed) - scripts, f"rows without a script: {sorted(set(listed) - scripts)}"


def test_a_group_folders_scripts_are_listed_in_its_section():
    sections = _sections()
    folders = {path.name for path in BENCHMARKS.iterdir() if path.is_dir() and path.name[0] != "_"}
    assert folders <= set(sections), f"a folder without its section: {folders - set(sections)}"
    for folder, scripts in sections.items():
        grouped = [script for script in scripts if "/" in script]
        assert all(script.startswith(f"{folder}/") for script in grouped), (folder, scripts)
