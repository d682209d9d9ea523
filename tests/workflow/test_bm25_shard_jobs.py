"""bm25.shards (issue 48.2): with S > 1 the workflow builds BM25 as its own jobs, a statistics
pass, S shard builds and per split S shard retrievals and a merge, each a rule instance with
its own resources (SLURM runs the shards side by side), and the lists are those of one index,
byte for byte. The tiny demo, BM25 only (its first retrieval): the train, dev and test lists."""

from __future__ import annotations

import pytest
import yaml
from workflow_helpers import ROOT, planned_jobs, snakemake

pytestmark = pytest.mark.slow

TINY = ROOT / "tests" / "workflow" / "config.yaml"
LISTS = [f"results/tiny/bm25/retrieval/{split}.json" for split in ("train", "dev", "test")]


def _config(path, shards):
    data = yaml.safe_load(TINY.read_text())
    data["bm25"] = {**data.get("bm25", {}), "shards": shards}
    data["resources"]["build_bm25_shard"] = {"threads": 1, "mem_mb": 700, "runtime": 5}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_sharded_bm25_jobs_write_the_lists_of_one_index(tmp_path):
    runs = {}
    for shards in (1, 3):
        workdir = tmp_path / f"shards{shards}"
        config = _config(tmp_path / f"config{shards}.yaml", shards)
        plan = snakemake(workdir, "--configfile", str(config), "-n", "-p", *LISTS)
        assert plan.returncode == 0, plan.stderr[-3000:]
        jobs = planned_jobs(plan.stdout)
        rules = sorted(job["rule"] for job in jobs if "bm25" in job["rule"])
        if shards == 1:
            assert rules == ["build_bm25"] + ["retrieve_bm25"] * 3
        else:
            assert rules == (["bm25_stats"] + ["build_bm25_shard"] * 3 + ["merge_bm25"] * 3
                             + ["retrieve_bm25_shard"] * 9)  # fmt: skip
            builds = [job for job in jobs if job["rule"] == "build_bm25_shard"]
            assert sorted(job["wildcards"]["k"] for job in builds) == ["1", "2", "3"]
            assert all(job["resources"]["mem_mb"] == "700" for job in builds)
            assert "--shard 2/3" in next(j["shell"] for j in builds if j["wildcards"]["k"] == "2")
        run = snakemake(workdir, "--configfile", str(config), "--cores", "2", *LISTS)
        assert run.returncode == 0, run.stderr[-3000:]
        runs[shards] = {name: (workdir / name).read_bytes() for name in LISTS}
    for name in LISTS:
        assert runs[3][name] == runs[1][name], name
