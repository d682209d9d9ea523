"""Knobs of the dense retrieval commands: passage embeddings (`fid embed-passages`), the faiss
index (`build-index`), retrieval (`retrieve`) and its evaluation (`eval-retrieval`). BM25's are
in fid.config.bm25, the retriever's training in fid.config.retriever."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Literal

from fid.config.loading import ConfigError, check_range

# faiss metrics by name (fid.retrieval.index maps them onto faiss constants).
INDEX_METRICS = ("inner_product", "l2")


@dataclass(frozen=True)
class EmbedPassagesConfig:
    """`fid embed-passages`: one shard of the passage file into float16 embeddings.

    Attributes:
        batch_size: passages per encoder call.
        passage_max_tokens: truncation of each passage input; None (the default) takes the
            retriever's own (recorded in its folder by training, fid.models.settings), and
            another value is an error unless `override_model_settings`.
        sort_by_length: sort passages by token count within chunks, so a batch is padded only
            to its own longest passage.
        sort_chunk: passages read, sorted and embedded together (bounds memory on 21M rows).
        pad_to_max_length: pad every batch to `passage_max_tokens` (a baseline for comparison).
        precision: "auto" (bf16 on GPU; on CPU bf16 for a model at least 384 wide where the
            CPU computes it natively, else fp32), "fp32", "bf16" or "fp16" (GPU).
        override_model_settings: use this config's `passage_max_tokens` over the model's.
    """

    batch_size: int = 128
    passage_max_tokens: int | None = None
    sort_by_length: bool = True
    sort_chunk: int = 65536
    pad_to_max_length: bool = False
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    override_model_settings: bool = False

    def __post_init__(self):
        check_range("batch_size", self.batch_size, low=1)
        check_range("passage_max_tokens", self.passage_max_tokens, low=8, allow_none=True)
        check_range("sort_chunk", self.sort_chunk, low=1)


# A residual refinement stage: "PQ<M>" (M sub-quantizers of 8 bits) or "PQ<M>x<bits>"
REFINE_STAGE = re.compile(r"PQ([1-9][0-9]*)(?:x([1-9][0-9]*))?")


def parse_refine_stages(spec: str) -> list[tuple[int, int]]:
    """`refine_residual`: 'PQ128' -> [(128, 8)], 'PQ64x10+PQ32' -> [(64, 10), (32, 8)], each
    stage's (sub-quantizers, bits).

    Raises:
        ConfigError: for anything else, or bits outside 1..16.
    """
    stages = []
    for part in str(spec).split("+"):
        match = REFINE_STAGE.fullmatch(part.strip())
        bits = int(match[2] or 8) if match else 0
        if not isinstance(spec, str) or not match or not 1 <= bits <= 16:
            raise ConfigError(
                f"refine_residual = {spec!r} is not allowed: expected a byte budget a passage "
                "(an integer, e.g. 144) or product-quantizer stages 'PQ<M>' or 'PQ<M>x<bits>' "
                "(bits 1..16) joined by '+', e.g. 'PQ128', 'PQ128x10' or 'PQ64+PQ64'"
            )
        stages.append((int(match[1]), bits))
    return stages


@dataclass(frozen=True)
class IndexConfig:
    """`fid build-index`: which faiss index to build and how to search it.

    Attributes:
        factory: a faiss `index_factory` string ("Flat" is exact; "HNSW32", "IVF4096,PQ64",
            "SQ8", "IVF256,Flat", ... trade accuracy for speed or memory). Checked when the
            index is built, because whether it is valid depends on the embedding dim.
        metric: "inner_product" (what the retriever scores with) or "l2".
        train_sample: vectors sampled (seeded) to train indexes that need training (IVF, PQ,
            SQ); all vectors when there are fewer.
        add_batch_size: vectors converted to float32 and added to the index at a time.
        nprobe: inverted lists visited per query by IVF indexes.
        ef_search: candidate list size of HNSW graphs (also an HNSW coarse quantizer's).
        seed: seeds the training sample.
        rerank: also keep every vector as float16 in `vectors.npy` beside the index
            (memory-mapped, not in RAM) and re-score each query's `shortlist` candidates from
            the compressed index exactly (fid.retrieval.rerank). For compressed factories
            ("OPQ64_256,IVF65536_HNSW32,PQ64", "IVF4096,PQ64x4fs", "PCAR128,SQ8", ...);
            pointless for "Flat", which is exact already.
        shortlist: candidates per query fetched from the compressed index and re-scored when
            `rerank` (the default of every search; `retrieve.shortlist` overrides it). It must
            be >= the passages wanted per query (retrieve.top_k). Also the shortlist of a
            factory that refines in RAM: "OPQ32_256,IVF16384,PQ32,Refine(SQ8)" (or SQ4,
            SQfp16, PQ<M>, RFlat) keeps refinement codes in the index and re-scores the
            shortlist with them, no vectors.npy and no disk read per search (faiss's
            k_factor = shortlist / top_k); not with `rerank`. Also the shortlist re-scored with
            `refine_residual`.
        refine_residual: codes of what the factory's own codes miss of each passage, held in
            RAM, from which a search re-scores the shortlist (fid.retrieval.residual_codes):
            no vectors.npy, no disk read, finer than a Refine(...) of the same bytes. A byte
            budget a passage (e.g. 144: spread over the residual's principal axes by their
            variance) or product-quantizer stages ("PQ128", "PQ128x10", "PQ64+PQ64"). For an
            IVF with PQ or SQ codes ("IVF16384,PQ32", "OPQ32_256,IVF16384,PQ32") and
            inner_product; not with `rerank`.
    """

    factory: str = "Flat"
    metric: Literal["inner_product", "l2"] = "inner_product"
    train_sample: int = 262144
    add_batch_size: int = 65536
    nprobe: int = 16
    ef_search: int = 128
    seed: int = 0
    rerank: bool = False
    shortlist: int = 1000
    refine_residual: int | str | None = None

    def __post_init__(self):
        if not isinstance(self.factory, str) or not self.factory.strip():
            raise ConfigError(
                f"factory = {self.factory!r} is not allowed: expected a faiss index_factory "
                "string such as 'Flat', 'HNSW32' or 'IVF4096,PQ64'"
            )
        if self.metric not in INDEX_METRICS:
            raise ConfigError(
                f"metric = {self.metric!r} is not allowed: expected one of "
                + ", ".join(repr(m) for m in INDEX_METRICS)
            )
        check_range("train_sample", self.train_sample, low=1)
        check_range("add_batch_size", self.add_batch_size, low=1)
        check_range("nprobe", self.nprobe, low=1)
        check_range("ef_search", self.ef_search, low=1)
        if not isinstance(self.rerank, bool):
            raise ConfigError(f"rerank = {self.rerank!r} is not allowed: expected true or false")
        check_range("shortlist", self.shortlist, low=1)
        if isinstance(self.refine_residual, int) and not isinstance(self.refine_residual, bool):
            check_range("refine_residual", self.refine_residual, low=1)
        elif self.refine_residual is not None:
            parse_refine_stages(self.refine_residual)
        if self.refine_residual is not None:
            if self.rerank:
                raise ConfigError(
                    f"refine_residual = {self.refine_residual!r} with rerank: true: a shortlist "
                    "is re-scored once, from vectors.npy (rerank) or from residual codes in RAM "
                    "(refine_residual). Hint: drop one"
                )
            if self.metric != "inner_product":
                raise ConfigError(
                    f"refine_residual with metric = {self.metric!r}: only inner_product is "
                    "supported. Hint: for l2, faiss's own two-stage residual index, e.g. "
                    "factory = 'IVF4096,PQ32+96'"
                )


@dataclass(frozen=True)
class RetrieveConfig:
    """`fid retrieve`: encode questions, search the index, write FiD records.

    Attributes:
        top_k: passages kept per question.
        batch_size: questions per encoder call.
        question_max_tokens: truncation of questions; None (the default) takes the
            retriever's own, as `EmbedPassagesConfig.passage_max_tokens`.
        nprobe, ef_search: IVF / HNSW search breadth; None keeps the index's own settings.
        shortlist: candidates per question re-scored exactly by an index built with
            `rerank: true` (>= top_k); None keeps the index's own. An error for an index
            without re-ranking vectors.
        has_answer_mode: DPR's "string" rule, or "regex" for answers given as patterns.
        precision: "auto" (bf16 on GPU; on CPU bf16 for a model at least 384 wide where the
            CPU computes it natively, else fp32), "fp32", "bf16" or "fp16" (GPU).
        override_model_settings: use this config's `question_max_tokens` over the model's.
        list_format: "fid_json" (FiD records with every passage's text) or "compact"
            (passage ids and scores; see BM25Config).
    """

    top_k: int = 100
    batch_size: int = 64
    question_max_tokens: int | None = None
    nprobe: int | None = None
    ef_search: int | None = None
    shortlist: int | None = None
    has_answer_mode: Literal["string", "regex"] = "string"
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    override_model_settings: bool = False
    list_format: Literal["fid_json", "compact"] = "fid_json"

    def __post_init__(self):
        check_range("top_k", self.top_k, low=1)
        check_range("batch_size", self.batch_size, low=1)
        check_range("question_max_tokens", self.question_max_tokens, low=4, allow_none=True)
        check_range("nprobe", self.nprobe, low=1, allow_none=True)
        check_range("ef_search", self.ef_search, low=1, allow_none=True)
        check_range("shortlist", self.shortlist, low=1, allow_none=True)
        if self.shortlist is not None and self.shortlist < self.top_k:
            raise ConfigError(
                f"shortlist = {self.shortlist} is smaller than top_k = {self.top_k}: expected "
                "shortlist >= top_k (the re-ranked index keeps the best top_k of the shortlist)"
            )


@dataclass(frozen=True)
class EvalRetrievalConfig:
    """`fid eval-retrieval`: top-k accuracy of retrieved passages (DPR's has-answer rule).

    Attributes:
        ks: the ranks reported.
        has_answer_mode: "string" (DPR) or "regex" (answers are patterns).
        recompute_has_answer: ignore the ctxs' own `has_answer` flags and recompute them.
    """

    ks: list[int] = dataclasses.field(default_factory=lambda: [1, 5, 10, 20, 50, 100])
    has_answer_mode: Literal["string", "regex"] = "string"
    recompute_has_answer: bool = False

    def __post_init__(self):
        if not self.ks or any(k < 1 for k in self.ks):
            raise ConfigError(f"ks = {self.ks!r} is out of range: expected ranks >= 1")
