"""What DDP over gloo costs a CPU training step, and how fast a signal becomes a checkpoint.

The tiny reader of the demo (random T5 from `fid.demo.tiny_models`: d_model 128, 2+2 layers, 4 heads,
d_ff 512, a ~3k-piece tokenizer) reads 10 passages per question of the synthetic world
(`fid.demo.world`), 4 questions per rank and step, every process on one thread:

- per-step time of `fid train-reader` in 1 process vs 2 gloo ranks started with torchrun's
  variables (each rank takes its own 4 questions: twice the questions per step), read from
  each run's metrics.jsonl `step_time_s` (the first logging interval, with its warm-up, is
  left out; the median of the rest is reported); and, as the baseline that separates DDP's
  communication from two processes competing for the cores, 2 independent single processes
  run at the same time;
- the latency from a SIGUSR1 sent to a single-process run in mid-training to its `step-N`
  checkpoint folder appearing (complete: folders are renamed into place) and to its exit
  with status 75.

    python benchmarks/distributed/ddp_overhead.py                  # ~2-3 minutes on 2 cores
    python benchmarks/distributed/ddp_overhead.py --steps 60 --repeats 3 --signals 5

On a machine with fewer free cores than ranks the 2-rank figure measures CPU contention as
much as communication: look at the load while it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `benchmarks.*` from anywhere
from benchmarks.harness import record, table_header, table_row, write_record  # noqa: E402

EXIT_PREEMPTED = 75
BATCH_PER_RANK = 4
N_PASSAGES = 10


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "FID_"))}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", **extra)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prepare(work: Path) -> dict[str, Path]:
    """Writes the world's reader data, a tokenizer + random T5, and the training configs."""
    import torch

    from fid.config import InitReaderConfig, WorldConfig
    from fid.demo.files import reader_examples
    from fid.demo.tiny_models import build_tiny_t5, train_tokenizer
    from fid.demo.world import build_world

    torch.set_num_threads(1)
    world = build_world(WorldConfig())
    train = reader_examples(world, "train", N_PASSAGES, seed=0)[:400]
    dev = reader_examples(world, "dev", N_PASSAGES, seed=0)[:4]
    texts = [p.title + " " + p.text for p in world.passages]
    texts += [q.question for q in world.splits["train"]]
    tokenizer = train_tokenizer(texts, vocab_size=3000)
    model = build_tiny_t5(InitReaderConfig(), vocab_size=len(tokenizer))  # the demo's sizes
    model.save_pretrained(work / "model")
    tokenizer.save_pretrained(work / "model")
    for name, records in (("train", train), ("dev", dev)):
        (work / f"{name}.json").write_text(json.dumps(records))
    return {"train": work / "train.json", "dev": work / "dev.json", "model": work / "model"}


def _config(path: Path, steps: int, log_every: int, precision: str) -> Path:
    path.write_text(yaml.safe_dump(dict(
        n_passages=N_PASSAGES, batch_size_per_device=BATCH_PER_RANK, max_steps=steps, lr=1e-3,
        warmup_steps=5, eval_every_steps=0, save_every_steps=0, log_every_steps=log_every,
        eval_max_questions=4, eval_batch_size=4, max_new_tokens=5, precision=precision,
        tensorboard=False, dropout=0.0,
    )))  # fmt: skip
    return path


def _train_cmd(paths: dict, config: Path, run: Path) -> list[str]:
    return [sys.executable, "-m", "fid", "--threads", "1", "train-reader", "--config", str(config),
            "--train", str(paths["train"]), "--dev", str(paths["dev"]), "--init-model",
            str(paths["model"]), "--output", str(run / "model"), "--state-dir", str(run / "state")]  # fmt: skip


def step_times(
    paths: dict, work: Path, mode: str, steps: int, log_every: int, precision: str, repeat: int
) -> list[float]:
    """Logged step times (s) of one run, the first interval left out. Mode "single" (1
    process), "ddp" (2 gloo ranks) or "pair" (2 independent single processes at once: the
    CPU-contention baseline for "ddp", without any communication)."""
    ranks = 1 if mode == "single" else 2
    config = _config(work / f"{mode}.yaml", steps, log_every, precision)
    port = str(_free_port())
    procs, runs = [], []
    for rank in range(ranks):
        extra = {}
        if mode == "ddp":
            extra = dict(RANK=str(rank), WORLD_SIZE=str(ranks), LOCAL_RANK=str(rank),
                         MASTER_ADDR="127.0.0.1", MASTER_PORT=port)  # fmt: skip
        # DDP ranks share one run folder (rank 0 writes it); independent runs each have one.
        run = work / f"{mode}-{repeat}" / ("ddp" if mode == "ddp" else f"process{rank}")
        runs.append(run)
        procs.append(subprocess.Popen(_train_cmd(paths, config, run), env=_env(**extra),
                                      stderr=subprocess.PIPE, text=True))  # fmt: skip
    for rank, proc in enumerate(procs):
        _, log = proc.communicate(timeout=1800)
        if proc.returncode != 0:
            raise SystemExit(f"{mode} run, process {rank} failed:\n{log[-3000:]}")
    times = []
    for run in dict.fromkeys(runs):
        records = [json.loads(line) for line in (run / "state" / "metrics.jsonl").open()]
        times += [r["step_time_s"] for r in records if r["kind"] == "train"][1:]
    return times


def signal_latency(paths: dict, work: Path, index: int, precision: str) -> dict[str, float]:
    """Sends SIGUSR1 to a single-process run once it logs training steps; times the
    checkpoint folder's appearance and the exit."""
    run = work / f"signal{index}"
    config = _config(work / "signal.yaml", 100_000, 5, precision)
    metrics = run / "state" / "metrics.jsonl"
    proc = subprocess.Popen(_train_cmd(paths, config, run), env=_env(),
                            stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while not (metrics.exists() and '"kind": "train"' in metrics.read_text()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the run to signal did not start training ({proc.returncode})")
            time.sleep(0.05)
        # Let a second, steady interval start, then signal at a random point of a step.
        time.sleep(0.5 + 0.1 * index)
        step_time = [json.loads(line) for line in metrics.open()][-1]["step_time_s"]
        sent = time.perf_counter()
        proc.send_signal(signal.SIGUSR1)
        written = None
        while True:  # polled every 2 ms
            now = time.perf_counter()
            if written is None and any((run / "state").glob("step-*")):
                written = now
            if proc.poll() is not None:
                exited = now
                break
            if now - sent > 300:
                raise SystemExit("the run did not stop within 300 s of SIGUSR1")
            time.sleep(0.002)
        if proc.returncode != EXIT_PREEMPTED:
            raise SystemExit(f"exit status {proc.returncode}, expected {EXIT_PREEMPTED}")
        if written is None:  # written and exited within one poll
            if not any((run / "state").glob("step-*")):
                raise SystemExit("exited 75 without a step-N checkpoint")
            written = exited
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return {"checkpoint_s": written - sent, "exit_s": exited - sent, "step_s": step_time}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="steps per timing run")
    parser.add_argument("--log-every", type=int, default=5, help="steps per logged interval")
    parser.add_argument("--repeats", type=int, default=1, help="timing runs of each kind")
    parser.add_argument("--signals", type=int, default=3, help="SIGUSR1 measurements")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--workdir", type=Path, help="keep the runs here (default: a temp dir)")
    parser.add_argument("--json", type=Path, help="also write the run's record here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        work = args.workdir or Path(tmp)
        if work.exists() and any(work.iterdir()):  # old state folders would be resumed
            raise SystemExit(f"--workdir {work} is not empty")
        work.mkdir(parents=True, exist_ok=True)
        paths = prepare(work)
        times: dict[str, list[float]] = {"single": [], "pair": [], "ddp": []}
        for repeat in range(args.repeats):  # interleaved, so that a change of load hits all
            for mode in times:
                times[mode] += step_times(paths, work, mode, args.steps, args.log_every,
                                          args.precision, repeat)  # fmt: skip
        rows = {mode: (statistics.median(t), len(t) * args.log_every) for mode, t in times.items()}
        latencies = [signal_latency(paths, work, i, args.precision) for i in range(args.signals)]

    one, pair = rows["single"][0], rows["pair"][0]
    print(f"\nTiny reader (d_model 128, 2+2 layers, 4 heads, d_ff 512), {N_PASSAGES} passages, "
          f"{BATCH_PER_RANK} questions per rank, {args.precision}, 1 thread per process, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}\n")  # fmt: skip
    print(table_header(["run", "questions/step", "step time (ms)", "questions/s",
                        "step time vs 1 process"]))  # fmt: skip
    names = {"single": "1 process", "pair": "2 independent processes (no DDP), each",
             "ddp": "2 gloo DDP ranks"}  # fmt: skip
    for mode, (step_s, measured) in rows.items():
        questions = BATCH_PER_RANK * (2 if mode == "ddp" else 1)
        rate = questions / step_s * (2 if mode == "pair" else 1)
        print(table_row([names[mode], questions, f"{step_s * 1000:.0f} (median over {measured} steps)",
                         f"{rate:.1f}", f"x{step_s / one:.2f}"]))  # fmt: skip
    print(f"\nDDP's own cost (2 ranks vs 2 independent processes on the same cores): "
          f"x{rows['ddp'][0] / pair:.2f} per step")  # fmt: skip
    print()
    print(table_header(["SIGUSR1 run", "step time before (ms)", "signal -> step-N written (ms)",
                        "signal -> exit 75 (ms)"]))  # fmt: skip
    keys = ("step_s", "checkpoint_s", "exit_s")
    for i, lat in enumerate(latencies):
        print(table_row([i + 1, *(f"{lat[k] * 1000:.0f}" for k in keys)]))
    median = {k: statistics.median(lat[k] for lat in latencies) for k in latencies[0]}
    print(table_row(["median", *(f"{median[k] * 1000:.0f}" for k in keys)]))
    if args.json:
        steps = {mode: {"median_step_s": step_s, "steps": measured}
                 for mode, (step_s, measured) in rows.items()}  # fmt: skip
        write_record(args.json, record(__file__, {"steps": steps, "signals": latencies}))


if __name__ == "__main__":
    main()
