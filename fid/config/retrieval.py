"""Knobs of the retrieval commands: BM25, the retriever (`init-retriever`, `train-retriever`),
passage embeddings, the faiss index, dense retrieval and its evaluation."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Literal

from fid.config.loading import ConfigError, check_range
from fid.config.reader import SCORE_MODES
from fid.config.training import TrainingConfig

METHODS = ("robertson", "lucene", "bm25+", "bm25l", "atire")

# Lucene's English stopword set (EnglishAnalyzer.ENGLISH_STOP_WORDS_SET), which Anserini's and
# Pyserini's default analyzer removes, and the lists bm25s ships, by the names it accepts.
LUCENE_STOPWORDS = (
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is",
    "it", "no", "not", "of", "on", "or", "such", "that", "the", "their", "then", "there",
    "these", "they", "this", "to", "was", "will", "with",
)  # fmt: skip
STOPWORDS = ("lucene", "en", "en_plus", "da", "de", "es", "fr", "it", "ko", "nl", "no", "pt")
STOPWORDS += ("ru", "sv", "tr", "zh")
# faiss metrics by name (fid.retrieval.index maps them onto faiss constants).
INDEX_METRICS = ("inner_product", "l2")


@dataclass(frozen=True)
class BM25Config:
    """`fid build-bm25` / `fid retrieve-bm25`: BM25 scoring and search knobs.

    Attributes:
        k1: term-frequency saturation (built into the index).
        b: document-length normalization, 0 (none) to 1 (full) (built into the index).
        method: the bm25s scoring variant (built into the index).
        stopwords: "lucene" (Lucene's 33-word English set, what Anserini/Pyserini's default
            analyzer removes), a bm25s list name ("en", ...) or None to keep all tokens.
        stemmer: "porter" (Anserini/Pyserini's default), "english" (Snowball) or None, through
            PyStemmer.
        token_pattern: the regular expression whose matches are the tokens (lowercased);
            `(?u)\b\\w+\b` keeps 1-character tokens as Lucene's StandardTokenizer does
            (bm25s's default `\\w\\w+` drops them).
        top_k: passages kept per question (fewer when the corpus is smaller).
        batch_size: questions searched per batch (bounds memory and paces the progress log).
        list_format: what retrieve-bm25 writes: "fid_json" (FiD records with every passage's
            text) or "compact" (passage ids and scores, fid.data.retrieval_lists; the text is
            read from a passage store when used).
        shards: the workflow's BM25 jobs. 1: one index (build-bm25) and one retrieval job per
            split. S > 1: a statistics pass over the whole corpus (bm25-stats), S shard
            builds with those global statistics (build-bm25 --shard K/S), S retrievals per
            split (retrieve-bm25-shard) and a merge per split (merge-bm25-lists): the lists
            equal one index's, each job holding a shard. The commands themselves ignore it.

    Everything but top_k, batch_size, list_format and shards is built into the index; retrieval
    reads it from there (a config that disagrees with the index is an error).
    """

    k1: float = 0.9
    b: float = 0.4
    method: Literal["robertson", "lucene", "bm25+", "bm25l", "atire"] = "lucene"
    stopwords: str | None = "lucene"
    stemmer: Literal["porter", "english"] | None = "porter"
    token_pattern: str = r"(?u)\b\w+\b"
    top_k: int = 100
    batch_size: int = 256
    list_format: Literal["fid_json", "compact"] = "fid_json"
    shards: int = 1

    def __post_init__(self):
        check_range("shards", self.shards, low=1)
        _check_number("k1", self.k1, low=0.0)
        _check_number("b", self.b, low=0.0, high=1.0)
        if self.method not in METHODS:
            raise ConfigError(f"method = {self.method!r} is not allowed: expected one of {METHODS}")
        if self.stopwords is not None and self.stopwords not in STOPWORDS:
            raise ConfigError(
                f"stopwords = {self.stopwords!r} is not allowed: expected null or one of "
                f"{STOPWORDS}"
            )
        try:
            if re.compile(self.token_pattern).match(""):
                raise ConfigError(
                    f"token_pattern = {self.token_pattern!r} matches the empty string: "
                    r"expected a pattern of tokens such as '(?u)\b\w+\b'"
                )
        except re.error as error:
            raise ConfigError(
                f"token_pattern = {self.token_pattern!r} is no regular expression: {error}"
            ) from None
        _check_int("top_k", self.top_k)
        _check_int("batch_size", self.batch_size)


def _check_number(name: str, value: Any, low: float, high: float | None = None) -> None:
    allowed = f">= {low}" + ("" if high is None else f" and <= {high}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name} = {value!r} is not a number: expected a number {allowed}")
    if value < low or (high is not None and value > high):
        raise ConfigError(f"{name} = {value!r} is out of range: expected {allowed}")


def _check_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} = {value!r} is not allowed: expected an integer >= 1")


@dataclass(frozen=True)
class RetrieverTrainConfig(TrainingConfig):
    """`fid train-retriever`: distil the reader's passage scores into a bi-encoder.

    Attributes:
        n_passages: scored passages per question in the loss (those with a `score_key` value).
        train_n_passages: how many of them a TRAINING question puts in the loss: its first
            ones by `score_key` (ties in file order: the list's top passages). None (the
            default): n_passages. 1 with in_batch_negatives is DPR's loss (one positive per
            question, the batch's other questions' positives its negatives): under score
            mode uniform, the in-batch control with no candidates, whose positive is the
            retrieval list's top passage (no reader, no answer labels). Dev questions still
            rank their n_passages candidates (select_on stays meaningful).
        score_key: the ctx field holding the teacher score (written by `fid score-passages`).
        question_max_tokens, passage_max_tokens: truncation of the encoder inputs (recorded in
            the model folder: embedding and retrieval use them).
        input_format: how questions and passages become encoder inputs, recorded in the model
            folder: "pair" (DPR: `[CLS] Q [SEP]`, `[CLS] T [SEP] C [SEP]`), "fid" (the original's
            single sequences `question: Q` and `title: T context: C`) or "plain" (`Q`, `T C`).
        query_prefix, passage_prefix: text before every question / passage input (recorded).
        normalize: L2-normalise the embeddings (cosine similarity; recorded).
        project_tokens: with `projection_dim`, project (+ LayerNorm) every token and pool
            after, as the original does; False projects the pooled vector (recorded).
        kl_reduction: "batchmean" (KL summed over a question's passages, averaged over
            questions) or "mean" (÷ questions x passages: the original's KLDivLoss(), N times
            smaller, which meets clip_grad_norm later).
        pooling: "mean" (masked mean of token states, FiD's choice) or "cls".
        projection_dim: a linear projection + LayerNorm to this size (None = encoder width).
        shared_encoder: one encoder for questions and passages (FiD's choice) or two.
        objective: "kl" (FiD-KD's distillation, the default) or "emdr2" (Sachan et al. 2021,
            as Atlas trains its retriever: -log sum_k p_retriever(k | q) p_reader(a | q, k) over
            the question's scored passages, with `reader_score` read as log p(a | q, k), which
            `score_passages.mode: pdist` writes; no gradient reaches the reader).
        reader_temperature: teacher distribution = softmax(reader scores / this).
        retriever_temperature: student distribution = softmax(retriever scores / this).
        in_batch_negatives: the student also ranks the other questions' passages of the batch
            (the teacher gives them probability 0).
        eval_k: ranks at which the dev metrics are reported (dev questions re-rank their own
            n_passages candidates: k >= n_passages reports the candidates' ceiling).
        select_on: the dev metric (percent) that picks best_dev: "candidate_agreement@K" (the
            reader's top passage is in the retriever's top K of the question's candidates) or
            "candidate_answer_recall@K" (that top K holds an answer), with K < n_passages. Not
            full-corpus top-K accuracy (`fid eval-retrieval`).
        eval_batch_size: questions per dev encoding batch.
        precision: "auto" (bf16 on a GPU, fp32 on a CPU), "fp32", "bf16" or "fp16" (GPU).
    """

    n_passages: int = 100
    train_n_passages: int | None = None
    score_key: str = "reader_score"
    question_max_tokens: int = 40
    passage_max_tokens: int = 200
    input_format: Literal["fid", "pair", "plain"] = "pair"
    query_prefix: str = ""
    passage_prefix: str = ""
    pooling: Literal["mean", "cls"] = "mean"
    projection_dim: int | None = None
    shared_encoder: bool = True
    normalize: bool = False
    project_tokens: bool = True
    kl_reduction: Literal["batchmean", "mean"] = "batchmean"
    objective: Literal["kl", "emdr2"] = "kl"
    reader_temperature: float = 1.0
    retriever_temperature: float = 1.0
    in_batch_negatives: bool = False
    eval_k: list[int] = dataclasses.field(default_factory=lambda: [1, 5, 20])
    select_on: str = "candidate_agreement@5"
    eval_batch_size: int = 16
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"

    def __post_init__(self):
        super().__post_init__()
        if self.max_tokens_per_batch is not None:  # its batch is the loss's in-batch negatives
            raise ConfigError(
                f"max_tokens_per_batch = {self.max_tokens_per_batch!r} is the reader's: the "
                "retriever's micro-batch is batch_size_per_device questions, whose passages are "
                "each other's in-batch negatives (a part of the loss, not only of the memory): "
                "set that instead (null here), and see `fid plan-memory --for train-retriever` "
                "for what fits"
            )
        check_range("n_passages", self.n_passages, low=1)
        check_range("train_n_passages", self.train_n_passages, low=1, high=self.n_passages,
                    allow_none=True)  # fmt: skip
        if self.train_n_passages == 1 and not self.in_batch_negatives:
            raise ConfigError(
                "train_n_passages = 1 without in_batch_negatives: a question's one passage "
                "is its whole distribution, so the loss is 0 and nothing trains. Hint: set "
                "in_batch_negatives: true (DPR's loss), or train_n_passages >= 2"
            )
        check_range("question_max_tokens", self.question_max_tokens, low=4)
        check_range("passage_max_tokens", self.passage_max_tokens, low=8)
        check_range("projection_dim", self.projection_dim, low=1, allow_none=True)
        check_range("reader_temperature", self.reader_temperature, low=1e-6)
        check_range("retriever_temperature", self.retriever_temperature, low=1e-6)
        check_range("eval_batch_size", self.eval_batch_size, low=1)
        if self.objective == "emdr2" and self.reader_temperature != 1.0:
            raise ConfigError(
                f"reader_temperature = {self.reader_temperature} with objective = 'emdr2': "
                "EMDR2 uses the reader's likelihoods as they are. Expected 1.0 (the default)"
            )
        if self.objective == "emdr2" and self.kl_reduction != "batchmean":
            raise ConfigError(
                "kl_reduction = 'mean' with objective = 'emdr2': there is no KL to reduce "
                "(EMDR2's loss is averaged over questions). Expected 'batchmean' (the default)"
            )
        if self.sharding == "fsdp":
            raise ConfigError(
                "sharding = 'fsdp' is refused for the retriever: its two BERT-size encoders fit "
                "every GPU whole (FSDP shards the reader's T5 blocks); use 'ddp'"
            )
        if not self.eval_k or any(k < 1 for k in self.eval_k):
            raise ConfigError(f"eval_k = {self.eval_k!r} is out of range: expected ranks >= 1")
        metrics = ("candidate_agreement", "candidate_answer_recall")
        allowed = [f"{m}@{k}" for m in metrics for k in self.eval_k]
        if f"candidate_{self.select_on}" in allowed:  # the names before the candidate_ prefix
            raise ConfigError(
                f"select_on = {self.select_on!r} was renamed: use 'candidate_{self.select_on}' "
                "(it ranks each dev question's candidate passages, not the corpus)"
            )
        if self.select_on not in allowed:
            raise ConfigError(
                f"select_on = {self.select_on!r} is not allowed: expected one of {allowed}"
            )
        # Dev metrics rank each question's own n_passages candidates: at k >= n_passages every
        # model scores the same (the candidates' ceiling), so best_dev would be chosen blindly.
        select_k = int(self.select_on.split("@")[1])
        if select_k >= self.n_passages:
            raise ConfigError(
                f"select_on = {self.select_on!r} ranks {select_k} of the n_passages = "
                f"{self.n_passages} candidates of each dev question: it is the same for every "
                f"model; expected a rank k < n_passages"
            )


def reader_temperature_for(value: Any, mode: str) -> Any:
    """The `reader_temperature` a workflow retriever stage trains with on scores of `mode`.

    A temperature belongs to the scale of the scores it divides: attention mass lies in [0, 1]
    and is sharpened into a teacher (the demo's 0.1), where a log-likelihood (pdist), its drop
    (loop) or a mean logit are used as they are (1.0, RetrieverTrainConfig's default, which
    EMDR2 requires). So the workflow's retriever sections may give it per mode,
    `{attention_mass: 0.1}`, and every stage, a distillation signal's included, gets the number
    of the mode its scores were written with, or None (not set: the default) for a mode the
    mapping does not name. A number (or anything else: the dataclass checks it) is returned as
    it is.

    Raises:
        ConfigError: a mapping with a key that is no score_passages mode, or a value that is
            no number > 0 (the caller names the config key).
    """
    if not isinstance(value, dict):
        return value
    for name, number in value.items():
        if name not in SCORE_MODES:
            raise ConfigError(
                f"{name!r} is no score_passages mode: expected a number, or a mapping from "
                f"modes ({', '.join(SCORE_MODES)}) to numbers"
            )
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            raise ConfigError(f"{name} = {number!r} has the wrong type: expected a number")
        check_range(name, number, low=1e-6)
    return value.get(mode)


@dataclass(frozen=True)
class InitRetrieverConfig:
    """`fid init-retriever`: a WordPiece tokenizer trained on a corpus and a random BERT.

    For demos and tests; real runs start from a pretrained encoder (bert-base-uncased, ...).
    """

    seed: int = 0
    vocab_size: int = 3000
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 512
    max_position_embeddings: int = 512
    dropout: float = 0.0

    def __post_init__(self):
        for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size"):
            check_range(name, getattr(self, name), low=1)
        check_range("vocab_size", self.vocab_size, low=100)
        check_range("max_position_embeddings", self.max_position_embeddings, low=8)
        check_range("dropout", self.dropout, low=0.0, high=1.0)
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"hidden_size = {self.hidden_size} is not allowed: expected a multiple of "
                f"num_heads ({self.num_heads})"
            )


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
