"""The training loop's knobs, shared by every trained model (`fid train-reader`, `fid
train-retriever`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fid.config.loading import ConfigError, check_range


@dataclass(frozen=True)
class TrainingConfig:
    """The training-loop knobs shared by every trained model (reader now, retriever later).

    Attributes:
        seed: seeds weights-independent randomness: data order, answer sampling, dropout.
        max_steps: optimizer steps in total.
        batch_size_per_device: questions per micro-batch (ignored when `max_tokens_per_batch`).
        max_tokens_per_batch: if set, micro-batches are groups of questions holding at most this
            many passage tokens (token-budget batching); a longer question forms its own batch.
            "auto" (the reader): the largest budget of at most `batch_size_per_device` full-size
            questions that the memory plan says fits the device's free memory at the run's
            first start, with `gradient_accumulation_steps` raised so that a step still holds
            the config's questions (fid.memory.auto_budget); recorded in the state folder, so
            every later start of the run uses the same.
        gradient_accumulation_steps: micro-batches per optimizer step.
        lr: peak learning rate.
        weight_decay: AdamW decoupled weight decay (not applied to biases and norms, unless
            `decay_biases_and_norms`).
        decay_biases_and_norms: decay every parameter, as the original's AdamW did (one
            parameter group); off by default, because decaying LayerNorm scales and biases
            towards 0 hurts.
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
        fsdp_gradient_sync: with "fsdp" and gradient accumulation, when gradients are
            reduce-scattered: "every_micro_batch" (the default) after each micro-batch's
            backward, so that a rank holds only its gradient shard between micro-batches (what
            the memory plan counts); "last_micro_batch" once a step, after the last one, so
            that every rank holds the UNSHARDED gradients of its units between micro-batches
            (fewer collectives, the memory of a whole model's gradients: the plan counts them).
        max_skipped_steps_in_a_row: optimizer steps in a row that make no update (a loss that is
            not finite, skipped in bf16 and fp32; an fp16 overflow, skipped by the loss scaler)
            before the run stops with an error naming its last good checkpoint (a skipped step
            still counts: its data is used up and the schedule advances; metrics.jsonl counts
            them as `skipped_steps`).
        deterministic: deterministic kernels only (`torch.use_deterministic_algorithms`, and
            cuBLAS's fixed workspace): on a GPU, an interrupted run then resumes bitwise equal
            to an uninterrupted one (CUDA's atomic adds, e.g. in the embedding's backward,
            otherwise sum in varying order). A little slower; CPU runs are deterministic
            without it.
    """

    seed: int = 0
    max_steps: int = 15000
    batch_size_per_device: int = 1
    max_tokens_per_batch: int | Literal["auto"] | None = None
    gradient_accumulation_steps: int = 1
    lr: float = 1e-4
    weight_decay: float = 0.01
    decay_biases_and_norms: bool = False
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
    fsdp_gradient_sync: Literal["every_micro_batch", "last_micro_batch"] = "every_micro_batch"
    max_skipped_steps_in_a_row: int = 25
    deterministic: bool = False

    def __post_init__(self):
        check_range("max_steps", self.max_steps, low=1)
        check_range("batch_size_per_device", self.batch_size_per_device, low=1)
        if self.max_tokens_per_batch != "auto":
            check_range("max_tokens_per_batch", self.max_tokens_per_batch, low=1, allow_none=True)
        check_range("gradient_accumulation_steps", self.gradient_accumulation_steps, low=1)
        check_range("lr", self.lr, low=0.0, high=1.0, what="0 < lr <= 1")
        if self.lr == 0:
            raise ConfigError("lr = 0 is out of range: expected 0 < lr <= 1")
        check_range("weight_decay", self.weight_decay, low=0.0)
        check_range("warmup_steps", self.warmup_steps, low=0)
        check_range("min_lr_ratio", self.min_lr_ratio, low=0.0, high=1.0)
        check_range("clip_grad_norm", self.clip_grad_norm, low=0.0, allow_none=True)
        check_range("eval_every_steps", self.eval_every_steps, low=0)
        check_range("save_every_steps", self.save_every_steps, low=0)
        check_range("save_every_minutes", self.save_every_minutes, low=0.0, allow_none=True)
        check_range("keep_last_checkpoints", self.keep_last_checkpoints, low=1)
        check_range("log_every_steps", self.log_every_steps, low=1)
        check_range("max_skipped_steps_in_a_row", self.max_skipped_steps_in_a_row, low=1)
