"""bf16 generation on a CPU that computes it natively: when `precision: auto` should choose it.

One question x N = 100 real passages (samples/), passage_max_tokens 250, random T5s of the
t5-small shape (6+6 layers, 8 heads, d_ff = 4 x d_model) at several widths, one CPU thread,
greedy answers of 20 tokens. Each setting runs in a fresh process and reports questions per CPU
second (time.process_time) and whether its greedy ids equal fp32's:

- "original": the original FiD's behaviour (every passage padded to 250, eager attention, fp32);
- "ours fp32" and "ours bf16": length buckets, packed decoder tokens, the faster attention
  kernel, fp32 or bf16 autocast.

    python benchmarks/reader/cpu_bf16.py                   # widths 128 256 384 512
    python benchmarks/reader/cpu_bf16.py --widths 512 --repeats 2

The printed table gives, per width, the speed of bf16 over fp32, and at the widest width ours
over the original. fid.runtime.precision's rule for "auto" on a CPU (bf16 for generation and
embedding from CPU_BF16_MIN_WIDTH = 384 on, where the CPU reports AVX-512 BF16 or AMX) comes
from it. Measured 2026-12-03 (Intel Xeon with AMX and AVX-512 BF16, torch 2.13.0+cpu; questions
per CPU second, bf16 over fp32; greedy ids equal fp32's in every case):

    d_model   N = 100 passages          N = 5 passages
     32       0.970 -> 0.855  0.88x     -
     64       0.785 -> 0.688  0.88x     -
    128       0.512 -> 0.694  1.36x     5.50 -> 4.38  0.80x
    256       0.326 -> 0.506  1.55x     3.32 -> 2.95  0.89x
    384       0.186 -> 0.389  2.09x     1.83 -> 2.07  1.13x
    512       0.124 -> 0.291  2.34x     1.26 -> 1.60  1.27x

At d_model 512 (t5-small's shape), N = 100: the original 0.059 q/CPU-s, ours fp32 0.124 (2.12x),
ours bf16 0.291 (4.97x). From 384 on bf16 gains at every N; narrower, it loses at small N (the
demo's own reader, d_model 128 with 2 layers at N = 5: 0.89x, measured with `fid eval-reader`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `benchmarks.*` from anywhere
from benchmarks.harness import record, timed, write_record  # noqa: E402
from benchmarks.reader.reader_speed import _examples, _tokenizer  # noqa: E402 (the same passages and tokenizer)

SETTINGS = {"original": (True, 1, False, "fp32"), "ours fp32": (False, 8, True, "fp32"),
            "ours bf16": (False, 8, True, "bf16")}  # fmt: skip


def worker(setting: str, width: int, n_passages: int, repeats: int) -> dict:
    """One setting at one width, in this process: questions per CPU second and greedy ids."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    from fid.data.reader_batches import ReaderCollator
    from fid.models.reader import FiDReader
    from fid.runtime.precision import autocast

    torch.set_num_threads(1)
    pad_to_max, buckets, pack, precision = SETTINGS[setting]
    torch.manual_seed(0)
    config = T5Config(
        vocab_size=32128, d_model=width, d_ff=4 * width, d_kv=width // 8, num_layers=6,
        num_decoder_layers=6, num_heads=8, dropout_rate=0.0, pad_token_id=0, eos_token_id=1,
        decoder_start_token_id=0,
    )  # fmt: skip
    device = torch.device("cpu")
    reader = FiDReader(T5ForConditionalGeneration(config), buckets, pack).eval()
    reader.set_attention("eager" if setting == "original" else "auto", device)
    collator = ReaderCollator(_tokenizer(), n_passages, 250, pad_to_max_length=pad_to_max)
    examples = _examples(n_passages)
    batch = collator(examples, None)
    with torch.no_grad(), autocast(device, precision):
        ids = reader.generate(batch.input_ids, batch.attention_mask, 20)  # warm-up
        with timed() as clock:
            for _ in range(repeats):
                reader.generate(batch.input_ids, batch.attention_mask, 20)
    return {"setting": setting, "width": width, "questions_per_cpu_s": repeats / clock.cpu_s,
            "greedy_ids": ids[0].tolist()}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[128, 256, 384, 512])
    parser.add_argument("--n", type=int, default=100, help="passages per question")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the run's record here")
    parser.add_argument("--worker", nargs=2, metavar=("SETTING", "WIDTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], int(args.worker[1]), args.n, args.repeats)))
        return
    import torch

    from fid.runtime.precision import cpu_computes_bf16

    print(f"CPU: {torch.backends.cpu.get_cpu_capability()}, native bf16: {cpu_computes_bf16()}, "
          f"torch {torch.__version__}, N = {args.n}, one thread")  # fmt: skip
    print(f"{'d_model':>7} {'setting':>10} {'q/CPU-s':>8} {'vs fp32':>8} {'vs orig':>8} ids=fp32")
    found = []
    for width in args.widths:
        rows = {}
        for setting in SETTINGS if width == max(args.widths) else ("ours fp32", "ours bf16"):
            out = subprocess.run(
                [sys.executable, __file__, "--worker", setting, str(width), "--n", str(args.n),
                 "--repeats", str(args.repeats)], capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            rows[setting] = json.loads(out.strip().splitlines()[-1])
            found.append(rows[setting])
        fp32 = rows["ours fp32"]
        for setting, row in rows.items():
            qps = row["questions_per_cpu_s"]
            versus_original = (f"{qps / rows['original']['questions_per_cpu_s']:.2f}x"
                               if "original" in rows else "")  # fmt: skip
            same = row["greedy_ids"] == fp32["greedy_ids"]
            print(f"{width:>7} {setting:>10} {qps:8.3f} {qps / fp32['questions_per_cpu_s']:7.2f}x "
                  f"{versus_original:>8} {same}")  # fmt: skip
    if args.json:
        write_record(args.json, record(__file__, found))


if __name__ == "__main__":
    main()
