"""Passage embedding throughput of `embed_passages`, pretrained MiniLM, one CPU thread.

Batch 64, passage_max_tokens 200, on the 751 real DPR passages of samples/ cycled to
--embed-passages (3000): (a) every batch padded to 200 tokens, input order, fp32; (b)
length-sorted batches padded to their own longest, fp32; (c) (b) under bf16 autocast. The settings
take turns on --embed-rounds slices of the passages, so that a load change on the shared machine
hits all three. Prints a markdown table of wall and CPU seconds, the speedups over (a) and how far
(b)'s embeddings are from (a)'s. The model and the one-thread setup: synthetic_vectors.py.

    python benchmarks/retrieval/embedding_speed.py
    python benchmarks/retrieval/embedding_speed.py --embed-passages 1000
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# the repository root first: `benchmarks.*` imports however this file is run
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness import record, table_header, table_row, timed, write_record
from benchmarks.retrieval.synthetic_vectors import (
    DPR_PASSAGES,
    PASSAGE_MAX_TOKENS,
    embed,
    fmt_s,
    load_model,
)

EMBED_SETTINGS = {
    # name: (pad_to_max_length, sort_by_length, precision)
    "(a) pad to 200, fp32": (True, False, "fp32"),
    "(b) length-sorted, fp32": (False, True, "fp32"),
    "(c) length-sorted, bf16": (False, True, "bf16"),
}


def _padding_fp32_diff(model, encode, passages) -> float:
    """Max |diff| of fp32 embeddings of one batch padded to 200 tokens vs to its longest."""
    import torch

    titles, texts = [p.title for p in passages], [p.text for p in passages]
    longest = encode.passages(titles, texts)
    padded = encode.tokenizer(
        titles, texts, truncation="only_second", max_length=PASSAGE_MAX_TOKENS,
        padding="max_length", return_tensors="pt",
    )  # fmt: skip
    with torch.no_grad():
        one = model.encode_passages(longest["input_ids"], longest["attention_mask"])
        two = model.encode_passages(padded["input_ids"], padded["attention_mask"])
    return float((one - two).abs().max())


def part_embed(model, encode, n_passages: int, rounds: int) -> list[dict]:
    """Times the three embedding settings; returns a row per setting.

    The passages are cut into `rounds` slices and the settings take turns on each slice (in a
    rotating order), so a load change on the shared machine hits every setting alike; CPU time
    (time.process_time, one thread) is reported beside wall time because it leaves out the time
    the process waits for a core.
    """
    import numpy as np

    from fid.data.passages import iter_passages

    real = list(iter_passages(DPR_PASSAGES))
    passages = [real[i % len(real)] for i in range(n_passages)]
    titles, texts = [p.title for p in passages], [p.text for p in passages]
    lengths = encode.passage_lengths(titles, texts)
    with timed() as tokenizing:
        encode.passages(titles, texts)
    tokenize_s = tokenizing.wall_s
    bounds = [(n_passages * r // rounds, n_passages * (r + 1) // rounds) for r in range(rounds)]
    names = list(EMBED_SETTINGS)
    parts = {name: [] for name in names}
    wall = dict.fromkeys(names, 0.0)
    cpu = dict.fromkeys(names, 0.0)
    for pad_to_max, sort, precision in EMBED_SETTINGS.values():
        embed(model, encode, passages[:64], pad_to_max, sort, precision)  # warm-up
    for r, (lo, hi) in enumerate(bounds):
        for name in names[r % 3 :] + names[: r % 3]:
            pad_to_max, sort, precision = EMBED_SETTINGS[name]
            with timed() as clock:
                embeddings, _ = embed(model, encode, passages[lo:hi], pad_to_max, sort, precision)
            cpu[name] += clock.cpu_s
            wall[name] += clock.wall_s
            parts[name].append(embeddings)
    outputs = {name: np.concatenate(parts[name]) for name in names}
    rows = []
    print(
        f"\n### Passage embedding: {n_passages} passages ({len(real)} real DPR ones cycled), "
        f"batch 64, max 200 tokens, {rounds} interleaved rounds\n"
    )
    print(table_header(["setting", "wall s", "CPU s", "passages/s (CPU)", "speedup vs (a), CPU",
                        "speedup vs (a), wall", "real/processed tokens"]))  # fmt: skip
    for name, (pad_to_max, _, _) in EMBED_SETTINGS.items():
        if pad_to_max:
            processed = n_passages * PASSAGE_MAX_TOKENS
        else:  # sorted within each round's slice, each batch of 64 padded to its longest
            processed = 0
            for lo, hi in bounds:
                ordered = sorted(lengths[lo:hi])
                processed += sum(
                    max(ordered[i : i + 64]) * len(ordered[i : i + 64])
                    for i in range(0, len(ordered), 64)
                )
        row = {"setting": name, "wall_s": wall[name], "cpu_s": cpu[name]}
        row.update(
            passages_per_cpu_s=n_passages / cpu[name], passages_per_wall_s=n_passages / wall[name]
        )
        row.update(real_tokens=sum(lengths), processed_tokens=processed)
        rows.append(row)
        print(table_row([name, fmt_s(wall[name]), fmt_s(cpu[name]),
                         f"{row['passages_per_cpu_s']:.1f}", f"{cpu[names[0]] / cpu[name]:.2f}x",
                         f"{wall[names[0]] / wall[name]:.2f}x", f"{sum(lengths)}/{processed}"]),
              flush=True)  # fmt: skip
    a, b, c = (outputs[n].astype(np.float32) for n in names)
    # float16 spacing at each value (values below 2^-8 judged at 2^-8): two fp32 results equal
    # up to ~1e-6 can still round to neighbouring float16 values, i.e. differ by 1 spacing.
    spacing = np.spacing(np.maximum(np.maximum(np.abs(a), np.abs(b)), 2**-8).astype(np.float16))
    for name, other in ((names[1], b), (names[2], c)):
        diff = np.abs(other - a)
        cosine = (other * a).sum(1) / (np.linalg.norm(other, axis=1) * np.linalg.norm(a, axis=1))
        row = next(r for r in rows if r["setting"] == name)
        row.update(max_abs_diff=float(diff.max()), min_cosine=float(cosine.min()))
        if name == names[1]:
            row["max_diff_fp16_spacings"] = float((diff / spacing.astype(np.float32)).max())
    distinct = range(min(len(real), n_passages))  # passages[i] is real[i] there
    shortest = sorted(distinct, key=lambda i: lengths[i])[:64]
    fp32_diff = _padding_fp32_diff(model, encode, [passages[i] for i in shortest])
    shortest_max = max(lengths[i] for i in shortest)
    rows[1]["fp32_max_abs_diff_64"] = fp32_diff
    print()
    print(f"Tokenizing the {n_passages} passages once takes {tokenize_s:.2f} s; every setting")
    print("tokenizes twice (lengths or the padded-to-longest batch, then the batch it encodes).")
    bound = n_passages * PASSAGE_MAX_TOKENS / rows[1]["processed_tokens"]
    print(f"Token bound on (b)'s speedup: {bound:.2f}x (processed tokens of (a) / of (b)).")
    for row in rows[1:]:
        speedup = rows[0]["cpu_s"] / row["cpu_s"]
        verdict = "meets" if speedup >= 1.5 else "misses"
        print(
            f"- {row['setting']}: {speedup:.2f}x faster than (a) in CPU time ({verdict} the 1.5x "
            f"target); max |diff| to (a) {row['max_abs_diff']:.2e}, min cosine "
            f"{row['min_cosine']:.6f}"
        )
    equal = rows[1]["max_diff_fp16_spacings"] <= 1.0
    print(
        f"- (b) vs (a): the largest difference is {rows[1]['max_diff_fp16_spacings']:.2f} float16 "
        f"spacings of the value ({'equal' if equal else 'NOT equal'} up to the float16 rounding of "
        f"the stored embeddings; largest |value| {np.abs(a).max():.3f}). In fp32, before that "
        f"rounding, the 64 shortest passages padded to 200 tokens vs to their longest "
        f"({shortest_max}): max |diff| {fp32_diff:.2e}."
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--embed-passages", type=int, default=3000)
    parser.add_argument("--embed-rounds", type=int, default=4, help="interleaved slices")
    parser.add_argument("--json", type=Path, help="also write the run's record here")
    args = parser.parse_args()
    with timed() as total:
        model, encode = load_model()
        rows = part_embed(model, encode, args.embed_passages, args.embed_rounds)
    print(f"\nTotal wall time {total.wall_s:.0f} s")
    if args.json:
        write_record(args.json, record(__file__, {"embed": rows}))


if __name__ == "__main__":
    main()
