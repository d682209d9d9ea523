"""How each rule of the scale rehearsal grows with the data, extrapolated to full NQ.

Runs the rehearsal (`config/scale.yaml`: NQ's pipeline shape, tiny models) at each of --scales
(fraction of NQ: 1.0 = 21,015,324 passages, 79,168 / 8,757 / 3,610 questions) for each list
format (`compact`: passage ids through a passage store; `fid_json`: FiD json with the texts),
each in a fresh folder WORKDIR/{format}-{scale}/ (a full copy of scale.yaml with the changed keys
is that run's only config file), then measures every job:

- wall time: Snakemake's benchmark file (`logs/benchmarks/{rule}/...tsv`, column `s`);
- CPU time, peak RSS and bytes written: exactly, by getrusage(RUSAGE_CHILDREN) of a `fid` shim
  put first on PATH (WORKDIR/.../bin/fid runs the real fid and writes logs/rusage/...json beside
  the job's log). Snakemake's own columns are sampled every 0.5 s for 15 s, then every 30 s,
  and keep the last sample: a 25 s job loses its last 10 s of CPU and writes and any later peak.
  They are kept in --json (`bench_*`) and used only when a shim record is missing.

Per rule it sums wall, CPU and bytes written over the rule's jobs and takes the max of peak RSS
(the largest single job's CPU and bytes are kept too), then fits, against the scale s:
- `slope`: the log-log least-squares slope (1 = proportional to the data, 0 = flat);
- the law v = a + b * s (a, b >= 0, least squares relative to v), for every quantity: a is the
  constant (imports, process and model baseline), b the growing part at full NQ (s = 1), so the
  extrapolation is a + b; `GROWS_IN` says, from each rule's code, what b is proportional to.
Why not a free exponent (a + b * s**k): over a 4x range the growing part is a few percent of a
~3 s / ~300 MB baseline, and a fitted k extrapolated 250-fold turns noise into hours and
gigabytes (tried: 17 CPU h for make_scale_data, which takes ~6 CPU min at s = 1). Why not RSS
minus the smallest scale's: the same slope, without using the middle points. What a linear law
cannot show: work that is a product of two sizes (Flat search: questions x passages) hides under
the constant at these scales, and memory that stops growing where a batch or chunk is full
(embedding's sort_chunk, scoring's 256-question tokenizing chunk, eval batches) is extrapolated
as if it kept growing: read the extrapolation as an upper bound for those (docs/scale.md).

The extrapolation gives each rule at s = 1 per job (peak RSS per process, largest job's CPU) and
in total (CPU hours, GB written), compact and fid_json side by side, and what is written per
round (jobs of iter{i}, divided by the rounds) and once. Below s = 0.001 the test split (3,610 s
questions) is under one batch of 4 (eval, scoring): batches, not data, then grow with s, so the
default scales start at 0.001 (each run 15-40 min on a busy 2-core machine). Steps are fixed
(max_steps 4): training CPU says nothing about NQ's 15,000 steps; shards are 16 (NQ: 64).

    python benchmarks/data/scale_growth.py                                  # 3 scales x 2 formats
    python benchmarks/data/scale_growth.py --scales 0.001 0.002 0.004 0.008 --list-format compact
    python benchmarks/data/scale_growth.py --no-run --json growth.json      # re-read the workdirs
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # `benchmarks.harness` however this file is run

from benchmarks.harness import record, table_header, table_row, timed, write_record  # noqa: E402

ORDER = ["make_scale_data", "build_passage_store", "build_bm25", "retrieve_bm25", "eval_baseline",
         "init_reader", "init_retriever", "train_reader", "score_passages", "eval_reader",
         "train_retriever", "embed_passages", "build_index", "retrieve", "eval_retrieval"]  # fmt: skip
GROWS_IN = {  # what each rule's work is proportional to, from its code (the fit checks it)
    "make_scale_data": "passages", "build_passage_store": "passages", "build_bm25": "passages",
    "retrieve_bm25": "questions x postings (~ passages)", "eval_baseline": "questions",
    "init_reader": "passages (tokenizer on the corpus)", "init_retriever": "passages (same)",
    "train_reader": "steps (fixed) + dev questions", "score_passages": "train+dev questions",
    "eval_reader": "dev+test questions", "train_retriever": "steps (fixed) + dev questions",
    "embed_passages": "passages / shards", "build_index": "passages",
    "retrieve": "questions x passages (Flat)", "eval_retrieval": "questions",
}  # fmt: skip
QUANTITIES = {"wall_s": "wall s", "cpu_s": "CPU s", "rss_mb": "RSS MB", "written_mb": "MB"}
SHIM = """#!{python}
import json, os, resource, subprocess, sys, time
start = time.time()
code = subprocess.call([{fid!r}, *sys.argv[1:]])
use = resource.getrusage(resource.RUSAGE_CHILDREN)
log = os.path.relpath(os.path.realpath("/proc/self/fd/1"))
if log.startswith("logs/") and log.endswith(".log"):
    path = "logs/rusage/" + log[5:-4] + ".json"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as out:
        json.dump({{"wall_s": time.time() - start, "cpu_s": use.ru_utime + use.ru_stime,
                   "rss_mb": use.ru_maxrss / 1024, "written_mb": use.ru_oublock / 2048}}, out)
sys.exit(code if code >= 0 else 128 - code)
"""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", type=float, nargs="+", default=[1e-3, 2e-3, 4e-3])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/fid_scale_growth"))
    parser.add_argument("--list-format", choices=["compact", "fid_json", "both"], default="both")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--no-run", action="store_true", help="only read existing workdirs")
    parser.add_argument("--json", type=Path, help="also write every job and fit here")
    return parser.parse_args()


def prepare_workdir(folder: Path, scale: float, fmt: str) -> Path:
    """A fresh folder with its config (scale.yaml with the changed keys) and the fid shim."""
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "bin").mkdir(parents=True)
    config = yaml.safe_load((ROOT / "config" / "scale.yaml").read_text())
    config["scale_data"]["scale"] = scale
    config["list_format"] = fmt
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    real_fid = shutil.which("fid", path=str(Path(sys.executable).parent)) or "fid"
    shim = folder / "bin" / "fid"
    shim.write_text(SHIM.format(python=sys.executable, fid=real_fid))
    shim.chmod(0o755)
    return folder


def run_rehearsal(folder: Path, cores: int) -> dict:
    """Runs the whole rehearsal in `folder`; returns the command, its status and wall time."""
    venv = Path(sys.executable).parent
    command = [str(venv / "snakemake"), "-s", str(ROOT / "Snakefile"), "--configfile"]
    command += ["config.yaml", "--cores", str(cores), "--keep-going"]
    path = f"{folder / 'bin'}{os.pathsep}{venv}{os.pathsep}"
    env = {**os.environ, "PATH": path + os.environ["PATH"]}
    with timed() as clock, open(folder / "snakemake.log", "w") as log:
        code = subprocess.call(command, cwd=folder, env=env, stdout=log, stderr=log)
    failed = sorted({m for m in re.findall(r"log: (logs/\S+)", _errors(folder))})
    return {"command": " ".join(command), "returncode": code, "wall_s": clock.wall_s,
            "failed_logs": failed}  # fmt: skip


def _errors(folder: Path) -> str:
    text = (folder / "snakemake.log").read_text()
    return "\n".join(block for block in text.split("\n\n") if "Error in rule" in block)


def read_jobs(folder: Path) -> pd.DataFrame:
    """One row per job: its rule, wall time (benchmark file) and exact rusage (shim)."""
    rows = []
    for tsv in sorted((folder / "logs" / "benchmarks").rglob("*.tsv")):
        key = tsv.relative_to(folder / "logs" / "benchmarks").with_suffix("")
        bench = pd.read_csv(tsv, sep="\t").iloc[-1]
        shim = folder / "logs" / "rusage" / key.with_suffix(".json")
        exact = json.loads(shim.read_text()) if shim.exists() else {}
        sampled = {"cpu_s": bench["cpu_time"], "rss_mb": bench["max_rss"]}
        sampled["written_mb"] = bench["io_out"]
        row = {"rule": key.parts[0], "job": "/".join(key.parts[2:]) or "-"}
        row["wall_s"] = float(bench["s"])
        for name, value in sampled.items():
            row[f"bench_{name}"] = pd.to_numeric(value, errors="coerce")
            row[name] = exact.get(name, row[f"bench_{name}"])
        rows.append(row)
    return pd.DataFrame(rows)


def per_rule(jobs: pd.DataFrame) -> pd.DataFrame:
    """Per (format, scale, rule): sums over jobs (max for RSS) and the largest single job."""
    grouped = jobs.groupby(["format", "scale", "rule"])
    total = grouped.agg(jobs=("job", "size"), wall_s=("wall_s", "sum"), cpu_s=("cpu_s", "sum"),
                        rss_mb=("rss_mb", "max"), written_mb=("written_mb", "sum"))  # fmt: skip
    largest = grouped[["wall_s", "cpu_s", "written_mb"]].max().add_prefix("job_")
    table = total.join(largest).reset_index()
    rank = table["rule"].map({rule: i for i, rule in enumerate(ORDER)}).fillna(len(ORDER))
    return table.assign(rank=rank).sort_values(["format", "rank", "scale"]).drop(columns="rank")


def fit_law(scales: np.ndarray, values: np.ndarray) -> dict:
    """v = a + b * s (a, b >= 0, least squares relative to v) and the log-log slope of v."""
    ok = np.isfinite(values) & (values > 0)
    s, v = scales[ok], values[ok]
    if len(set(s)) < 2:
        return {}
    design = np.stack([np.ones_like(s), s], axis=1) / v[:, None]
    a, b = np.linalg.lstsq(design, np.ones_like(s), rcond=None)[0]
    if a < 0 or b < 0:  # the best fit on the boundary: one term alone
        options = [(0.0, np.sum(s / v) / np.sum((s / v) ** 2))]
        options.append((np.sum(1 / v) / np.sum(1 / v**2), 0.0))
        a, b = min(options, key=lambda ab: np.sum(((ab[0] + ab[1] * s) / v - 1) ** 2))
    slope = float(np.polyfit(np.log(s), np.log(v), 1)[0])
    growth = b * (s.max() - s.min()) / (a + b * s.min())  # over the measured range
    return {"a": float(a), "b": float(b), "slope": slope, "at_nq": float(a + b), "grew": growth}


def fit_all(rules: pd.DataFrame) -> pd.DataFrame:
    """Every law per (format, rule): totals, the largest job's, and the peak RSS."""
    rows = []
    for (fmt, rule), group in rules.groupby(["format", "rule"]):
        s = group["scale"].to_numpy()
        row = {"format": fmt, "rule": rule}
        for column in ("wall_s", "cpu_s", "rss_mb", "written_mb", "job_cpu_s", "job_written_mb"):
            row[column] = fit_law(s, group[column].to_numpy(float))
        rows.append(row)
    return pd.DataFrame(rows)


def growth_table(rules: pd.DataFrame, fmt: str) -> str:
    """Markdown: per rule, wall / CPU / peak RSS / written at each scale (one format)."""
    data = rules[rules["format"] == fmt]
    scales = sorted(data["scale"].unique())
    columns = [f"rule ({fmt})", "jobs", *(f"s = {s:g}" for s in scales)]
    lines = [table_header(columns, align="l" + "r" * (len(columns) - 1))]
    for rule, group in data.groupby("rule", sort=False):
        cells = group.set_index("scale").reindex(scales)
        text = [
            " · ".join("–" if pd.isna(r[q]) else f"{r[q]:.3g}" for q in QUANTITIES)
            for _, r in cells.iterrows()
        ]
        lines.append(table_row([rule, int(group["jobs"].max()), *text]))
    return "\n".join(lines) + "\n\ncells: " + " · ".join(QUANTITIES.values()) + " (totals)"


def _law(law: dict) -> str:
    if not law:
        return "–"
    flat = " flat" if law["grew"] < 0.1 else ""
    return f"{law['a']:.3g} + {law['b']:.3g}·s (slope {law['slope']:.2f}{flat})"


def law_table(laws: pd.DataFrame) -> str:
    """Markdown: the fitted laws per rule and format, and what the work is proportional to."""
    columns = ["rule", "format", "CPU s (total)", "peak RSS MB", "MB written (total)", "grows in"]
    lines = [table_header(columns)]
    for _, r in laws.sort_values(["rule", "format"]).iterrows():
        laws_text = [_law(r[c]) for c in ("cpu_s", "rss_mb", "written_mb")]
        lines.append(table_row([r["rule"], r["format"], *laws_text, GROWS_IN.get(r["rule"])]))
    return "\n".join(lines) + "\n\nflat: grew < 10% over the measured scales (constants dominate)"


def extrapolation_table(laws: pd.DataFrame) -> str:
    """Markdown: every rule at full NQ (s = 1), compact and fid_json side by side."""
    formats = sorted(laws["format"].unique())
    columns = [
        ("peak RSS/job GB", "rss_mb", "at_nq", 1 / 1024),
        ("RSS growth GB", "rss_mb", "b", 1 / 1024),
        ("largest job CPU h", "job_cpu_s", "at_nq", 1 / 3600),
        ("CPU h", "cpu_s", "at_nq", 1 / 3600),
        ("written GB", "written_mb", "at_nq", 1 / 1024),
    ]
    head = [f"{name} ({f})" for name, *_ in columns for f in formats]
    lines = [table_header(["rule", *head], align="l" + "r" * len(head))]
    table = laws.set_index(["rule", "format"])
    for rule in laws["rule"].unique():
        cells = []
        for _, column, part, unit in columns:
            for fmt in formats:
                law = table.loc[(rule, fmt), column] if (rule, fmt) in table.index else {}
                cells.append(f"{law[part] * unit:.3g}" if law else "–")
        lines.append(table_row([rule, *cells]))
    return "\n".join(lines)


def totals_table(jobs: pd.DataFrame, rounds: int) -> str:
    """Markdown: CPU hours and GB written at full NQ, per round (jobs of iter{i}) and once."""
    jobs = jobs.assign(part=np.where(jobs["job"].str.contains(r"\biter\d"), "round", "once"))
    sums = jobs.groupby(["format", "part", "scale"])[["cpu_s", "written_mb"]].sum()
    lines = [table_header(["format", "part", "CPU h at NQ", "GB written at NQ"], align="llrr")]
    for (fmt, part), group in sums.groupby(level=[0, 1]):
        s = group.index.get_level_values("scale").to_numpy()
        per = rounds if part == "round" else 1
        cpu = fit_law(s, group["cpu_s"].to_numpy(float) / per)
        out = fit_law(s, group["written_mb"].to_numpy(float) / per)
        name = "per round" if part == "round" else "once"
        cells = [
            f"{law['at_nq'] / unit:.3g}" if law else "–" for law, unit in [(cpu, 3600), (out, 1024)]
        ]
        lines.append(table_row([fmt, name, *cells]))
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    formats = ["compact", "fid_json"] if args.list_format == "both" else [args.list_format]
    runs, frames = [], []
    for fmt in formats:
        for scale in args.scales:
            folder = args.workdir / f"{fmt}-{scale:g}"
            if not args.no_run:
                run = run_rehearsal(prepare_workdir(folder, scale, fmt), args.cores)
                runs.append({"format": fmt, "scale": scale, **run})
                print(f"{fmt} s={scale:g}: rc {run['returncode']}, {run['wall_s']:.0f} s wall,"
                      f" failed logs: {run['failed_logs'] or 'none'}", file=sys.stderr)  # fmt: skip
            if (folder / "logs" / "benchmarks").exists():
                frames.append(read_jobs(folder).assign(format=fmt, scale=scale))
    jobs = pd.concat(frames, ignore_index=True)
    rules = per_rule(jobs)
    laws = fit_all(rules)
    rounds = yaml.safe_load((ROOT / "config" / "scale.yaml").read_text())["rounds"]
    for fmt in formats:
        print(f"\n### Growth, {fmt}\n\n{growth_table(rules, fmt)}")
    print(f"\n### Fitted laws (s = fraction of NQ)\n\n{law_table(laws)}")
    print(f"\n### At full NQ (s = 1)\n\n{extrapolation_table(laws)}")
    print(f"\n{totals_table(jobs, rounds)}")
    if args.json:
        found = {"runs": runs, "jobs": jobs.to_dict("records"), "laws": laws.to_dict("records")}
        write_record(args.json, record(__file__, found))


if __name__ == "__main__":
    main()
