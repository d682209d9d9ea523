"""Reader speed and memory: the original FiD's behaviour against our techniques.

One question x N real passages (DPR Wikipedia passages and NQ questions from samples/),
passage_max_tokens 250, a random tiny T5 (d_model 128, 2+2 layers, 4 heads, d_ff 512, vocab
32k), one CPU thread. Each setting runs in a fresh process: memory is the peak RSS during the
measured steps (VmHWM, reset through /proc/self/clear_refs) minus the RSS just before them; on
a GPU (`--device cuda`), CUDA max allocated minus allocated before them.

    python benchmarks/reader/reader_speed.py                # full table (N = 10, 25, 50, 100)
    python benchmarks/reader/reader_speed.py --n 100 --steps 2

Settings: "original" pads every passage to 250 and runs fp32 (the original's collator, with and
without activation checkpointing); then each technique alone; then ours combined (pad to the
longest, 8 length buckets, packed decoder tokens, bf16, checkpointing).
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # `benchmarks.harness` however this file is run
SAMPLES = ROOT / "samples"

from benchmarks.harness import (  # noqa: E402
    peak_memory,
    record,
    table_header,
    table_row,
    timed,
    write_record,
)

SETTINGS = {
    # name: (pad_to_max, buckets, pack, precision, checkpointing)
    "original": (True, 1, False, "fp32", False),
    "original+ckpt": (True, 1, False, "fp32", True),
    "longest+ckpt": (False, 1, False, "fp32", True),
    "buckets+pack+ckpt": (False, 8, True, "fp32", True),
    "bf16+ckpt": (True, 1, False, "bf16", True),
    "ours (all)+ckpt": (False, 8, True, "bf16", True),
    "ours (all)": (False, 8, True, "bf16", False),
}


def _examples(n_passages: int, seed: int = 0):
    from fid.data.examples import Example

    csv.field_size_limit(sys.maxsize)
    with open(SAMPLES / "dpr" / "psgs_w100.subset.tsv", newline="") as handle:
        passages = list(csv.DictReader(handle, delimiter="\t"))
    lines = (SAMPLES / "nq-open" / "NQ-open.dev.jsonl").read_text().splitlines()
    rng = random.Random(seed)
    question = json.loads(rng.choice(lines))
    ctxs = [
        {"id": p["id"], "title": p["title"], "text": p["text"]}
        for p in rng.sample(passages, n_passages)
    ]
    return [Example("q", question["question"], question["answer"], None, ctxs, {})]


def _tokenizer():
    from fid.demo.tiny_models import train_tokenizer

    csv.field_size_limit(sys.maxsize)
    with open(SAMPLES / "dpr" / "psgs_w100.subset.tsv", newline="") as handle:
        texts = [row["title"] + " " + row["text"] for row in csv.DictReader(handle, delimiter="\t")]
    return train_tokenizer(texts, vocab_size=32000)


def worker(setting: str, n_passages: int, steps: int, device_name: str = "cpu") -> dict:
    """Runs one setting in this process and returns its figures."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    from fid.data.reader_batches import ReaderCollator
    from fid.models.reader import FiDReader
    from fid.runtime.precision import autocast

    torch.set_num_threads(1)
    pad_to_max, buckets, pack, precision, checkpointing = SETTINGS[setting]
    tokenizer = _tokenizer()
    torch.manual_seed(0)
    config = T5Config(
        vocab_size=32128, d_model=128, d_ff=512, d_kv=32, num_layers=2, num_decoder_layers=2,
        num_heads=4, dropout_rate=0.0, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    )  # fmt: skip
    device = torch.device(device_name)
    reader = FiDReader(T5ForConditionalGeneration(config), buckets, pack).to(device)
    # The original ran transformers 3's eager attention; ours picks the faster kernel ("auto").
    reader.set_attention("eager" if setting.startswith("original") else "auto", device)
    reader.set_activation_checkpointing(checkpointing)
    collator = ReaderCollator(tokenizer, n_passages, 250, pad_to_max_length=pad_to_max)
    examples = _examples(n_passages)
    batch = collator(examples, [examples[0].answers[0]]).to(device)
    optimizer = torch.optim.AdamW(reader.parameters(), lr=1e-4)
    amp = autocast(device, precision)
    cuda = device.type == "cuda"

    def train_step():
        with amp:
            loss = reader(batch.input_ids, batch.attention_mask, labels=batch.labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    sync = torch.cuda.synchronize if cuda else None

    reader.train()
    train_step()  # warm-up: allocator, optimizer state
    # memory above what the model and optimizer hold between steps
    with peak_memory(device) as peak, timed(sync) as training:
        for _ in range(steps):
            train_step()

    reader.eval()
    with torch.no_grad(), amp:
        reader.generate(batch.input_ids, batch.attention_mask, 20)
        with timed(sync) as generation:
            for _ in range(steps):
                reader.generate(batch.input_ids, batch.attention_mask, 20)
        reader.passage_scores(batch.input_ids, batch.attention_mask)
        with timed(sync) as scoring:
            for _ in range(steps):
                reader.passage_scores(batch.input_ids, batch.attention_mask)
    real = int(batch.attention_mask.sum())
    return {
        "setting": setting,
        "n_passages": n_passages,
        "step_s": training.wall_s / steps,
        "peak_mb": peak.above_mb,
        "generate_qps": steps / generation.wall_s,
        "score_qps": steps / scoring.wall_s,
        "real_tokens": real,
        "padded_tokens": batch.input_ids.numel(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[10, 25, 50, 100])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS))
    parser.add_argument("--worker", nargs=2, metavar=("SETTING", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help="also write the run's record here")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], int(args.worker[1]), args.steps, args.device)))
        return

    rows = []
    columns = ["N", "setting", "step s", "peak MB", "generate q/s", "score q/s"]
    print(table_header([*columns, "real/padded tokens"]))
    for n in args.n:
        for setting in args.settings:
            out = subprocess.run(
                [sys.executable, __file__, "--worker", setting, str(n), "--steps", str(args.steps),
                 "--device", args.device],
                capture_output=True, text=True, check=True, cwd=ROOT,
            )  # fmt: skip
            row = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append(row)
            cells = [n, setting, f"{row['step_s']:.3f}", f"{row['peak_mb']:.0f}"]
            cells += [f"{row['generate_qps']:.2f}", f"{row['score_qps']:.2f}"]
            print(table_row([*cells, f"{row['real_tokens']}/{row['padded_tokens']}"]), flush=True)
    for n in args.n:
        by = {r["setting"]: r for r in rows if r["n_passages"] == n}
        if "original+ckpt" in by and "ours (all)+ckpt" in by:
            base, ours = by["original+ckpt"], by["ours (all)+ckpt"]
            print(
                f"N={n}: ours (defaults) vs original+ckpt: "
                f"{base['step_s'] / ours['step_s']:.2f}x faster per step, "
                f"{ours['peak_mb'] / base['peak_mb']:.2f}x the peak memory, "
                f"generation {ours['generate_qps'] / base['generate_qps']:.2f}x, "
                f"scoring {ours['score_qps'] / base['score_qps']:.2f}x"
            )
    if args.json:
        write_record(args.json, record(__file__, rows))


if __name__ == "__main__":
    main()
