"""No module of fid over 450 lines (issue 47; DESIGN.md section 6: small modules, one job). A
module that grows past it is split by job, as fid/models/reader.py and fid/retrieval/bm25.py were,
not let through: a long module is where several jobs hide."""

from __future__ import annotations

from pathlib import Path

FID = Path(__file__).resolve().parents[1] / "fid"
MAX_LINES = 450


def test_no_module_of_fid_is_over_450_lines():
    sizes = {
        path.relative_to(FID.parent).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path in sorted(FID.rglob("*.py"))
    }
    assert sizes, f"no modules found under {FID}"
    over = [f"{path}: {lines} lines" for path, lines in sizes.items() if lines > MAX_LINES]
    assert not over, f"modules over {MAX_LINES} lines (split them by job):\n" + "\n".join(over)
