"""A command imports what it needs (issue 46.3): `fid build-index` reads embedding shards and
runs faiss, and no longer imports transformers (~2 s of CPU a job, three jobs in the demo)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from fid.retrieval.embeddings import save_embedding_shard

# The command in a process of its own (this one has transformers): what it imported, at exit.
CODE = """
import atexit, sys
atexit.register(lambda: print("transformers" in sys.modules, "torch" in sys.modules))
from fid.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_build_index_imports_no_transformers(tmp_path):
    vectors = np.random.default_rng(0).standard_normal((40, 8)).astype(np.float32)
    shards = []
    for k in range(2):  # two shards, as two embed-passages jobs write them
        shards.append(tmp_path / f"shard{k}")
        rows = slice(20 * k, 20 * (k + 1))
        ids = [f"p{i}" for i in range(rows.start, rows.stop)]
        save_embedding_shard(shards[-1], vectors[rows], ids, k, 2, "tiny-retriever")
    done = subprocess.run(
        [sys.executable, "-c", CODE, "--threads", "1", "build-index",
         "--shards", *map(str, shards), "--output", str(tmp_path / "index")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "index").is_dir()
    transformers, torch = done.stdout.split()[-2:]
    assert transformers == "False"
    assert torch == "True"  # the CLI sets torch's threads for a command that runs models
