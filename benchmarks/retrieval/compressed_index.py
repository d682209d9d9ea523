"""Compressed passage indexes vs Flat: RAM, build time, latency and answer accuracy, one CPU thread.

What users need from a compressed index is Flat's answer accuracy (a passage with the answer in
the top 20 / top 100), not neighbour recall. This measures both, for each choice of
`build_index` (factory, rerank) and search knobs (nprobe, ef_search, shortlist), through fid's
own path: float16 embedding shards -> `fid.retrieval.index_build.build_index` (train on a seeded
sample, add in batches from memory-mapped shards, write vectors.npy for re-ranking) ->
`PassageIndex.load` (vectors and ids memory-mapped) -> `search_rows`.

Data: MiniLM (all-MiniLM-L6-v2, 384-d, pretrained; embedding 1M passages on one CPU thread would
take ~3 h) embeds every real passage in samples/ (751 DPR Wikipedia rows, 167 SQuAD passages, the
DPR biencoder sample's ~750 contexts) and two kinds of questions with known answer passages:
  * "squad": the 200 real SQuAD-open questions; answer passages = the SQuAD passages that hold
    an answer string (DPR's has-answer rule), as `fid eval-retrieval` counts them;
  * "ict": inverse-cloze questions (Lee et al. 2019): --span-words consecutive words of a real
    passage, --spans-per-passage per passage at seeded offsets; the answer passage is that one.
The corpus is those real passages (rows 0..R-1, the only ones holding answers) plus distractors
up to --size, from one of three sets (--distractors):
  * "synthetic" (the default; every table before issue 30's item 5 was measured on it): drawn to
    resemble the real embeddings as benchmarks/retrieval/synthetic_vectors.py does (a mix of two real
    passages plus covariance-shaped noise, at an anchor's norm, a median 0.62 of it from the
    anchor; its resemblance table is printed): each real passage has ~size/R distractors
    around it that do not hold its answer. Flat's own accuracy is printed to show the task is
    neither trivial nor hopeless. Here a compressed search can score ABOVE Flat: where Flat
    ranks distractors above an answer, a search that misses some of them lifts the answer into
    the top k ("compressed hit, Flat missed"; acc/Flat passed 1). So acc/Flat bounds nothing.
  * "near" (honest and harder): each real passage in turn gets copies at a fixed distance
    (--near-distance x its norm; 0.3, under the closest a synthetic distractor came to its
    anchor in 100,000 draws, 0.33) in a random covariance-shaped direction; quantization error
    then decides whether an answer passage or the copies just under it rank first.
  * "below" (honest): drawn as "synthetic".
  In "near" and "below" a distractor that scores at or above any asked question's answer
  passage is left out (a later draw takes its place), and only the questions whose best real
  passage holds an answer are asked (~1,800 of 2,944). Every distractor lacks the answer and
  scores under it, so Flat ranks an answer passage first for every question and hits every
  question at every k: a compressed search cannot answer a question Flat misses, as Flat
  misses none; its errors can only lift passages over the answer. Per question, hit(compressed)
  <= hit(Flat), so acc/Flat = kept and the count "compressed hit, Flat missed" is 0 by
  construction (printed as a check, with Flat's top-1 accuracy: 1). Scores are compared on the
  float16 vectors as stored, in the benchmark's space (after --project), with a margin of
  BELOW_MARGIN of the answer's score (and of the runner-up real passage's) so that float32 sums
  in another order cannot reorder them. What makes a set hard is what remains just under each
  answer: the median number of distractors within 1% and 5% of its score is printed (at 1M:
  below 4 / 49, near 86 / 510). At 1M, IVF1024,PQ48 re-ranked from a shortlist of 1000 at
  nprobe 16 kept 1.0000 / 0.9994 of Flat's top-20 / top-100 hits on "synthetic", 0.9956 on
  "below" and 0.9719 on "near". Not built: "real passages only" (916 < the 1024 lists of the
  IVF choices).
"kept @k", the share of Flat's hits a choice keeps, is <= 1, and on every set a lower bound of
acc@k / Flat on the same questions (acc = kept x Flat's + the questions it alone answers).
No set shows what Wikipedia would give at 21M: there the distractors under each answer are
~20x denser at every margin.

RAM and reads, as a user pays them: `index.faiss` bytes; the anonymous memory that loading adds
in a fresh process (RAM held); the resident pages of the mapped ids.npy and vectors.npy after a
pass over all questions (page cache a warm re-ranked search keeps reading); bytes read from
disk (/proc/self/io) and ms a question with those files dropped from the page cache before each
question (cold) and after the pass (warm), at batch 1 and at nq.yaml's batch of 128. Relative
accuracy = choice accuracy / Flat accuracy over all questions; per question, "compressed hit,
Flat missed" and "Flat hit, compressed missed" count the questions the two disagree on at k =
20 and 100 (acc/Flat - kept = the first count / Flat's hits); recall@100 = |found & Flat's
top-100| / 100. The last tables extrapolate the bytes per passage to 21M x 768 (DPR) and 21M x
256 (nq.yaml's retriever). `--project 256` measures in a d = 256 world (the corpus's top 256
principal directions), where `nq_default` is nq.yaml's own factory and knobs.

    python benchmarks/retrieval/compressed_index.py                       # 1M passages: ~20 min, one thread
    python benchmarks/retrieval/compressed_index.py --size 200000 --choices flat opq48_rerank
    python benchmarks/retrieval/compressed_index.py --distractors near --choices flat pq48_rerank
    python benchmarks/retrieval/compressed_index.py --project 256 --choices flat nq_default nq_default_refine_pq64
    python benchmarks/retrieval/compressed_index.py --size 200000 --project 256 --choices flat ivf_pq_d2 ivf_sq4

The ivf_* choices (issue 30 item 3) hold compact residual codes in RAM with no refinement; the
res_* choices add `build_index.refine_residual` (codes of what the base index's codes miss,
in RAM, re-scoring the shortlist): `res_nq` is nq.yaml's base with a 144-byte budget (run with
--project 256), `res_nq_8gb` its 8 GB-at-768 analogue (run at d = 384); `res_no_opq` (d = 256)
and `res_8gb_no_opq` (d = 384) the same without OPQ, the bases that meet issue 30's goal;
--repeat-to 21000000 also times each in-RAM IVF choice on its index repeated to 21M passages;
    python benchmarks/retrieval/compressed_index.py --project 256 --choices flat res_no_opq --repeat-to 21000000
while a run goes, each setting's kept @20 / @100 is printed as it is measured.
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

# the repository root first: `benchmarks.*` imports however this file is run
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness import record, table_header, table_row, timed, write_record
from benchmarks.retrieval.synthetic_vectors import (
    DPR_PASSAGES,
    SAMPLES,
    SQUAD_PASSAGES,
    SQUAD_QUESTIONS,
    embed,
    embed_questions,
    load_model,
    one_thread,
    print_resemblance,
    synthesize,
)

WORKDIR = Path("/tmp/fid_compressed_index")
BIENCODER = SAMPLES / "dpr" / "nq-dev-biencoder-sample.json"
K = 100
TRAIN_SAMPLE = 65536  # 64 points per list of IVF1024: k-means in ~20 s on one thread at d=384
NLIST = 1024
# Lists at 21M: k-means of 16384 centroids on 40 x 16384 vectors takes ~10 min on 16 cores at
# d=256 (65536 lists would need 16x that); lists then hold ~1,300 passages (1M / 1024: ~980).
NLIST_21M = 16384
# nq.yaml's `retrieve.batch_size`: the questions fid searches at once
RETRIEVE_BATCH = 128
# --distractors below / near: how far (a share of the answer's score) every distractor and the
# runner-up real passage stay under a question's answer. Flat and this check sum the same
# float32 products in other orders, which moves a score by ~1e-6 of it: far less.
BELOW_MARGIN = 1e-4
# the margins under each answer at which below / near count distractors (how hard the set is)
NEAR_MARGINS = (0.01, 0.05)
# "below" / "near" draw this many times the distractors they need, more if short
POOL_FACTOR = 1.1
NEAR_SEED = 1  # synthesize's is 0


@dataclass
class Choice:
    """One index to build and the knob settings to search it with."""

    factory: str
    rerank: bool = False
    knobs: list[dict] = field(default_factory=lambda: [{}])  # set_search_params kwargs
    train_sample: int = TRAIN_SAMPLE
    refine_residual: str | int | None = None  # build_index.refine_residual

    @property
    def label(self) -> str:
        """The factory, and the residual stages after " +res" (as _analogue parses them)."""
        if isinstance(self.refine_residual, int):
            return f"{self.factory} +res({self.refine_residual} B)"
        return self.factory + (f" +res({self.refine_residual})" if self.refine_residual else "")


def _choices(d: int) -> dict[str, Choice]:
    ivf = f"IVF{NLIST}"
    probes = [{"nprobe": 16}, {"nprobe": 64}]
    shortlists = [{"nprobe": p, "shortlist": s} for p in (16, 64) for s in (200, 500, 1000)]
    refined = [{"nprobe": 16, "shortlist": 1000}, {"nprobe": 64, "shortlist": 1000}]

    def at_21m_lists(factory: str, budget: int, nprobes=(256, 64)) -> Choice:
        """A residual budget on a base of 16,384 lists (21M's), trained on 16 vectors a list."""
        knobs = [{"nprobe": n, "shortlist": 1000} for n in nprobes]
        return Choice(factory, knobs=knobs, train_sample=16 * 16384, refine_residual=budget)

    return {
        "flat": Choice("Flat"),
        "sq8": Choice(f"{ivf},SQ8", knobs=probes),
        "pq48": Choice(f"{ivf},PQ{d // 8}", knobs=probes),  # the IVF-PQ baseline
        "pq48_rerank": Choice(f"{ivf},PQ{d // 8}", rerank=True, knobs=shortlists),
        "opq48_rerank": Choice(
            f"OPQ{d // 8}_{d},{ivf}_HNSW32,PQ{d // 8}", rerank=True, knobs=shortlists
        ),
        "opq64_rerank": Choice(
            f"OPQ{d // 6}_{d},{ivf}_HNSW32,PQ{d // 6}", rerank=True, knobs=shortlists
        ),
        "fastscan_rerank": Choice(f"{ivf},PQ{d // 4}x4fs", rerank=True, knobs=shortlists),
        "pca_sq8_rerank": Choice(f"PCAR{d // 6},{ivf},SQ8", rerank=True, knobs=shortlists),
        "hnsw": Choice("HNSW32", knobs=[{"ef_search": 128}, {"ef_search": 512}]),
        # re-ranked in RAM by faiss from refinement codes (no vectors.npy, no disk reads)
        "pq48_refine_sq8": Choice(f"{ivf},PQ{d // 8},Refine(SQ8)", knobs=shortlists),
        "pq48_refine_sq4": Choice(f"{ivf},PQ{d // 8},Refine(SQ4)", knobs=shortlists),
        # a product-quantised refinement, 2 bits a dimension
        "pq48_refine_pq96": Choice(f"{ivf},PQ{d // 8},Refine(PQ{d // 4})", knobs=shortlists),
        # 4 bits a dimension, as SQ4, but learnt (256 centroids for each pair of dimensions)
        "pq48_refine_pq192": Choice(f"{ivf},PQ{d // 8},Refine(PQ{d // 2})", knobs=shortlists),
        # issue 30 item 3: compact codes in RAM, no refinement file. IVF codes are residuals to
        # the list's centroid (faiss's by_residual), far more accurate per byte than the raw
        # vector that a Refine(...) encodes. SQ4 d/2, SQ6 3d/4, PQ(d/2) d/2 bytes a passage
        # (2 dims a sub-quantizer), PQ(d/3) d/3 (3 dims: d divisible by 3, 384 or 768)
        "ivf_sq4": Choice(f"{ivf},SQ4", knobs=probes),
        "ivf_sq6": Choice(f"{ivf},SQ6", knobs=probes),
        "ivf_pq_d2": Choice(f"{ivf},PQ{d // 2}", knobs=probes),
        "opq_ivf_pq_d2": Choice(f"OPQ{d // 2}_{d},{ivf},PQ{d // 2}", knobs=probes),
        "ivf_pq_d3": Choice(f"{ivf},PQ{d // 3}", knobs=probes),
        # 10-bit codes (1,024 centroids a sub-quantizer): 5 bits a dimension at 2 dims a
        # sub-quantizer (PQ(d/2)x10: 5d/8 bytes), 3.3 at 3 (PQ(d/3)x10: 5d/12)
        "ivf_pq_d2x10": Choice(f"{ivf},PQ{d // 2}x10", knobs=probes),
        # nprobe 16 only: 10-bit codes scan slowly (faiss's generic decoder), 64 lists cost ~6x
        "ivf_pq_d2x10_p16": Choice(f"{ivf},PQ{d // 2}x10", knobs=[{"nprobe": 16}]),
        "ivf_pq_d3x10": Choice(f"{ivf},PQ{d // 3}x10", knobs=[{"nprobe": 16}]),
        # build_index.refine_residual (fid.retrieval.residual_codes): a small IVF-PQ for the
        # shortlist, re-scored in RAM from codes of what its codes miss. At d = 256: PQ16 +
        # PQ128x10 (16 + 160 B) and PQ32 + PQ128 + PQ16 (32 + 144 B), 184 B a passage with its
        # id: 3.9 GB at 21M. `res_d3x10` (d = 384 only) is PQ16 + PQ128x10 (3 dims a
        # sub-quantizer), the analogue of 768's PQ32 + PQ256x10 (360 B, 7.6 GB at 21M x 768).
        "res_d2x10": Choice(f"{ivf},PQ{d // 16}", knobs=refined, refine_residual=f"PQ{d // 2}x10"),
        "res_d2_d16": Choice(
            f"{ivf},PQ{d // 8}", knobs=refined, refine_residual=f"PQ{d // 2}+PQ{d // 16}"
        ),
        "res_d3x10": Choice(f"{ivf},PQ{d // 24}", knobs=refined, refine_residual=f"PQ{d // 3}x10"),
        # a byte budget, spread by the residual's variance: 9d/16 bytes (144 at 256) on PQ(d/8)
        "res_budget": Choice(f"{ivf},PQ{d // 8}", knobs=refined, refine_residual=9 * d // 16),
        # 8 GB at 21M x 768 (380 B a passage): PQ(d/12) + 25d/64 bytes, 372 B with the id at
        # 768; measured at d = 384 (PQ32 + 150 B)
        "res_budget_8gb": Choice(f"{ivf},PQ{d // 12}", knobs=refined, refine_residual=25 * d // 64),
        # the same at 8 GB for 21M x 768 (OPQ64_768,IVF16384,PQ64 + 300 B = 372 B a passage),
        # measured at d = 384 (OPQ32_384,IVF16384,PQ32 + 150 B)
        "res_nq_8gb": at_21m_lists(f"OPQ{d // 12}_{d},IVF16384,PQ{d // 12}", 25 * d // 64),
        # the same without OPQ: the base's error then keeps the embeddings' anisotropy, which
        # the budget's weighting codes for
        "res_8gb_no_opq": at_21m_lists(f"IVF16384,PQ{d // 12}", 25 * d // 64),
        # res_nq without OPQ (d = 256: IVF16384,PQ32 + 144 B)
        "res_no_opq": at_21m_lists(f"IVF16384,PQ{d // 8}", 9 * d // 16),
        # the same bytes moved from the base to the residual: OPQ16_384,IVF16384,PQ16 + 164 B
        # at d = 384 (OPQ32_768,IVF16384,PQ32 + 328 B = 368 B a passage at 768)
        "res_nq_8gb_lean": at_21m_lists(
            f"OPQ{d // 24}_{d},IVF16384,PQ{d // 24}", 41 * d // 96, nprobes=(64,)
        ),
        # nq.yaml's base (d = 256 only) with the same budget in RAM instead of vectors.npy
        "res_nq": at_21m_lists("OPQ32_256,IVF16384,PQ32", 144, nprobes=(1024, 256, 64)),
        # nq.yaml's own default (d = 256 only: run with --project 256), its knobs included;
        # k-means on 16 points a list (nq.yaml trains on 40 at 21M: 655,360 points)
        "nq_default": Choice(
            "OPQ32_256,IVF16384,PQ32",
            rerank=True,
            knobs=[{"nprobe": 1024, "shortlist": 1000}, {"nprobe": 256, "shortlist": 1000}],
            train_sample=16 * 16384,
        ),  # fmt: skip
        "nq_default_refine_pq64": Choice(
            "OPQ32_256,IVF16384,PQ32,Refine(PQ64)",
            knobs=[{"nprobe": 1024, "shortlist": 1000}, {"nprobe": 256, "shortlist": 1000}],
            train_sample=16 * 16384,
        ),
    }


# HNSW32 (more RAM than Flat: ~10 min to build 1M on one thread) and OPQ64 (~12 min of OPQ
# training, no better than OPQ48 at a shortlist of 1000) only when asked for.
DEFAULT_CHOICES = [
    c
    for c in _choices(384)
    if c not in ("hnsw", "opq64_rerank") and not c.startswith(("nq_", "ivf_", "opq_ivf", "res_"))
]


# ---------------------------------------------------------------------------------------------
# Data


def _real_passages() -> tuple[list, int]:
    """Every distinct real passage in samples/ (SQuAD passages first, DPR rows, biencoder
    contexts) and how many are SQuAD's (rows 0..n-1)."""
    from fid.data.passages import Passage, iter_passages

    squad = list(iter_passages(SQUAD_PASSAGES))
    passages = squad + list(iter_passages(DPR_PASSAGES))
    for sample in json.loads(BIENCODER.read_text()):
        for key in ("positive_ctxs", "negative_ctxs", "hard_negative_ctxs"):
            for ctx in sample[key]:
                passages.append(Passage(f"b{ctx['passage_id']}", ctx["title"], ctx["text"]))
    seen, unique = set(), []
    for passage in passages:
        if passage.text not in seen:
            seen.add(passage.text)
            unique.append(passage)
    assert unique[: len(squad)] == squad, "SQuAD passages are distinct"
    return unique, len(squad)


def _questions(passages, n_squad: int, span_words: int, spans: int, seed: int):
    """(texts, answer rows per question, set name per question)."""
    import numpy as np

    from fid.data.questions import load_questions
    from fid.metrics.has_answer import has_answer

    texts, answers, sets = [], [], []
    squad_rows = range(n_squad)
    for q in load_questions(SQUAD_QUESTIONS):
        rows = [r for r in squad_rows if has_answer(q["answers"], passages[r].text)]
        if rows:
            texts.append(q["question"])
            answers.append(rows)
            sets.append("squad")
    rng = np.random.default_rng(seed)
    for row, passage in enumerate(passages):
        words = passage.text.split()
        if len(words) < 2 * span_words:
            continue
        for start in rng.choice(len(words) - span_words, size=spans, replace=False):
            texts.append(" ".join(words[start : start + span_words]))
            answers.append([row])
            sets.append("ict")
    return texts, answers, sets


def _project(corpus, queries, dim: int, n_basis: int):
    """Corpus and questions in the top `dim` principal directions of the corpus's first
    `n_basis` rows (uncentred, so that inner products stay inner products of the projections):
    a d = 256 world from the 384-d one, to measure nq.yaml's d = 256 default itself."""
    import numpy as np

    sample = corpus[np.random.default_rng(0).choice(n_basis, 65536, replace=False)]
    sample = sample.astype(np.float32)
    _, vectors = np.linalg.eigh(sample.T @ sample)
    basis = vectors[:, ::-1][:, :dim].astype(np.float32)  # (d, dim), largest first
    projected = np.empty((len(corpus), dim), np.float16)
    for start in range(0, len(corpus), 65536):
        projected[start : start + 65536] = corpus[start : start + 65536].astype(np.float32) @ basis
    print(f"projected onto the corpus's top {dim} directions")
    return projected, (queries.astype(np.float32) @ basis).astype(queries.dtype)


def prepare(args):
    """Embeds the real passages and questions (cached) and writes the corpus as 4 shards."""
    import numpy as np

    from fid.retrieval.embeddings import save_embedding_shard

    args.workdir.mkdir(parents=True, exist_ok=True)
    cache = args.workdir / f"real_{args.span_words}_{args.spans_per_passage}.npz"
    passages, n_squad = _real_passages()
    texts, answers, sets = _questions(passages, n_squad, args.span_words, args.spans_per_passage, 0)
    if not cache.is_file():
        model, encode = load_model()
        real, _ = embed(model, encode, passages)
        queries = embed_questions(model, encode, texts)
        np.savez(cache, real=real.astype(np.float32), queries=queries)
    saved = np.load(cache)
    real, queries = saved["real"], saved["queries"]
    print(
        f"\n{len(passages)} real passages, {len(texts)} questions "
        f"({sets.count('squad')} squad, {sets.count('ict')} ict of {args.span_words} words)"
    )
    print_resemblance(real, queries)

    with timed() as writing:
        sets = np.array(sets)
        if args.distractors in ("below", "near"):
            corpus, queries, answers, sets = _honest_corpus(real, queries, answers, sets, args)
        else:
            corpus, queries = _draw(real, queries, args.size - len(real), args)
        shards = args.workdir / "shards"
        shutil.rmtree(shards, ignore_errors=True)
        shards.mkdir()
        bounds = np.linspace(0, args.size, 5).astype(int)
        prefixes = []
        for k in range(4):
            lo, hi = bounds[k], bounds[k + 1]
            ids = np.arange(lo, hi).astype(f"U{len(str(args.size))}")
            save_embedding_shard(shards / f"shard{k}", corpus[lo:hi], ids, k, 4, "all-MiniLM-L6-v2")
            prefixes.append(shards / f"shard{k}")
    print(f"\nCorpus of {args.size} passages written in {writing.wall_s:.0f} s")
    return corpus, queries, answers, sets, prefixes


def _draw(real, queries, n: int, args):
    """The real passages and n distractors as float16 (as the shards store them) and the
    questions, in the benchmark's space (projected when --project; the basis is the first
    --size rows', so that a longer draw keeps the default set's basis)."""
    import numpy as np

    if args.distractors == "near":
        synthetic, _ = _near_copies(real, n, args.near_distance)
    else:
        synthetic, _ = synthesize(real, n)
    corpus = np.concatenate([real, synthetic]).astype(np.float16)
    del synthetic
    if args.project:
        corpus, queries = _project(corpus, queries, args.project, args.size)
    return corpus, queries


def _honest_corpus(real, queries, answers, sets, args):
    """--distractors below / near (the module docstring says why Flat hits every question): the
    corpus, and the questions asked (their embeddings, answer rows and set names)."""
    import numpy as np

    n_real, needed, factor = len(real), args.size - len(real), POOL_FACTOR
    while True:
        pool, queries_here = _draw(real, queries, int(needed * factor), args)
        asked, answer_scores = _answered_first(pool[:n_real], queries_here, answers)
        kept, near = _below_answers(pool[n_real:], queries_here[asked], answer_scores[asked],
                                    needed)  # fmt: skip
        if len(kept) == needed:
            break
        # short: draw again, enough at the share kept this time
        factor *= 1.05 * needed / max(len(kept), 1)
    print(
        f"\n{args.distractors}: {asked.sum()} of {len(asked)} questions asked "
        f"({(sets[asked] == 'squad').sum()} squad; best real passage holds an answer, "
        f"{BELOW_MARGIN:g} of its score ahead of the next); {needed} of {kept[-1] + 1} "
        "distractors drawn kept (the rest outrank an answer); distractors within "
        + ", ".join(f"{m:.0%}: {np.median(c):.0f}" for m, c in zip(NEAR_MARGINS, near, strict=True))
        + " under a question's answer (median per question)"
    )
    corpus = np.concatenate([pool[:n_real], pool[n_real:][kept]])
    rows = np.flatnonzero(asked)
    return corpus, queries_here[asked], [answers[i] for i in rows], sets[asked]


def _near_copies(real, n: int, distance: float):
    """n vectors, each at `distance` x its passage's norm from a real passage (taken in turn),
    in a random direction shaped like the real embeddings' covariance (as synthesize's noise),
    and the passage of each."""
    import numpy as np

    real = real.astype(np.float32)
    factor = (real - real.mean(0)) / np.float32(np.sqrt(len(real) - 1))
    norms = np.linalg.norm(real, axis=1)
    out = np.empty((n, real.shape[1]), np.float32)
    anchors = np.arange(n) % len(real)
    for chunk, lo in enumerate(range(0, n, 100_000)):
        rng = np.random.default_rng([NEAR_SEED, chunk])
        rows = anchors[lo : lo + 100_000]
        step = rng.standard_normal((len(rows), len(real)), dtype=np.float32) @ factor
        step *= (distance * norms[rows] / np.linalg.norm(step, axis=1))[:, None]
        out[lo : lo + len(rows)] = real[rows] + step
    return out, anchors


def _answered_first(real, queries, answers):
    """Which questions' best-scoring real passage holds an answer, ahead of the runner-up by
    more than BELOW_MARGIN of its score (a mask), and each question's best score."""
    import numpy as np

    scores = queries.astype(np.float32) @ real.astype(np.float32).T
    best, runner_up = np.argsort(-scores, axis=1)[:, :2].T
    rows = np.arange(len(scores))
    first, second = scores[rows, best], scores[rows, runner_up]
    holds = np.array([b in a for b, a in zip(best, answers, strict=True)])
    return holds & (first - second > BELOW_MARGIN * np.abs(first)), first


def _below_answers(pool, queries, answer_scores, n: int):
    """The first n rows of `pool` (float16 as stored) that score under every question's answer
    score by more than BELOW_MARGIN of it, and for each margin of NEAR_MARGINS how many of them
    come within it of each question's answer (NEAR_MARGINS x questions)."""
    import numpy as np

    ceiling = answer_scores - BELOW_MARGIN * np.abs(answer_scores)
    floors = [answer_scores - m * np.abs(answer_scores) for m in NEAR_MARGINS]
    queries = queries.astype(np.float32)
    kept, near = [], np.zeros((len(NEAR_MARGINS), len(queries)), np.int64)
    for start in range(0, len(pool), 65536):
        scores = pool[start : start + 65536].astype(np.float32) @ queries.T
        below = np.flatnonzero((scores < ceiling).all(axis=1))[: n - sum(map(len, kept))]
        kept.append(start + below)
        for counts, floor in zip(near, floors, strict=True):
            counts += (scores[below] > floor).sum(axis=0)
        if sum(map(len, kept)) == n:
            break
    return np.concatenate(kept), near


# ---------------------------------------------------------------------------------------------
# Measurement


# Run in a fresh process: in this one, the heap freed by earlier indexes is reused.
_LOAD_RSS = """
import re, sys
from pathlib import Path
def anon():
    return int(re.search(r"RssAnon:\\s+(\\d+) kB", Path("/proc/self/status").read_text())[1])
from fid.retrieval.index import PassageIndex
before = anon()
index = PassageIndex.load(sys.argv[1])
print((anon() - before) / 1024)
"""


def _load_anon_mb(folder: Path) -> float:
    """Anonymous memory (MB) that `PassageIndex.load(folder)` adds in a fresh process."""
    out = subprocess.run([sys.executable, "-c", _LOAD_RSS, str(folder)], capture_output=True,
                         text=True, check=True)  # fmt: skip
    return float(out.stdout.strip().splitlines()[-1])


# What a user pays, in a fresh process (nothing of the build in its memory): the index loaded,
# then per question with its files cold (dropped from the page cache before each), then warm.
# argv: folder, queries.npy, knobs (JSON), k, batch size, cold questions, warm questions.
_COLD_WARM = """
import json, mmap, os, re, sys, time
from pathlib import Path
import numpy as np
from fid.retrieval.index import PassageIndex
folder, queries = Path(sys.argv[1]), np.load(sys.argv[2])
knobs, k, batch, n_cold, n_warm = json.loads(sys.argv[3]), *map(int, sys.argv[4:8])
def status(field):
    return int(re.search(field + r":\\s+(\\d+) kB", Path("/proc/self/status").read_text())[1])
def read_bytes():
    return int(re.search(r"read_bytes: (\\d+)", Path("/proc/self/io").read_text())[1])
def mapping(array):
    while array is not None:  # a view of a memmap (the ids) keeps the map in its bases
        if getattr(array, "_mmap", None) is not None:
            return array._mmap
        array = getattr(array, "base", None)
def evict(index):
    # a mapped page stays cached while this process maps it: unmap (pages only), then drop
    for array in (index.ids, index.vectors):
        if mapping(array) is not None:
            mapping(array).madvise(mmap.MADV_DONTNEED)
    for name in ("ids.npy", "vectors.npy"):
        if (folder / name).exists():
            fd = os.open(folder / name, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
def timed(rows):
    before, started = read_bytes(), time.perf_counter()
    index.search_rows(rows, k)
    return time.perf_counter() - started, read_bytes() - before
anon = status("RssAnon")
index = PassageIndex.load(folder)
index.set_search_params(**knobs)
out = {"held_mb": (status("RssAnon") - anon) / 1024}
cold = []
for q in range(n_cold):
    evict(index)
    cold.append(timed(queries[q : q + 1]))
out["cold1_ms"] = 1000 * np.mean([t for t, _ in cold])
out["cold1_kib"] = np.mean([b for _, b in cold]) / 1024
evict(index)
seconds, read = timed(queries[:batch])
out["coldb_ms"], out["coldb_kib"] = 1000 * seconds / batch, read / 1024 / batch
for start in range(0, len(queries), batch):  # the pass that warms the cache
    index.search_rows(queries[start : start + batch], k)
out["resident_mb"] = sum(
    int(m[1]) for m in re.finditer(r"\\.npy\\n(?:.*\\n)*?Rss:\\s+(\\d+) kB",
                                   Path("/proc/self/smaps").read_text())
) / 1024
warm = [timed(queries[q : q + 1]) for q in range(n_warm)]
out["warm1_ms"] = 1000 * np.mean([t for t, _ in warm])
out["warm1_kib"] = np.mean([b for _, b in warm]) / 1024
batches = [timed(queries[s : s + batch]) for s in range(0, len(queries) - batch + 1, batch)]
out["warmb_ms"] = 1000 * sum(t for t, _ in batches) / (batch * len(batches))
out["warmb_kib"] = sum(b for _, b in batches) / 1024 / (batch * len(batches))
print(json.dumps({k: float(v) for k, v in out.items()}))
"""


def _paid(folder: Path, queries_file: Path, knobs: dict, batch: int) -> dict:
    """`_COLD_WARM` for one knob setting: RAM held, bytes read and ms per question."""
    out = subprocess.run([sys.executable, "-c", _COLD_WARM, str(folder), str(queries_file),
                          json.dumps(knobs), str(K), str(batch), "30", "200"],
                         capture_output=True, text=True)  # fmt: skip
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def repeat_index(folder: Path, times: int) -> Path:
    """A copy of a built IVF index folder whose index holds every passage `times` times (the
    same codes in the same lists; row r + t x N is row r's t-th copy), with its ids and
    refinement codes repeated alike: a search of it scans and re-scores as much as one of
    times x N passages would (the lists are times as long, the codes in RAM times as many),
    though what it finds is the small index's results, repeated. Raises ValueError for a
    folder with vectors.npy (an on-disk re-rank: its cold reads depend on a file this copy
    would have to write in full) or a factory without inverted lists."""
    import faiss
    import numpy as np

    if (folder / "vectors.npy").exists():
        raise ValueError(f"{folder}: an on-disk re-rank; repeat only in-RAM search states")
    out = folder.with_name(f"{folder.name}_x{times}")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    index = faiss.read_index(str(folder / "index.faiss"))
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is None:
        raise ValueError(f"{folder}: no inverted lists to repeat")
    n = index.ntotal
    for copy in range(1, times):
        other = faiss.read_index(str(folder / "index.faiss"))  # (the lists are moved out of it)
        ivf.merge_from(faiss.try_extract_index_ivf(other), copy * n)
    wrapper = index
    while isinstance(wrapper, faiss.IndexPreTransform):  # its ntotal is its own copy
        wrapper.ntotal = ivf.ntotal
        wrapper = faiss.downcast_index(wrapper.index)
    faiss.write_index(index, str(out / "index.faiss"))
    del index, ivf
    for name in ("ids.npy", "refine_codes.npy"):
        if (folder / name).exists():
            array = np.load(folder / name)
            np.save(out / name, np.concatenate([array] * times))
            del array
    meta = json.loads((folder / "meta.json").read_text())
    (out / "meta.json").write_text(json.dumps(meta | {"count": meta["count"] * times}))
    for path in folder.glob("refine_*"):
        if not (out / path.name).exists():
            shutil.copy(path, out / path.name)
    return out


def _mapped_kb(name: str) -> int:
    """Resident kB of this process's mappings of files called `name` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            inside = line.rstrip().endswith("/" + name)
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


def _disagreements(result: dict, flat: dict, k: int) -> tuple[int, int]:
    """Questions this choice answers in its top k and Flat does not, and the reverse."""
    ours, exact = result[f"hits{k}"], flat[f"hits{k}"]
    return int((ours & ~exact).sum()), int((exact & ~ours).sum())


def _hits(rows, answers, k: int):
    import numpy as np

    return np.array(
        [bool(set(r[:k].tolist()) & set(a)) for r, a in zip(rows, answers, strict=True)]
    )


def measure(name: str, choice: Choice, args, queries, answers, prefixes, flat_rows) -> list[dict]:
    import numpy as np

    from fid.config import IndexConfig
    from fid.retrieval.index import PassageIndex
    from fid.retrieval.index_build import build_index

    folder = args.workdir / f"index_{name}"
    cfg = IndexConfig(
        choice.factory,
        train_sample=choice.train_sample,
        rerank=choice.rerank,
        refine_residual=choice.refine_residual,
    )
    gc.collect()
    with timed() as building:
        built = build_index(cfg, prefixes, folder)
    del built
    anon_mb = _load_anon_mb(folder)
    # first, while no process of this one maps the folder's files (mapped pages cannot be
    # dropped from the page cache, and the cold columns need them dropped)
    queries_file = args.workdir / "queries.npy"
    np.save(queries_file, queries)
    paid = [_paid(folder, queries_file, knobs, RETRIEVE_BATCH) for knobs in choice.knobs]
    if args.repeat_to and not choice.rerank and "IVF" in choice.factory:
        repeated = repeat_index(folder, args.repeat_to // args.size)
        for knobs, paid_here in zip(choice.knobs, paid, strict=True):
            at_scale = _paid(repeated, queries_file, knobs, RETRIEVE_BATCH)
            paid_here.update({f"repeated_{key}": value for key, value in at_scale.items()})
        shutil.rmtree(repeated)
    index = PassageIndex.load(folder)
    # the search state's files: index.faiss, and residual codes and quantizers if any
    state = [folder / "index.faiss", *folder.glob("refine_*")]
    file_mb = sum(path.stat().st_size for path in state) / 2**20
    results = []
    for knobs, paid_here in zip(choice.knobs, paid, strict=True):
        index.set_search_params(**knobs)
        index.search_rows(queries[:10], K)  # warm-up
        with timed() as search:
            _, ranked = index.search_rows(queries, K)
        rows = ranked.rows
        recall = (
            None
            if flat_rows is None
            else float(
                np.mean(
                    [len(np.intersect1d(r, t)) / K for r, t in zip(rows, flat_rows, strict=True)]
                )
            )
        )
        results.append(
            {
                "choice": name,
                "factory": choice.label,
                "rerank": choice.rerank,
                "knobs": knobs,
                "index_mb": file_mb,
                "anon_mb": anon_mb,
                "mapped_mb": _mapped_kb("vectors.npy") / 1024,
                "build_s": building.wall_s,
                "build_cpu_s": building.cpu_s,
                "ms": search.wall_s * 1000 / len(queries),
                "cpu_ms": search.cpu_s * 1000 / len(queries),
                "hits1": _hits(rows, answers, 1),
                "hits20": _hits(rows, answers, 20),
                "hits100": _hits(rows, answers, 100),
                "recall": recall,
                "rows": rows if name == "flat" else None,
                **paid_here,
            }
        )
    del index
    shutil.rmtree(folder, ignore_errors=True)
    return results


# ---------------------------------------------------------------------------------------------
# Report


def _knob_text(knobs: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in knobs.items()) or "exact"


def report(results: list[dict], sets, args) -> None:
    import numpy as np

    flat = next(r for r in results if r["choice"] == "flat")
    flat_mb = flat["index_mb"]
    dim = args.project or 384
    print(f"\n### Flat's own accuracy ({args.size} passages, d={dim}, {args.distractors})\n")
    print(table_header(["questions", "n", "top-1", "top-20", "top-100"]))
    for label, mask in (("all", np.ones(len(sets), bool)), ("squad", sets == "squad"),
                        ("ict", sets == "ict")):  # fmt: skip
        hits = [f"{flat[f'hits{k}'][mask].mean():.3f}" for k in (1, 20, 100)]
        print(table_row([label, mask.sum(), *hits]))
    if args.distractors != "synthetic":
        print(
            f"\n{args.distractors}: Flat ranks an answer passage first for "
            f"{flat['hits1'].sum()} of {len(sets)} questions (all, by construction), so no "
            "choice can hit a question Flat misses."
        )
    print(
        f"\n### Compressed indexes vs Flat ({args.size} passages, d={dim}, {len(sets)} questions, "
        f"{args.distractors} distractors, k=100, one thread)\n"
    )
    print(table_header([
        "choice", "factory", "rerank", "knobs", "index MB (x Flat)", "+anon MB at load",
        "mapped MB after search", "build s wall (CPU)", "ms/question wall (CPU)", "acc@20 / Flat",
        "acc@100 / Flat", "Flat's hits kept @20", "kept @100",
        "compressed hit, Flat missed @20 / @100", "Flat hit, compressed missed @20 / @100",
        "recall@100",
    ]))  # fmt: skip
    for r in results:
        cells = []
        for k in (20, 100):
            ours, exact = r[f"hits{k}"], flat[f"hits{k}"]
            cells.append(ours.mean() / exact.mean())
        for k in (20, 100):
            ours, exact = r[f"hits{k}"], flat[f"hits{k}"]
            cells.append((ours & exact).sum() / exact.sum())
        recall = "1" if r["choice"] == "flat" else f"{r['recall']:.3f}"
        gained, lost = zip(*(_disagreements(r, flat, k) for k in (20, 100)), strict=True)
        print(table_row([
            r["choice"], f"`{r['factory']}`", "yes" if r["rerank"] else "no",
            _knob_text(r["knobs"]), f"{r['index_mb']:.0f} (1/{flat_mb / r['index_mb']:.1f})",
            f"{r['anon_mb']:.0f}", f"{r['mapped_mb']:.0f}",
            f"{r['build_s']:.0f} ({r['build_cpu_s']:.0f})", f"{r['ms']:.2f} ({r['cpu_ms']:.2f})",
            *(f"{c:.4f}" for c in cells), f"{gained[0]} / {gained[1]}", f"{lost[0]} / {lost[1]}",
            recall,
        ]), flush=True)  # fmt: skip
    print(
        "\nindex MB = index.faiss (codes, inverted-list ids, centroids, rotations), with a "
        "refine_residual's codes and quantizers (+res); ids.npy and "
        "vectors.npy are memory-mapped. 1/x = Flat's index.faiss / this one's. acc@k / Flat "
        "can pass 1 on the synthetic distractors: a search that misses some of those Flat ranks "
        "above an answer lifts the answer ('compressed hit, Flat missed'); on 'near' and "
        "'below' it cannot (Flat hits every question). 'kept' counts only Flat's hits "
        "(questions Flat answers in its top k that this one answers too), the criterion for the "
        "default."
    )
    paid_table(results, args.size, dim)
    if args.repeat_to:
        repeated_table(results, args.size, args.repeat_to // args.size, dim)
    extrapolate(results, flat, args.size, dim)


def repeated_table(results: list[dict], n: int, times: int, dim: int) -> None:
    """The search cost measured on each in-RAM choice's index repeated to times x n passages."""
    print(
        f"\n### Measured at {times} x {n} passages (each choice's codes repeated; d={dim}, k={K}, "
        "one thread, fresh process)\n"
    )
    print(table_header(["choice", "knobs", "RAM held MB", "cold, one question: KiB read, ms",
                        "warm, one question: ms",
                        f"warm, batches of {RETRIEVE_BATCH}: ms a question"]))  # fmt: skip
    for r in results:
        if "repeated_held_mb" in r:
            print(table_row([
                r["choice"], _knob_text(r["knobs"]), f"{r['repeated_held_mb']:.0f}",
                f"{r['repeated_cold1_kib']:.0f}, {r['repeated_cold1_ms']:.1f}",
                f"{r['repeated_warm1_ms']:.2f}", f"{r['repeated_warmb_ms']:.2f}",
            ]))  # fmt: skip
    print(
        f"\nEach list holds {times} copies of each of its passages' codes and the refinement "
        f"{times} copies of theirs: a search scans and re-scores what one of {times * n} "
        "passages would (accuracy is the small index's). Choices re-ranked from vectors.npy, "
        "and non-IVF ones, are not repeated."
    )


def paid_table(results: list[dict], n: int, dim: int) -> None:
    """What a user pays for each setting, measured in a fresh process (`_COLD_WARM`)."""
    print(
        f"\n### What a search costs a user ({n} passages, d={dim}, k={K}, one thread; fresh "
        "process)\n"
    )
    print(table_header([
        "choice", "knobs", "RAM held MB", "page cache resident after a pass MB",
        "cold, one question: KiB read, ms", f"cold, batch of {RETRIEVE_BATCH}: KiB read, ms a question",
        "warm, one question: ms", f"warm, batches of {RETRIEVE_BATCH}: ms a question",
        "held + resident at 21M x 768 / x 256, GB",
    ]))  # fmt: skip
    n21 = 21_015_324
    for r in results:
        per_passage = (r["held_mb"] + r["resident_mb"]) * 2**20 / n
        at = [per_passage * n21 * d / dim / 1e9 for d in (768, 256)]
        print(table_row([
            r["choice"], _knob_text(r["knobs"]), f"{r['held_mb']:.0f}", f"{r['resident_mb']:.0f}",
            f"{r['cold1_kib']:.0f}, {r['cold1_ms']:.1f}", f"{r['coldb_kib']:.0f}, {r['coldb_ms']:.2f}",
            f"{r['warm1_ms']:.2f}", f"{r['warmb_ms']:.2f}", f"{at[0]:.1f} / {at[1]:.1f}",
        ]))  # fmt: skip
    print(
        "\nRAM held = anonymous memory that loading added (faiss's index: codes, lists, "
        "centroids, refinement codes); resident = pages of the mapped ids.npy and vectors.npy "
        "in the page cache after a pass over all questions (what a warm search keeps reading). "
        "Cold = ids.npy and vectors.npy dropped from the page cache before each question (or "
        "batch): bytes from /proc/self/io read_bytes, on this machine's disk. The 21M figures "
        "scale the measured bytes a passage linearly with d (codes at the same bits per "
        "dimension; ids do not grow with d, so they overstate slightly)."
    )


def extrapolate(results, flat, n: int, dim: int) -> None:
    """Bytes per passage at d=dim, scaled to 21M passages of d=768 and d=256."""
    print("\n### Extrapolated to 21M passages (index.faiss only; ids.npy, vectors.npy mapped)\n")
    print(table_header(["choice", f"factory at {dim}", f"B/passage at {dim}", "768-d analogue",
                        "GB at 21M x 768", "x Flat (64.5 GB)", "256-d analogue", "GB at 21M x 256",
                        "x Flat (21.5 GB)"]))  # fmt: skip
    n21 = 21_015_324
    seen = set()
    for r in results:
        if r["choice"] in seen:
            continue
        seen.add(r["choice"])
        per = r["index_mb"] * 2**20 / n
        cells = []
        for d in (768, 256):
            factory, code = _analogue(r["factory"], d, dim)
            fixed = NLIST_21M * d * 4 if "IVF" in factory else 0  # coarse centroids
            gb = (n21 * code + fixed) / 1e9
            flat_gb = n21 * d * 4 / 1e9
            cells += [f"`{factory}`", f"{gb:.2f}", f"1/{flat_gb / gb:.1f}"]
        print(table_row([r["choice"], f"`{r['factory']}`", f"{per:.0f}", *cells]))


def _analogue(factory: str, d: int, base: int = 384) -> tuple[str, float]:
    """The factory with the same bits per dimension at dimension d, and its bytes per passage
    (codes + the 8-byte id each IVF list entry stores; HNSW: 2 x 32 links of 4 bytes; an
    in-RAM refinement adds its own codes: SQ8 d, SQ4 d/2, SQfp16 2d bytes; residual stages
    their M x bits / 8 at M scaled with d)."""
    if m := re.fullmatch(r"(.*) \+res\((\d+) B\)", factory):
        base_factory, code = _analogue(m[1], d, base)
        budget = int(int(m[2]) * d / base)  # the same bits a dimension
        return f"{base_factory} +res({budget} B)", code + budget
    if m := re.fullmatch(r"(.*) \+res\((.*)\)", factory):
        base_factory, code = _analogue(m[1], d, base)
        stages = [re.fullmatch(r"PQ(\d+)(?:x(\d+))?", stage) for stage in m[2].split("+")]
        scaled = [(int(int(st[1]) * d / base), int(st[2] or 8)) for st in stages]
        spec = "+".join(f"PQ{sub}" + (f"x{bits}" if bits != 8 else "") for sub, bits in scaled)
        return f"{base_factory} +res({spec})", code + sum(sub * bits / 8 for sub, bits in scaled)
    if m := re.fullmatch(r"(.*),Refine\((SQ8|SQ4|SQfp16)\)", factory):
        base_factory, code = _analogue(m[1], d, base)
        return f"{base_factory},Refine({m[2]})", code + {"SQ8": d, "SQ4": d / 2, "SQfp16": 2 * d}[
            m[2]
        ]
    if m := re.fullmatch(r"(.*),Refine\(PQ(\d+)\)", factory):
        base_factory, code = _analogue(m[1], d, base)
        refine = int(int(m[2]) * d / base)  # the same bits a dimension
        return f"{base_factory},Refine(PQ{refine})", code + refine
    scale = d / base
    out = re.sub(r"IVF\d+", f"IVF{NLIST_21M}", factory)
    out = re.sub(r"OPQ(\d+)_(\d+)", lambda m: f"OPQ{int(int(m[1]) * scale)}_{d}", out)
    out = re.sub(r"PCAR(\d+)", lambda m: f"PCAR{int(int(m[1]) * scale)}", out)
    out = re.sub(r"(?<=,)PQ(\d+)", lambda m: f"PQ{int(int(m[1]) * scale)}", out)
    ids = 8 if "IVF" in out else 0
    if out == "Flat":
        return out, 4 * d
    if out.startswith("HNSW"):
        return out, 4 * d + 2 * 32 * 4
    if m := re.search(r",PQ(\d+)x4fs", out):
        return out, int(m[1]) / 2 + ids
    if m := re.search(r",PQ(\d+)(?:x(\d+))?$", out):
        return out, int(m[1]) * int(m[2] or 8) / 8 + ids
    if m := re.search(r",SQ([468])$", out):
        p = re.search(r"PCAR(\d+)", out)
        return out, (int(p[1]) if p else d) * int(m[1]) / 8 + ids
    raise ValueError(factory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1_000_000, help="passages in the corpus")
    parser.add_argument(
        "--choices", nargs="+", default=DEFAULT_CHOICES, choices=list(_choices(384))
    )
    parser.add_argument("--distractors", choices=["synthetic", "below", "near"],
                        default="synthetic", help="synthetic (may favour a compressed search), "
                        "below or near (honest: none outranks an answer, so no choice can beat "
                        "Flat); see the docstring")  # fmt: skip
    parser.add_argument("--near-distance", type=float, default=0.3,
                        help="near: each copy's distance from its passage, x its norm")  # fmt: skip
    parser.add_argument("--span-words", type=int, default=12, help="words of an ict question")
    parser.add_argument("--spans-per-passage", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=WORKDIR)
    parser.add_argument("--project", type=int, metavar="D",
                        help="project corpus and questions to D dims (nq_default needs 256)")  # fmt: skip
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--repeat-to", type=int, metavar="N",
                        help="also time each in-RAM IVF choice on its index repeated to N "
                        "passages (e.g. 21000000: latency and RAM at 21M)")  # fmt: skip
    args = parser.parse_args()
    one_thread()
    with timed() as total:
        corpus, queries, answers, sets, prefixes = prepare(args)
        del corpus
        choices = _choices(queries.shape[1])
        names = ["flat"] + [c for c in args.choices if c != "flat"]
        results, flat_rows = [], None
        for name in names:
            print(f"\n... {name}: {choices[name].label}", flush=True)
            rows = measure(name, choices[name], args, queries, answers, prefixes, flat_rows)
            if name == "flat":
                flat_rows = rows[0]["rows"]
            results.extend(rows)
            for r in rows:  # as it goes: a long run cut short still shows what it measured
                kept = [(r[f"hits{k}"] & results[0][f"hits{k}"]).sum() / results[0][f"hits{k}"].sum()
                        for k in (20, 100)]  # fmt: skip
                print(f"    {_knob_text(r['knobs'])}: kept @20 / @100 {kept[0]:.4f} / {kept[1]:.4f}, "
                      f"{r['warm1_ms']:.2f} ms warm (batch 1), {r['held_mb']:.0f} MB held",
                      flush=True)  # fmt: skip
        report(results, sets, args)
    print(f"\nTotal wall time {total.wall_s:.0f} s")
    if args.json:
        flat = results[0]
        keep = [{k: v for k, v in r.items() if k not in ("rows", "hits1", "hits20", "hits100")}
                | {"acc20": float(r["hits20"].mean()), "acc100": float(r["hits100"].mean()),
                   "distractors": args.distractors}
                | {f"{name}{k}": n for k in (20, 100)
                   for name, n in zip(("gained", "lost"), _disagreements(r, flat, k), strict=True)}
                for r in results]  # fmt: skip
        write_record(args.json, record(__file__, keep))


if __name__ == "__main__":
    main()
