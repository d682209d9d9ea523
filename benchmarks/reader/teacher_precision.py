"""The retriever's teacher in bf16 against fp32: rank agreement and cost on CPU.

    python benchmarks/reader/teacher_precision.py --model READER --questions FID.json [--n 20]

Scores each question's first `--n` passages with the reader's cross-attention
(`fid score-passages`' computation, mode mean_logit and attention_mass) under fp32 and under bf16
autocast, in one process on one thread, and prints per mode: Spearman's rank correlation of
the two score lists (mean and minimum over questions), how often the top-1 passage is the
same, the mean overlap of the top-5, the largest absolute score difference, and the seconds
per question of each precision. READER: any reader folder (e.g. the demo's
results/demo/iter0/reader/model); FID.json: FiD-format questions with ctxs (e.g. the demo's
results/demo/bm25/retrieval/dev.json, or real passages retrieved by BM25).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `benchmarks.*` from anywhere
from benchmarks.harness import record, table_header, table_row, timed, write_record  # noqa: E402


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ranks_a, ranks_b = a.argsort().argsort(), b.argsort().argsort()
    return float(np.corrcoef(ranks_a, ranks_b)[0, 1])


def _scores(reader, collator, examples, mode, precision, batch_size):
    from fid.inference.scoring import passage_scores
    from fid.runtime.precision import autocast

    cpu = torch.device("cpu")
    with timed() as clock, torch.no_grad(), autocast(cpu, precision):
        scores = passage_scores(reader, collator, examples, batch_size, mode, cpu)
    return [s.values[np.argsort(s.ctx_indices)] for s in scores], clock.cpu_s / len(examples)


def main() -> None:
    from fid.config import ScorePassagesConfig
    from fid.data.examples import load_examples
    from fid.inference.batching import reader_and_collator

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--questions", type=Path, required=True)
    parser.add_argument("--n", type=int, default=20, help="passages scored per question")
    parser.add_argument("--max-questions", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--json", type=Path, help="also write the run's record here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    examples = load_examples(args.questions)[: args.max_questions]
    cfg = ScorePassagesConfig(n_passages=args.n, encoder_buckets=4)
    reader, _, collator = reader_and_collator(cfg, args.model, torch.device("cpu"))
    print(f"{len(examples)} questions x {args.n} passages, {args.model}, 1 thread\n")
    print(table_header(["mode", "Spearman mean / min", "top-1 same", "top-5 overlap",
                        "max abs diff", "s/question fp32 / bf16"]))  # fmt: skip
    rows = []
    for mode in ("mean_logit", "attention_mass"):
        fp32, t32 = _scores(reader, collator, examples, mode, "fp32", args.batch_size)
        bf16, t16 = _scores(reader, collator, examples, mode, "bf16", args.batch_size)
        pairs = [(a, b) for a, b in zip(fp32, bf16, strict=True) if len(a) > 1]
        rho = [_spearman(a, b) for a, b in pairs]
        top1 = np.mean([a.argmax() == b.argmax() for a, b in pairs])
        k = min(5, min(len(a) for a, _ in pairs))
        overlap = np.mean(
            [len(set(a.argsort()[-k:]) & set(b.argsort()[-k:])) / k for a, b in pairs]
        )
        diff = max(float(np.abs(a - b).max()) for a, b in pairs)
        rows.append(dict(mode=mode, spearman_mean=np.mean(rho), spearman_min=np.min(rho),
                         top1_same=top1, top_k=k, top_k_overlap=overlap, max_abs_diff=diff,
                         cpu_s_per_question_fp32=t32, cpu_s_per_question_bf16=t16))  # fmt: skip
        print(table_row([mode, f"{np.mean(rho):.4f} / {np.min(rho):.4f}", f"{100 * top1:.1f}%",
                         f"{100 * overlap:.1f}% (top-{k})", f"{diff:.2e}",
                         f"{t32:.3f} / {t16:.3f}"]))  # fmt: skip
    if args.json:
        write_record(args.json, record(__file__, rows))


if __name__ == "__main__":
    main()
