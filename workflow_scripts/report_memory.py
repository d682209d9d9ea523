"""The report's memory table: per trained model, the peak per rank its stage's plan predicted
(memory_plans, as the workflow checked it) against the peak its training logged (the `train`
records of its metrics.jsonl: fid.runtime.logs.PeakMemory, rank 0), the largest peak of any of
its ranks (each rank's own, `rank_peaks_mb`), the host memory the job asked for, and the
resident peak of Snakemake's benchmark of the job (its process tree on the node Snakemake's job
step runs on: for ranks started by srun, the srun client alone, on one node or several).

Run by rule report_memory; `memory_table` is the whole of it, importable without Snakemake."""

import dataclasses
import json
from pathlib import Path

import pandas as pd
import yaml
from memory_plans import TrainingJob, comparable_peak, host_mem_mb, plan

BENCHMARK_RSS = "benchmark RSS (MB)"
COLUMNS = ["model", "rule", "device", "ranks", "predicted (MiB)", "measured (MiB)",
           "measured - predicted (MiB)", "largest rank peak (MiB)", "request per rank (MiB)",
           BENCHMARK_RSS]  # fmt: skip
NOTES = [
    "Per trained model: the peak memory per rank that its stage's plan predicted (fid "
    "plan-memory, as the workflow checked it before running anything) against the peak its "
    "training logged (metrics.jsonl, rank 0, the largest over the run's logging intervals).",
    "On GPUs the measured peak is torch's max_memory_allocated: the tensors alone, so the "
    "prediction shown leaves out the plan's allowances for the CUDA context and the caching "
    "allocator (which the check counts). On CPUs it is the process's resident peak (VmHWM), "
    "which also holds what the process has before any model (the interpreter, torch, the lists: "
    "~0.4 GB), so 'measured - predicted' is that part.",
    "'largest rank peak' is the largest of every rank's own logged peak (the same measure, "
    "each rank's: metrics.jsonl's rank_peaks_mb). 'request per rank' is the job's host memory "
    "request (mem_mb) over the ranks on one node: the plan's, or the configuration's where it "
    "sets mem_mb. 'benchmark RSS' is the resident peak of Snakemake's benchmark of the job: the "
    "process tree of the job step, whose ranks it holds when they are local processes, but "
    "not when srun starts them (`mpi: srun`, one node or several): then it is the srun "
    "client's alone. A '-' where a model has no plan (its shape could not be read when the "
    "workflow loaded) or a file is missing.",
]


def memory_table(models: dict, folders: dict) -> pd.DataFrame:
    """One row per trained model. `models`: rule report_memory's params (name -> {"job":
    TrainingJob fields or None, "mem_mb": the configured request or None, "benchmark": path});
    `folders`: name -> the exported model folder (metrics.jsonl, train_config.yaml)."""
    rows = []
    for name, spec in models.items():
        folder = Path(folders[name])
        records = [json.loads(line) for line in (folder / "metrics.jsonl").open()]
        train = [r for r in records if r.get("kind") == "train"]
        peaks = [r["peak_memory_mb"] for r in train]
        rank_peaks = [p for r in train for p in r.get("rank_peaks_mb", [])]
        row = {"model": name, "measured (MiB)": max(peaks) if peaks else None,
               "largest rank peak (MiB)": max(rank_peaks) if rank_peaks else None}  # fmt: skip
        benchmark = Path(spec["benchmark"])
        if benchmark.is_file():
            row[BENCHMARK_RSS] = pd.read_csv(benchmark, sep="\t").iloc[-1]["max_rss"]
        if spec["job"] is not None:
            job = _as_run(TrainingJob(**spec["job"]), folder / "train_config.yaml")
            predicted = comparable_peak(job, plan(job)) / 2**20
            request = spec["mem_mb"] or host_mem_mb(job, _data_bytes(folder / "train_config.yaml"))
            row |= {"rule": job.rule, "device": job.device, "ranks": job.world,
                    "predicted (MiB)": predicted, "request per rank (MiB)":
                    request / job.ranks_per_node}  # fmt: skip
            if row["measured (MiB)"] is not None:
                row["measured - predicted (MiB)"] = row["measured (MiB)"] - predicted
        rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS)


def _as_run(job: TrainingJob, train_config: Path) -> TrainingJob:
    """The job with the token budget its run resolved (`max_tokens_per_batch: auto` becomes a
    number at the run's first start, recorded with the model)."""
    if job.knobs.get("max_tokens_per_batch") != "auto" or not train_config.is_file():
        return job
    ran = yaml.safe_load(train_config.read_text())
    keys = ("max_tokens_per_batch", "gradient_accumulation_steps")
    return dataclasses.replace(job, knobs={**job.knobs, **{k: ran[k] for k in keys}})


def _data_bytes(train_config: Path) -> int:
    """The sizes of the training and dev lists the run read (recorded with the model)."""
    if not train_config.is_file():
        return 0
    inputs = yaml.safe_load(train_config.read_text()).get("inputs") or {}
    return sum(inputs.get(split, {}).get("bytes", 0) for split in ("train", "dev"))


def main(snakemake) -> None:
    from report_page import write_page

    params, output = snakemake.params, snakemake.output
    folders = dict(zip(params.models, snakemake.input.models, strict=True))
    table = memory_table(params.models, folders).round(1)
    table.to_csv(output.table, index=False)
    write_page(output.page, "Memory: predicted against measured peak per rank", NOTES,
               table.fillna("-"), output.table)  # fmt: skip


if "snakemake" in globals():  # run by Snakemake's script directive, which injects it
    main(globals()["snakemake"])
