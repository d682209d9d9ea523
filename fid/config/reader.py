"""Knobs of the reader's commands: `fid init-reader`, `train-reader`, `eval-reader`,
`score-passages`."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import ClassVar, Literal

from fid.config.loading import ConfigError, check_finite, check_range
from fid.config.training import TrainingConfig


@dataclass(frozen=True)
class ReaderInputConfig:
    """How questions and passages become reader inputs (shared by train, eval and scoring).

    Attributes:
        n_passages: passages read per question (the top ones by `score`; fewer are padded).
        passage_max_tokens: tokens kept of each `question: Q title: T context: P` input. Set by
            training and recorded in the model folder (fid.models.settings); eval and scoring
            read it from there (None), and a different value here is an error unless
            `override_model_settings`.
        encoder_buckets: a question batch's passages are sorted by length and encoded in this
            many groups, each padded only to its own longest; 1 encodes them all at once.
        pack_passages: hand the decoder only the real tokens of each question's passages
            (exact: cross-attention has no position bias); False reproduces the original's
            (B, N*L) layout with padding tokens masked.
        pad_to_max_length: pad every passage to `passage_max_tokens` (the original's
            behaviour; only useful for comparisons).
        precision: "auto" (bf16 on a GPU; fp32 on a CPU, but for generation by a model at
            least 384 wide on a CPU with native bf16: see fid.runtime.precision), "fp32",
            "bf16" (autocast) or "fp16" (autocast + loss scaling; GPU only).
        attention: T5's attention kernel: "auto" is "eager" on CPU (measured faster there than
            "sdpa": 0.84 vs 1.14 s per step at 100 passages, bf16) and "sdpa" on GPU.
        light_tokens: FiD-Light (fid.models.reader_variants): the decoder reads only the first
            this-many encoder vectors of each passage. Set by training and recorded in the
            model folder like `passage_max_tokens`: eval and scoring use the model's (None); a
            different value here is an error unless `override_model_settings`. On a model that
            records none it reads a plain reader light without fine-tuning.
    """

    n_passages: int = 100
    passage_max_tokens: int | None = None
    encoder_buckets: int = 8
    pack_passages: bool = True
    pad_to_max_length: bool = False
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    attention: Literal["auto", "eager", "sdpa"] = "auto"
    light_tokens: int | None = None

    def __post_init__(self):
        check_range("n_passages", self.n_passages, low=1)
        check_range("passage_max_tokens", self.passage_max_tokens, low=8, allow_none=True)
        check_range("encoder_buckets", self.encoder_buckets, low=1)
        check_range("light_tokens", self.light_tokens, low=1, allow_none=True)


@dataclass(frozen=True)
class GenerationConfig(ReaderInputConfig):
    """Reader generation knobs shared by dev evaluation and `fid eval-reader`.

    Attributes:
        eval_batch_size: questions per generation batch.
        max_new_tokens: most tokens generated per answer (EOS included); 50 as FiD's
            recipes for NQ and TriviaQA generate (test_reader.py: max_length 50).
        num_beams: 1 is greedy decoding, more is beam search.
    """

    # Keys of earlier versions, refused with their new name.
    renamed_keys: ClassVar[dict[str, str]] = {
        "batch_size": "eval_batch_size",
        "max_answer_tokens": "max_new_tokens",
    }

    eval_batch_size: int = 8
    max_new_tokens: int = 50
    num_beams: int = 1

    def __post_init__(self):
        super().__post_init__()
        check_range("eval_batch_size", self.eval_batch_size, low=1)
        check_range("max_new_tokens", self.max_new_tokens, low=1)
        check_range("num_beams", self.num_beams, low=1)


@dataclass(frozen=True)
class EvalReaderConfig(GenerationConfig):
    """`fid eval-reader`: generate answers and score them (EM, F1).

    Attributes:
        override_model_settings: use this config's `passage_max_tokens` even where the model
            folder records another (the model then reads inputs unlike its training's).
        keep_passages: passage pruning (no retraining): after the first decoding step, only
            the top this-many passages by that step's cross-attention are read for the rest of
            the answer (None: all). fid.inference.accelerated_generation explains it.
        keep_passages_by: the passage score that ranks them: "mean_logit" (what the retriever
            is distilled from) or "attention_mass".
        keep_tokens: token elimination (no retraining; Berchansky et al. 2023): the percentage
            (0, 100] of each question's encoder tokens kept after `keep_tokens_step`, the top
            ones by that step's cross-attention (None: all).
        keep_tokens_step: the decoding step (1 = the first token) whose cross-attention ranks
            the tokens; they are dropped from the next step on.
        keep_tokens_layer: the decoder layer whose cross-attention ranks the tokens (0-based,
            counting the layers that have cross-attention): the layers after it read only the
            kept tokens from that same step on (at step 1 they then project keys and values of
            the kept tokens only: most of the saving). None: the mean over layers, the tokens
            dropped from the next step on.
        keep_tokens_by_value_norm: weight each token's attention by its value vector's norm.
    """

    override_model_settings: bool = False
    keep_passages: int | None = None
    keep_passages_by: Literal["mean_logit", "attention_mass"] = "mean_logit"
    keep_tokens: float | None = None
    keep_tokens_step: int = 1
    keep_tokens_layer: int | None = None
    keep_tokens_by_value_norm: bool = False

    def __post_init__(self):
        super().__post_init__()
        check_range("keep_passages", self.keep_passages, low=1, allow_none=True)
        if self.keep_tokens is not None:
            check_finite("keep_tokens", self.keep_tokens)
            if not 0 < self.keep_tokens <= 100:
                raise ConfigError(
                    f"keep_tokens = {self.keep_tokens!r} is out of range: expected a percentage "
                    "in (0, 100]"
                )
        check_range("keep_tokens_step", self.keep_tokens_step, low=1)
        check_range("keep_tokens_layer", self.keep_tokens_layer, low=0, allow_none=True)
        if (
            self.keep_passages is not None
            and self.keep_tokens is not None
            and self.keep_tokens_layer is not None
            and self.keep_tokens_step == 1
        ):
            raise ConfigError(
                "keep_passages with keep_tokens_layer at keep_tokens_step 1 is not allowed: "
                "pruning ranks passages by every layer's first-step attention, which the cut "
                "after keep_tokens_layer would already have shortened (expected a later "
                "keep_tokens_step, or keep_tokens_layer: null)"
            )
        if self.accelerated and self.num_beams > 1:
            raise ConfigError(
                f"keep_passages / keep_tokens apply to greedy decoding: num_beams = "
                f"{self.num_beams} is not allowed with them (expected 1)"
            )

    @property
    def accelerated(self) -> bool:
        """Whether generation prunes passages or eliminates tokens."""
        return self.keep_passages is not None or self.keep_tokens is not None


# The teachers `fid score-passages` writes (ScorePassagesConfig.mode).
ScoreMode = Literal["mean_logit", "attention_mass", "pdist", "loop", "uniform"]
SCORE_MODES: tuple[str, ...] = typing.get_args(ScoreMode)


@dataclass(frozen=True)
class ScorePassagesConfig(ReaderInputConfig):
    """`fid score-passages`: re-score each read passage with the reader's cross-attention.

    Attributes:
        batch_size: questions per scoring batch.
        mode: "mean_logit" is the original FiD-KD score (first decoding step, pre-softmax
            cross-attention logits averaged over layers, heads and the passage's tokens);
            "attention_mass" is the softmax probability mass that falls on the passage,
            averaged over layers and heads (Atlas's family of distillation targets). "pdist":
            Atlas's perplexity distillation, log p(answer | question, passage) with each
            passage read alone (the answer: the record's `target`, else its first answer);
            train-retriever's `reader_temperature` is PDist's temperature. "loop": Atlas's
            leave-one-out perplexity distillation, how much log p(answer | question, all
            passages) drops when the passage is left out (its tokens masked from the
            decoder's cross-attention; the encoding is computed once); a question's only
            passage scores 0 (nothing is left without it). Both decode N inputs a question:
            costlier than the attention scores. "uniform": a control, not a teacher: every
            read passage scores 0, so the retriever's target is uniform over a question's
            candidates and carries no reader information (what a signal must beat).
        answer_log_likelihood: how pdist and loop total the answer's token log-probabilities:
            "sum" (the answer's log-likelihood, the default) or "mean" (per answer token,
            EOS included: Atlas's code). With "sum" a teacher's temperature acts as Atlas's
            times the answer's length, so a long answer gets a sharper teacher; Atlas's
            temperatures (0.01-0.1) are for "mean". Only pdist and loop read it.
        precision: fp32 by default, everywhere: the scores are the retriever's teacher, and
            the original computed them in fp32 (bf16 moves near-tied passages' order).
        override_model_settings: as in EvalReaderConfig.
    """

    batch_size: int = 8
    mode: ScoreMode = "mean_logit"
    answer_log_likelihood: Literal["sum", "mean"] = "sum"
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "fp32"
    override_model_settings: bool = False

    def __post_init__(self):
        super().__post_init__()
        check_range("batch_size", self.batch_size, low=1)
        if self.answer_log_likelihood != "sum" and self.mode not in ("pdist", "loop"):
            raise ConfigError(
                f"answer_log_likelihood = {self.answer_log_likelihood!r} with mode = "
                f"{self.mode!r}: only pdist and loop score the answer's likelihood. Hint: "
                "remove answer_log_likelihood, or set mode: pdist or loop"
            )


@dataclass(frozen=True)
class ReaderTrainConfig(TrainingConfig, GenerationConfig):
    """`fid train-reader`: the training loop, the reader inputs and the dev generation.

    Attributes:
        passage_max_tokens: as in ReaderInputConfig; recorded in the exported model folder.
        target_max_tokens: if set, every target is padded or truncated to exactly this many
            tokens (EOS included), so the decoder sees one shape; None pads to the batch's longest.
        activation_checkpointing: recompute activations in the backward pass (training only).
        dropout: overrides the model's dropout rate when set.
        eval_max_questions: evaluate on the first this-many dev questions (None = all).
        light_tokens: FiD-Light: fine-tune (and dev-evaluate) the reader reading only the first
            this-many encoder vectors of each passage (None: all, whatever the start model
            read); recorded in the exported model folder.
        cross_attention_every: FiDO's layer-sparse cross-attention: keep it in decoder layers
            0, K, 2K, ... only (1: every layer; at most the decoder's layer count). Removed
            layers cannot come back: from a model fine-tuned with K0, K must be a multiple of
            K0. Recorded in the exported folder, whose weights lack the removed sublayers.
    """

    renamed_keys: ClassVar[dict[str, str]] = {
        **GenerationConfig.renamed_keys,
        "answer_max_tokens": "target_max_tokens",
    }

    passage_max_tokens: int = 250
    target_max_tokens: int | None = None
    activation_checkpointing: bool = True
    dropout: float | None = None
    eval_max_questions: int | None = None
    cross_attention_every: int = 1

    def __post_init__(self):
        TrainingConfig.__post_init__(self)
        GenerationConfig.__post_init__(self)
        check_range("cross_attention_every", self.cross_attention_every, low=1)
        check_range("passage_max_tokens", self.passage_max_tokens, low=8)
        check_range("target_max_tokens", self.target_max_tokens, low=2, allow_none=True)
        check_range("dropout", self.dropout, low=0.0, high=1.0, allow_none=True)
        check_range("eval_max_questions", self.eval_max_questions, low=1, allow_none=True)
        if self.precision == "fp16" and self.sharding == "fsdp":
            raise ConfigError(
                "precision = 'fp16' with sharding = 'fsdp' is refused: the loss scaler unscales "
                "the sharded blocks' and the replicated embedding's gradients together, which "
                "torch's GradScaler cannot (mixed DTensor and Tensor). Hint: precision bf16 "
                "(or fp32) with fsdp, or fp16 with ddp"
            )


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
            check_range(name, getattr(self, name), low=1)
        check_range("vocab_size", self.vocab_size, low=100)
        check_range("num_decoder_layers", self.num_decoder_layers, low=1)
        check_range("dropout_rate", self.dropout_rate, low=0.0, high=1.0)
        check_range("relative_attention_num_buckets", self.relative_attention_num_buckets, low=2)
