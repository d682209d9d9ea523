"""Typed configuration of each `fid` subcommand, loaded from YAML.

Knobs live here (one dataclass per subcommand); paths come from the command line. A YAML file
holds exactly the field names of its dataclass: unknown keys, wrong types and out-of-range values
are rejected with the key, the value and what is allowed. Defaults live in the dataclasses only.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml


class ConfigError(ValueError):
    """A configuration file or value is not what a subcommand accepts."""


def _check_finite(name: str, value: Any):
    """Raises ConfigError for NaN and +-inf: NaN passes every comparison (`nan < 0` is False)
    and inf passes a lower bound, so range checks alone let YAML's .nan/.inf reach torch."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{name} = {value!r} is not a finite number: expected a real value")


def _check_range(name: str, value: Any, *, low=None, high=None, allow_none=False, what=None):
    """Raises ConfigError unless low <= value <= high (either bound optional)."""
    if value is None and allow_none:
        return
    _check_finite(name, value)
    if (low is not None and value < low) or (high is not None and value > high):
        if what is None:
            bounds = []
            if low is not None:
                bounds.append(f">= {low}")
            if high is not None:
                bounds.append(f"<= {high}")
            what = " and ".join(bounds)
        raise ConfigError(f"{name} = {value!r} is out of range: expected {what}")


@dataclass(frozen=True)
class ReaderInputConfig:
    """How questions and passages become reader inputs (shared by train, eval and scoring).

    Attributes:
        n_passages: passages read per question (the top ones by `score`; fewer are padded).
        passage_max_tokens: tokens kept of each `question: Q title: T context: P` input.
        encoder_buckets: a question batch's passages are sorted by length and encoded in this
            many groups, each padded only to its own longest; 1 encodes them all at once.
        pack_passages: hand the decoder only the real tokens of each question's passages
            (exact: cross-attention has no position bias); False reproduces the original's
            (B, N*L) layout with padding tokens masked.
        pad_to_max_length: pad every passage to `passage_max_tokens` (the original's
            behaviour; only useful for comparisons).
        precision: "fp32", "bf16" (autocast) or "fp16" (autocast + loss scaling; GPU only).
        attention: T5's attention kernel: "auto" is "eager" on CPU (measured faster there than
            "sdpa": 0.84 vs 1.14 s per step at 100 passages, bf16) and "sdpa" on GPU.
    """

    n_passages: int = 100
    passage_max_tokens: int = 250
    encoder_buckets: int = 8
    pack_passages: bool = True
    pad_to_max_length: bool = False
    precision: Literal["fp32", "bf16", "fp16"] = "bf16"
    attention: Literal["auto", "eager", "sdpa"] = "auto"

    def __post_init__(self):
        _check_range("n_passages", self.n_passages, low=1)
        _check_range("passage_max_tokens", self.passage_max_tokens, low=8)
        _check_range("encoder_buckets", self.encoder_buckets, low=1)


@dataclass(frozen=True)
class GenerationConfig(ReaderInputConfig):
    """Reader generation knobs shared by dev evaluation and `fid eval-reader`.

    Attributes:
        batch_size: questions per generation batch.
        max_answer_tokens: most tokens generated per answer (EOS included).
        num_beams: 1 is greedy decoding, more is beam search.
    """

    batch_size: int = 8
    max_answer_tokens: int = 20
    num_beams: int = 1

    def __post_init__(self):
        super().__post_init__()
        _check_range("batch_size", self.batch_size, low=1)
        _check_range("max_answer_tokens", self.max_answer_tokens, low=1)
        _check_range("num_beams", self.num_beams, low=1)


@dataclass(frozen=True)
class EvalReaderConfig(GenerationConfig):
    """`fid eval-reader`: generate answers and score them (EM, F1)."""


@dataclass(frozen=True)
class ScorePassagesConfig(ReaderInputConfig):
    """`fid score-passages`: re-score each read passage with the reader's cross-attention.

    Attributes:
        batch_size: questions per scoring batch.
        mode: "mean_logit" is the original FiD-KD score (first decoding step, pre-softmax
            cross-attention logits averaged over layers, heads and the passage's tokens);
            "attention_mass" is the softmax probability mass that falls on the passage,
            averaged over layers and heads (Atlas's family of distillation targets).
    """

    batch_size: int = 8
    mode: Literal["mean_logit", "attention_mass"] = "mean_logit"

    def __post_init__(self):
        super().__post_init__()
        _check_range("batch_size", self.batch_size, low=1)


@dataclass(frozen=True)
class TrainingConfig:
    """The training-loop knobs shared by every trained model (reader now, retriever later).

    Attributes:
        seed: seeds weights-independent randomness: data order, answer sampling, dropout.
        max_steps: optimizer steps in total.
        batch_size_per_device: questions per micro-batch (ignored when `max_tokens_per_batch`).
        max_tokens_per_batch: if set, micro-batches are groups of questions holding at most this
            many passage tokens (token-budget batching); a longer question forms its own batch.
        gradient_accumulation_steps: micro-batches per optimizer step.
        lr: peak learning rate.
        weight_decay: AdamW decoupled weight decay (never applied to biases and norms).
        scheduler: "constant", "linear" (decay to `min_lr_ratio` * lr) or "cosine".
        warmup_steps: linear warm-up from 0 to `lr`.
        min_lr_ratio: final learning rate as a fraction of `lr` for linear and cosine.
        clip_grad_norm: gradient norm clipping; None disables it.
        eval_every_steps: dev evaluation cadence (0 = only at the end).
        save_every_steps: checkpoint cadence (0 = only at the end).
        save_every_minutes: also save when this much wall-clock time has passed since the last
            checkpoint (rank 0's clock decides for all ranks); None or 0 = off. It bounds the
            work lost when a job is killed without the preemption signal reaching it.
        keep_last_checkpoints: `step-N` checkpoints kept (best_dev is kept separately).
        log_every_steps: logging cadence of the loss, learning rate and peak memory.
        tensorboard: write TensorBoard scalars beside metrics.jsonl.
        sharding: "ddp" replicates the model on every rank; "fsdp" shards parameters,
            gradients and optimizer state across ranks (readers too large for one GPU).
    """

    seed: int = 0
    max_steps: int = 15000
    batch_size_per_device: int = 1
    max_tokens_per_batch: int | None = None
    gradient_accumulation_steps: int = 1
    lr: float = 1e-4
    weight_decay: float = 0.01
    scheduler: Literal["constant", "linear", "cosine"] = "linear"
    warmup_steps: int = 1000
    min_lr_ratio: float = 0.0
    clip_grad_norm: float | None = 1.0
    eval_every_steps: int = 500
    save_every_steps: int = 500
    save_every_minutes: float | None = None
    keep_last_checkpoints: int = 2
    log_every_steps: int = 50
    tensorboard: bool = True
    sharding: Literal["ddp", "fsdp"] = "ddp"

    def __post_init__(self):
        _check_range("max_steps", self.max_steps, low=1)
        _check_range("batch_size_per_device", self.batch_size_per_device, low=1)
        _check_range("max_tokens_per_batch", self.max_tokens_per_batch, low=1, allow_none=True)
        _check_range("gradient_accumulation_steps", self.gradient_accumulation_steps, low=1)
        _check_range("lr", self.lr, low=0.0, high=1.0, what="0 < lr <= 1")
        if self.lr == 0:
            raise ConfigError("lr = 0 is out of range: expected 0 < lr <= 1")
        _check_range("weight_decay", self.weight_decay, low=0.0)
        _check_range("warmup_steps", self.warmup_steps, low=0)
        _check_range("min_lr_ratio", self.min_lr_ratio, low=0.0, high=1.0)
        _check_range("clip_grad_norm", self.clip_grad_norm, low=0.0, allow_none=True)
        _check_range("eval_every_steps", self.eval_every_steps, low=0)
        _check_range("save_every_steps", self.save_every_steps, low=0)
        _check_range("save_every_minutes", self.save_every_minutes, low=0.0, allow_none=True)
        _check_range("keep_last_checkpoints", self.keep_last_checkpoints, low=1)
        _check_range("log_every_steps", self.log_every_steps, low=1)


@dataclass(frozen=True)
class ReaderTrainConfig(TrainingConfig, GenerationConfig):
    """`fid train-reader`: the training loop, the reader inputs and the dev generation.

    Attributes:
        answer_max_tokens: if set, every target is padded or truncated to exactly this many
            tokens (EOS included), so the decoder sees one shape; None pads to the batch's longest.
        activation_checkpointing: recompute activations in the backward pass (training only).
        dropout: overrides the model's dropout rate when set.
        eval_max_questions: evaluate on the first this-many dev questions (None = all).
    """

    answer_max_tokens: int | None = None
    activation_checkpointing: bool = True
    dropout: float | None = None
    eval_max_questions: int | None = None

    def __post_init__(self):
        TrainingConfig.__post_init__(self)
        GenerationConfig.__post_init__(self)
        _check_range("answer_max_tokens", self.answer_max_tokens, low=2, allow_none=True)
        _check_range("dropout", self.dropout, low=0.0, high=1.0, allow_none=True)
        _check_range("eval_max_questions", self.eval_max_questions, low=1, allow_none=True)


@dataclass(frozen=True)
class RetrieverTrainConfig(TrainingConfig):
    """`fid train-retriever`: distil the reader's passage scores into a bi-encoder.

    Attributes:
        n_passages: scored passages per question in the loss (those with a `score_key` value).
        score_key: the ctx field holding the teacher score (written by `fid score-passages`).
        question_max_tokens, passage_max_tokens: truncation of the encoder inputs.
        pooling: "mean" (masked mean of token states, FiD's choice) or "cls".
        projection_dim: a linear projection + LayerNorm to this size (None = encoder width).
        shared_encoder: one encoder for questions and passages (FiD's choice) or two.
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
        precision: "fp32", "bf16" or "fp16" (GPU).
    """

    n_passages: int = 100
    score_key: str = "reader_score"
    question_max_tokens: int = 40
    passage_max_tokens: int = 200
    pooling: Literal["mean", "cls"] = "mean"
    projection_dim: int | None = None
    shared_encoder: bool = True
    reader_temperature: float = 1.0
    retriever_temperature: float = 1.0
    in_batch_negatives: bool = False
    eval_k: list[int] = dataclasses.field(default_factory=lambda: [1, 5, 20])
    select_on: str = "candidate_agreement@5"
    eval_batch_size: int = 16
    precision: Literal["fp32", "bf16", "fp16"] = "bf16"

    def __post_init__(self):
        super().__post_init__()
        _check_range("n_passages", self.n_passages, low=1)
        _check_range("question_max_tokens", self.question_max_tokens, low=4)
        _check_range("passage_max_tokens", self.passage_max_tokens, low=8)
        _check_range("projection_dim", self.projection_dim, low=1, allow_none=True)
        _check_range("reader_temperature", self.reader_temperature, low=1e-6)
        _check_range("retriever_temperature", self.retriever_temperature, low=1e-6)
        _check_range("eval_batch_size", self.eval_batch_size, low=1)
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


@dataclass(frozen=True)
class EmbedPassagesConfig:
    """`fid embed-passages`: one shard of the passage file into float16 embeddings.

    Attributes:
        batch_size: passages per encoder call.
        passage_max_tokens: truncation of `title [SEP] text` (as in retriever training).
        sort_by_length: sort passages by token count within chunks, so a batch is padded only
            to its own longest passage.
        sort_chunk: passages read, sorted and embedded together (bounds memory on 21M rows).
        pad_to_max_length: pad every batch to `passage_max_tokens` (a baseline for comparison).
        precision: "auto" (bf16 on GPU, fp32 on CPU), "fp32", "bf16" or "fp16" (GPU).
    """

    batch_size: int = 128
    passage_max_tokens: int = 200
    sort_by_length: bool = True
    sort_chunk: int = 65536
    pad_to_max_length: bool = False
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"

    def __post_init__(self):
        _check_range("batch_size", self.batch_size, low=1)
        _check_range("passage_max_tokens", self.passage_max_tokens, low=8)
        _check_range("sort_chunk", self.sort_chunk, low=1)


@dataclass(frozen=True)
class RetrieveConfig:
    """`fid retrieve`: encode questions, search the index, write FiD records.

    Attributes:
        top_k: passages kept per question.
        batch_size: questions per encoder call.
        question_max_tokens: truncation of questions (as in retriever training).
        nprobe, ef_search: IVF / HNSW search breadth; None keeps the index's own settings.
        has_answer_mode: DPR's "string" rule, or "regex" for answers given as patterns.
        precision: "auto" (bf16 on GPU, fp32 on CPU), "fp32", "bf16" or "fp16" (GPU).
    """

    top_k: int = 100
    batch_size: int = 64
    question_max_tokens: int = 40
    nprobe: int | None = None
    ef_search: int | None = None
    has_answer_mode: Literal["string", "regex"] = "string"
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"

    def __post_init__(self):
        _check_range("top_k", self.top_k, low=1)
        _check_range("batch_size", self.batch_size, low=1)
        _check_range("question_max_tokens", self.question_max_tokens, low=4)
        _check_range("nprobe", self.nprobe, low=1, allow_none=True)
        _check_range("ef_search", self.ef_search, low=1, allow_none=True)


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


@dataclass(frozen=True)
class InitReaderConfig:
    """`fid init-reader`: a tokenizer trained on a corpus and a randomly initialised T5.

    For demos and tests, where no pretrained model can be downloaded. Real runs start from a
    pretrained T5 (`t5-base`, a local path) instead.
    """

    seed: int = 0
    vocab_size: int = 3000
    d_model: int = 128
    d_ff: int = 512
    d_kv: int = 32
    num_layers: int = 2
    num_decoder_layers: int = 2
    num_heads: int = 4
    dropout_rate: float = 0.0
    relative_attention_num_buckets: int = 32

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "d_ff", "d_kv", "num_layers", "num_heads"):
            _check_range(name, getattr(self, name), low=1)
        _check_range("vocab_size", self.vocab_size, low=100)
        _check_range("num_decoder_layers", self.num_decoder_layers, low=1)
        _check_range("dropout_rate", self.dropout_rate, low=0.0, high=1.0)
        _check_range("relative_attention_num_buckets", self.relative_attention_num_buckets, low=2)


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
            _check_range(name, getattr(self, name), low=1)
        _check_range("vocab_size", self.vocab_size, low=100)
        _check_range("max_position_embeddings", self.max_position_embeddings, low=8)
        _check_range("dropout", self.dropout, low=0.0, high=1.0)
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"hidden_size = {self.hidden_size} is not allowed: expected a multiple of "
                f"num_heads ({self.num_heads})"
            )


T = TypeVar("T")


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _matches(value: Any, tp: Any) -> bool:
    """Whether a YAML value fits a field's type (ints are accepted where floats are)."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return value in typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    if origin is list:
        (item,) = typing.get_args(tp)
        return isinstance(value, list) and all(_matches(v, item) for v in value)
    raise TypeError(f"unsupported config field type {tp!r}")


def config_from_dict(data: dict[str, Any], cls: type[T], source: str = "config") -> T:
    """Builds a config dataclass from a mapping, checking keys, types and ranges.

    Raises:
        ConfigError: naming `source`, the key, the value and what is allowed.
    """
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: expected a mapping of keys to values, got {type(data).__name__}"
        )
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    for key, value in data.items():
        if key not in fields:
            raise ConfigError(
                f"{source}: unknown key {key!r} for {cls.__name__}. "
                f"Allowed keys: {', '.join(sorted(fields))}"
            )
        if not _matches(value, hints[key]):
            raise ConfigError(
                f"{source}: {key} = {value!r} has the wrong type: expected {_type_name(hints[key])}"
            )
        if hints[key] is float and isinstance(value, int):
            data = {**data, key: float(value)}
    try:
        for key, value in data.items():  # every float knob, range-checked or not
            _check_finite(key, value)
        return cls(**data)
    except ConfigError as error:
        raise ConfigError(f"{source}: {error}") from None


def load_config(path: str | Path | None, cls: type[T]) -> T:
    """Loads a YAML file into `cls`; None (no file) gives the defaults.

    Raises:
        ConfigError: for a missing or unreadable file, invalid YAML, or a bad key or value.
    """
    if path is None:
        return cls()
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: invalid YAML: {error}") from None
    return config_from_dict(data, cls, source=str(path))


def config_to_dict(config: Any) -> dict[str, Any]:
    """The plain-types dict of a config (for checkpoints and provenance records)."""
    return dataclasses.asdict(config)


__all__ = [
    "ConfigError",
    "EmbedPassagesConfig",
    "EvalReaderConfig",
    "EvalRetrievalConfig",
    "GenerationConfig",
    "InitReaderConfig",
    "InitRetrieverConfig",
    "ReaderInputConfig",
    "ReaderTrainConfig",
    "RetrieveConfig",
    "RetrieverTrainConfig",
    "ScorePassagesConfig",
    "TrainingConfig",
    "config_from_dict",
    "config_to_dict",
    "load_config",
]
