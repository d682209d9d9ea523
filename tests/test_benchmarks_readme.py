"""benchmarks/README.md lists every benchmark (issue 47.4): a script added or removed without
its row fails here, so the list a newcomer reads stays the list there is."""

from __future__ import annotations

import re
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_the_readme_lists_every_benchmark_and_no_other():
    listed = set(re.findall(r"^\| `(\w+\.py)` \|", (BENCHMARKS / "README.md").read_text(), re.M))
    assert listed == {path.name for path in BENCHMARKS.glob("*.py")}
