"""The workflow plans before it runs (rules/memory.smk, workflow_scripts/memory_plans.py): a
config whose training step cannot fit `gpu_memory` stops when the workflow loads, with the
plan's table, before any job; one that fits plans as before; the training jobs' mem_mb comes
from their plans unless the config sets it; and the report's table puts each trained model's
predicted peak beside the one its training logged. Dry runs and tiny models: seconds."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import time
from pathlib import Path

import pytest
import yaml

from fid.memory.sizes import parse_size

sys.path.insert(0, str(Path(__file__).parent / "workflow"))
sys.path.insert(0, str(Path(__file__).parents[1] / "workflow_scripts"))

import memory_plans  # noqa: E402
from memory_plans import TrainingJob  # noqa: E402
from workflow_helpers import ROOT, loaded_workflow, snakemake  # noqa: E402

TINY = ROOT / "tests" / "workflow" / "config.yaml"


def _config(path: Path, **changes) -> Path:
    """The tiny workflow config (tests/workflow/config.yaml) with top-level keys replaced; the
    reader's jobs on one GPU each (gres), so that `gpu_memory` applies to them."""
    data = yaml.safe_load(TINY.read_text())
    data["resources"]["train_reader"] = {"gres": "gpu:1"}
    data.update(changes)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _tiny_job(rule="train_reader", stage="reader", device="cpu", world=2, **knobs) -> TrainingJob:
    data = yaml.safe_load(TINY.read_text())
    kind = "reader" if rule == "train_reader" else "retriever"
    return TrainingJob(
        rule=rule, stage=stage, knobs={**data[kind], **knobs},
        model={"init": kind, "knobs": data[f"init_{kind}"]}, model_arg=f"results/tiny/init/{kind}",
        world=world, ranks_per_node=world, device=device,
    )  # fmt: skip


def test_a_config_that_cannot_fit_stops_before_anything_runs(tmp_path):
    config = _config(tmp_path / "c.yaml", gpu_memory="1MiB")
    started = time.perf_counter()
    # a real run, not a dry one: that nothing ran is what is checked
    result = snakemake(tmp_path, "--configfile", str(config), "--cores", "1", timeout=600)
    message = result.stdout + result.stderr
    assert result.returncode != 0, message[-3000:]
    assert "train_reader, config section 'reader_warmup'" in message, message[-3000:]
    assert "does not fit gpu_memory = 1.0 MiB (each rank's GPU); nothing was run" in message
    # the plan's table (fid plan-memory's) and what to change
    for line in ("weights", "optimizer states", "activations", "peak per rank"):
        assert re.search(rf"^{line} +[\d.]+ [MG]iB$", message, re.M), (line, message[-3000:])
    assert "fid plan-memory --for train-reader" in message and "Hint:" in message
    # every stage that cannot fit is named, in one error
    assert "config section 'reader_later'" in message
    assert not any((tmp_path / d).exists() for d in ("results", "resources", "state", "logs"))
    print(f"refused in {time.perf_counter() - started:.1f} s")


def test_a_config_that_fits_plans(tmp_path):
    config = _config(tmp_path / "c.yaml", gpu_memory="80GiB")
    result = snakemake(tmp_path, "--configfile", str(config), "-n", "-p", "--cores", "2")
    message = result.stdout + result.stderr
    assert result.returncode == 0, message[-3000:]
    assert "train_reader" in message and "does not fit" not in message
    # the training jobs' mem_mb is the plan's and the size of their lists, which a fresh dry
    # run does not know yet (Snakemake's <TBD>); the rest keep resources.default's
    for block in re.split(r"\n(?=rule \w+:\n)", message):
        if block.startswith(("rule train_reader:", "rule train_retriever:")):
            assert "mem_mb=<TBD>" in block, block
        elif block.startswith("rule eval_reader:"):
            assert "mem_mb=1000" in block, block


def test_mem_mb_comes_from_the_plan_unless_the_config_sets_it(tmp_path):
    lists = [tmp_path / "train.json", tmp_path / "dev.json"]
    for path, size in zip(lists, (30_000_000, 1_000_000), strict=True):
        path.write_bytes(b"x" * size)
    # the rule's mem_mb function on a round-1 reader job whose lists exist, as Snakemake calls it
    call = (
        "workflow.globals['planned_mem_mb']('{rule}').get('mem_mb', lambda w, i: None)("
        "type('W', (), {{'i': '1', 'get': lambda self, k, d=None: {stage} if k == 'stage' "
        "else d}})(), type('I', (), {{'train': '{train}', 'dev': '{dev}'}})())"
    )
    expression = "[" + ", ".join([
        call.format(rule="train_reader", stage="'reader'", train=lists[0], dev=lists[1]),
        call.format(rule="train_retriever", stage="d", train=lists[0], dev=lists[1]),
        "workflow.globals['_resources']('train_reader').get('mem_mb')",
        "workflow.globals['_resources']('eval_reader').get('mem_mb')",
    ]) + "]"  # fmt: skip
    reader, retriever, reader_static, evaluation = loaded_workflow(
        tmp_path, _config(tmp_path / "c.yaml"), expression
    )
    job = _tiny_job(stage="reader_later", device="cuda", world=1, max_steps=3)
    expected = memory_plans.host_mem_mb(job, 31_000_000)
    # per rank on GPUs: the process (4 GiB), weights + AdamW's moments, 3x the lists
    assert reader == expected == -(-(4 * 2**30 + 3 * memory_plans.weights(job) + 93_000_000)
                                    // 2**20)  # fmt: skip
    # the retriever runs on this machine's CPUs: its planned step instead of the weights
    cpu_job = _tiny_job("train_retriever", "retriever_later", world=1, max_steps=3)
    assert retriever == memory_plans.host_mem_mb(cpu_job, 31_000_000)
    # before the lists exist (the SLURM layout check): the largest of the rule's stages
    assert reader_static >= memory_plans.host_mem_mb(job, 0) and evaluation == 1000
    # the user's mem_mb wins
    data = yaml.safe_load(_config(tmp_path / "c.yaml").read_text())
    data["resources"]["train_reader"]["mem_mb"] = 1234
    (tmp_path / "o.yaml").write_text(yaml.safe_dump(data))
    assert loaded_workflow(tmp_path, tmp_path / "o.yaml", expression)[0] is None
    assert loaded_workflow(tmp_path, tmp_path / "o.yaml", expression)[2] == 1234


def test_check_refuses_warns_or_passes():
    job = _tiny_job(device="cuda", world=1)
    full, one = memory_plans.plan(job)["peak"], memory_plans.plan(job, questions=1)["peak"]
    assert one < full
    assert memory_plans.check(job, full, 0) == ("", "")
    assert memory_plans.check(job, None, 0) == ("", "")  # no gpu_memory: not checked
    # the reader splits a step out of memory: one question must fit, the rest is a warning
    error, warning = memory_plans.check(job, (one + full) // 2, 0)
    assert not error and "will run out of memory and be redone in smaller" in warning
    error, warning = memory_plans.check(job, one - 1, 0)
    assert "does not fit" in error and "largest micro-batch: 1 question(s)" in error
    # FSDP over several ranks is not recovered: its whole micro-batch must fit
    fsdp = _tiny_job(device="cuda", world=2, sharding="fsdp")
    assert "does not fit" in memory_plans.check(fsdp, memory_plans.plan(fsdp)["peak"] - 1, 0)[0]
    # the retriever's in-batch negatives are part of its loss: its whole micro-batch must fit
    retriever = _tiny_job("train_retriever", "retriever", device="cuda", world=1)
    peak = memory_plans.plan(retriever)["peak"]
    assert "does not fit" in memory_plans.check(retriever, peak - 1, 0)[0]
    # on a CPU the host's memory, shared by the job's ranks, each with its process besides
    cpu = _tiny_job(world=2)
    need = 2 * (memory_plans.PROCESS_BYTES["cpu"] + memory_plans.plan(cpu)["peak"])
    assert memory_plans.check(cpu, None, need) == ("", "")
    assert "this machine's memory" in memory_plans.check(cpu, None, need - 4)[0]


def test_plans_are_cached_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(memory_plans, "_MEMO", {})
    job = _tiny_job(max_steps=7)
    planned = memory_plans.plan(job)
    assert len(list((tmp_path / "fid" / "memory-plans").glob("*.json"))) == 1
    monkeypatch.setattr(memory_plans, "_MEMO", {})

    def no_trace(*args):
        raise AssertionError("planned again")

    monkeypatch.setattr(memory_plans, "_compute_plan", no_trace)
    assert memory_plans.plan(job) == planned
    # another knob is another plan
    with pytest.raises(AssertionError, match="planned again"):
        memory_plans.plan(dataclasses.replace(job, knobs={**job.knobs, "n_passages": 2}))


def test_gpu_memory_is_read_as_fid_plan_memory_reads_sizes(tmp_path):
    # one function (fid.memory.sizes, torch-free) for the workflow's gpu_memory and the CLI's
    # --gpu-memory: the workflow keeps no copy of it
    assert not hasattr(memory_plans, "parse_size")
    assert parse_size(1024) == parse_size("1024") == 1024 and parse_size("40 GB") == 40 * 10**9
    # 0GiB: a size to the schema, not a positive one
    result = snakemake(tmp_path, "--configfile", str(_config(tmp_path / "c.yaml")), "-n",
                       "--config", "gpu_memory=0GiB")  # fmt: skip
    message = result.stdout + result.stderr
    assert result.returncode != 0, message[-3000:]
    assert "gpu_memory = '0GiB' is not a size: expected a positive number" in message


def test_report_table_from_a_memory_log(tmp_path):
    from report_memory import memory_table

    folder = tmp_path / "iter0" / "reader" / "model"
    folder.mkdir(parents=True)
    records = [{"kind": "train", "step": 3, "peak_memory_mb": 455.1,
                "rank_peaks_mb": [455.1, 470.2]},
               {"kind": "dev", "step": 3, "exact_match": 10.0},
               {"kind": "train", "step": 6, "peak_memory_mb": 461.5,
                "rank_peaks_mb": [461.5, 466.0]}]  # fmt: skip
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    inputs = {"train": {"bytes": 200_000}, "dev": {"bytes": 20_000}}
    (folder / "train_config.yaml").write_text(yaml.safe_dump({"inputs": inputs}))
    benchmark = tmp_path / "reader.tsv"
    benchmark.write_text("s\th:m:s\tmax_rss\tcpu_time\n8.9\t0:00:08\t912.5\t3.9\n")
    job = _tiny_job(world=2)
    models = {
        "iter0/reader": {"job": dataclasses.asdict(job), "mem_mb": None,
                         "benchmark": str(benchmark)},
        "iter0/retriever": {"job": None, "mem_mb": None, "benchmark": str(tmp_path / "none")},
    }  # fmt: skip
    table = memory_table(models, {"iter0/reader": folder, "iter0/retriever": folder})
    reader = table.iloc[0]
    predicted = memory_plans.plan(job)["peak"] / 2**20
    assert (reader["model"], reader["rule"], reader["device"], reader["ranks"]) == (
        "iter0/reader", "train_reader", "cpu", 2)  # fmt: skip
    assert reader["measured (MiB)"] == 461.5 and reader["predicted (MiB)"] == pytest.approx(
        predicted
    )
    assert reader["measured - predicted (MiB)"] == pytest.approx(461.5 - predicted)
    assert reader["request per rank (MiB)"] == memory_plans.host_mem_mb(job, 220_000) / 2
    assert reader["largest rank peak (MiB)"] == 470.2  # rank 1's, at step 3
    assert reader["benchmark RSS (MB)"] == 912.5
    # a model without a plan: its measured peak alone
    unplanned = table.iloc[1]
    assert unplanned["measured (MiB)"] == 461.5 and unplanned.isna()["predicted (MiB)"]


def test_cuda_measurements_compare_to_the_tensors():
    job = _tiny_job(device="cuda", world=1)
    planned = memory_plans.plan(job)
    allowances = planned["components"]["CUDA runtime allowance"]
    allowances += planned["components"]["allocator allowance"]
    assert memory_plans.comparable_peak(job, planned) == planned["peak"] - allowances


def test_gpu_memory_is_no_rerun_trigger(tmp_path):
    # the SLURM profile sets gpu_memory; a dry run without the profile must not find the run's
    # configuration page out of date (its params leave gpu_memory out: it computes nothing)
    config = _config(tmp_path / "c.yaml")
    target = "results/tiny/report/config.yaml"
    ran = snakemake(tmp_path, "--configfile", str(config), "--cores", "1", "--config",
                    "gpu_memory=80GiB", "--", target)  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "gpu_memory" not in (tmp_path / target).read_text()
    planned = snakemake(tmp_path, "--configfile", str(config), "-n", target)
    assert "Nothing to be done" in planned.stdout + planned.stderr, planned.stdout[-3000:]
