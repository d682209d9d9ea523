"""The report's run time per rule, from the benchmark files Snakemake wrote for this run's jobs
(logs/benchmarks/{rule}/{run}[.tsv|/...], and the downloads of its dataset: wall seconds, CPU
seconds of the job's whole process tree, peak RSS): jobs, wall and CPU time summed per rule,
the largest peak, and the totals."""

from pathlib import Path

import pandas as pd
from report_page import write_page

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
params, output = snakemake.params, snakemake.output

folder = Path(params.folder)
# the run's jobs, and the downloads of its dataset (shared by the runs on it)
patterns = [f"*/{params.run}.tsv", f"*/{params.run}/**/*.tsv"]
patterns += [f"{rule}/{params.dataset}/**/*.tsv" for rule in ("download", "extract")]
paths = {path for pattern in patterns for path in folder.glob(pattern)}
rows = []
for path in sorted(paths):
    job = pd.read_csv(path, sep="\t").iloc[-1]  # a repeated benchmark: its last run
    rows.append({"rule": path.relative_to(params.folder).parts[0], "wall (s)": job["s"],
                 "CPU (s)": job["cpu_time"], "peak RSS (MB)": job["max_rss"]})  # fmt: skip
jobs = pd.DataFrame(rows, columns=["rule", "wall (s)", "CPU (s)", "peak RSS (MB)"])
table = jobs.groupby("rule").agg(jobs=("rule", "size"), **{
    "wall (s)": ("wall (s)", "sum"), "CPU (s)": ("CPU (s)", "sum"),
    "peak RSS (MB)": ("peak RSS (MB)", "max")}).reset_index()  # fmt: skip
table = table.sort_values("CPU (s)", ascending=False)
total = {"rule": "all jobs", "jobs": len(jobs), "wall (s)": jobs["wall (s)"].sum(),
         "CPU (s)": jobs["CPU (s)"].sum(), "peak RSS (MB)": jobs["peak RSS (MB)"].max()}  # fmt: skip
table = pd.concat([table, pd.DataFrame([total])], ignore_index=True).round(1)
table.to_csv(output.table, index=False)
write_page(output.page, "Run time per rule", [
    "From Snakemake's benchmark files of this run's jobs: wall time and CPU time (the job's "
    "whole process tree, all its ranks) summed over a rule's jobs, in seconds, and the largest "
    "peak resident memory of one job. Wall time is exact; CPU time and memory are sampled "
    "(each second for a job's first 30 s, then every 30 s), so CPU time is a lower bound: the "
    "work after a job's last sample is missing (about a fifth of the demo's CPU time). Jobs "
    "that ran at the same time overlap in wall time; the report's Statistics section has each "
    "job's start and end. A job run again counts its last run. A job whose ranks srun starts "
    "(`mpi: srun`, on one node or several) is measured as the srun client only: its ranks' CPU "
    "time and memory are not in it (the Memory page has each rank's logged peak).",
], table, output.table)  # fmt: skip
