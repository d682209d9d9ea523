"""The checks that need a GPU (run on a CUDA machine; ~2 minutes): fp16 training with a loss
scaler, bf16 autocast, generation and scoring on CUDA, then the reader speed table.

    python benchmarks/gpu_check.py [--out DIR]

Exits non-zero if a command fails or a loss is not finite.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]


def fid(*args) -> None:
    subprocess.run([sys.executable, "-m", "fid", *map(str, args)], check=True, cwd=ROOT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/fid-gpu-check"))
    out = parser.parse_args().out
    if not torch.cuda.is_available():
        sys.exit("no CUDA device: run this on a GPU machine")
    fid("make-demo-data", "--output", out / "data")
    fid("init-reader", "--corpus", out / "data/passages.tsv", "--output", out / "init")
    data = out / "data/reader"
    for precision in ("fp16", "bf16"):
        config = out / f"{precision}.yaml"
        config.write_text(yaml.safe_dump(dict(
            n_passages=10, passage_max_tokens=96, batch_size_per_device=16, max_steps=60,
            lr=1e-3, warmup_steps=5, eval_every_steps=30, log_every_steps=10, eval_batch_size=64,
            max_new_tokens=8, precision=precision, activation_checkpointing=True,
        )))  # fmt: skip
        fid("train-reader", "--config", config, "--train", data / "train.json", "--dev",
            data / "dev.json", "--init-model", out / "init", "--output", out / f"reader-{precision}",
            "--state-dir", out / f"state-{precision}")  # fmt: skip
        records = [json.loads(x) for x in (out / f"reader-{precision}/metrics.jsonl").open()]
        losses = [r["loss"] for r in records if r["kind"] == "train"]
        assert all(loss == loss and abs(loss) < 1e4 for loss in losses), losses
        print(precision, "losses", [round(x, 3) for x in losses])
    fid("eval-reader", "--model", out / "reader-bf16", "--questions", data / "test.json",
        "--predictions", out / "p.jsonl", "--metrics", out / "m.json")  # fmt: skip
    fid("score-passages", "--model", out / "reader-bf16", "--questions", data / "test.json",
        "--output", out / "scored.json")  # fmt: skip
    subprocess.run(
        [sys.executable, "benchmarks/reader_speed.py", "--n", "100", "--device", "cuda"],
        check=True,
        cwd=ROOT,
    )


if __name__ == "__main__":
    main()
