"""Knobs of the retriever commands: `fid init-retriever` (a tiny BERT and tokenizer) and
`fid train-retriever` (distilling the reader's passage scores), and the reader temperature a
workflow stage trains with on scores of a given mode."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from fid.config.loading import ConfigError, check_range
from fid.config.reader import SCORE_MODES
from fid.config.training import TrainingConfig


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
