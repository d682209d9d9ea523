"""What a training command's config means for its memory plan: its largest micro-batch and the
knobs of its step, as the command would run them on the device."""

from __future__ import annotations

from dataclasses import replace

import torch
from transformers import PretrainedConfig

from fid.config import ReaderTrainConfig, RetrieverTrainConfig
from fid.memory.model_shapes import model_config
from fid.memory.plan import PlanInputs
from fid.memory.traced_step import StepRun, StepShape
from fid.models.retriever_spec import DualEncoderSpec
from fid.runtime.precision import resolve_precision

PLANNED_COMMANDS = ("train-reader", "train-retriever")


def command_plan_inputs(
    command: str,
    cfg: ReaderTrainConfig | RetrieverTrainConfig,
    model: str | PretrainedConfig,
    world_size: int,
    device: str,
) -> PlanInputs:
    """The plan's inputs for `fid <command> --config ...` starting from `model` on `world_size`
    ranks of `device` ("cuda" or "cpu"). `model` is a name or folder (fid.memory.model_shapes),
    or the model's config itself: the workflow plans models that do not exist yet from the
    config that will build them."""
    shape_config = model if isinstance(model, PretrainedConfig) else model_config(model)
    precision = resolve_precision(cfg.precision, torch.device(device))  # as training resolves it
    autocast = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    run = StepRun(
        autocast_dtype=autocast,
        foreach=device == "cuda",  # AdamW's default there, with its multi-tensor temporaries
        gradients_held=cfg.gradient_accumulation_steps > 1,
        device=device,  # which SDPA kernel, and so which tensors it keeps
    )
    if command == "train-reader":
        attention = (
            cfg.attention if cfg.attention != "auto" else "sdpa" if device == "cuda" else "eager"
        )
        run = replace(
            run, checkpointing=cfg.activation_checkpointing, attention=attention,
            encoder_buckets=cfg.encoder_buckets, light_tokens=cfg.light_tokens,
            cross_attention_every=cfg.cross_attention_every,
        )  # fmt: skip
        answer_tokens = cfg.target_max_tokens or cfg.max_new_tokens
        shape = StepShape(
            _questions(cfg, cfg.n_passages * cfg.passage_max_tokens),
            cfg.n_passages,
            cfg.passage_max_tokens,
            answer_tokens,
        )
        return PlanInputs(command, shape_config, shape, run, world_size, cfg.sharding,
                          device)  # fmt: skip
    spec = DualEncoderSpec(
        pooling=cfg.pooling, projection_dim=cfg.projection_dim, shared=cfg.shared_encoder,
        normalize=cfg.normalize, project_tokens=cfg.project_tokens,
    )  # fmt: skip
    shape = StepShape(
        cfg.batch_size_per_device, cfg.n_passages, cfg.passage_max_tokens, cfg.question_max_tokens
    )
    return PlanInputs(command, shape_config, shape, run, world_size, cfg.sharding, device, spec)


def effective_tokens(inputs: PlanInputs, cfg) -> int:
    """Passage tokens one rank feeds an optimizer step (what a new budget must keep)."""
    shape = inputs.shape
    return shape.questions * shape.passages * shape.passage_tokens * cfg.gradient_accumulation_steps


def _questions(cfg: ReaderTrainConfig, tokens_per_question: int) -> int:
    """Questions in the largest micro-batch: the batch size, or what the token budget holds
    of full-size questions (one at least: a longer question forms its own batch); "auto"
    chooses at most the batch size (fid.memory.auto_budget), planned here at the batch size."""
    if cfg.max_tokens_per_batch in (None, "auto"):
        return cfg.batch_size_per_device
    return max(1, cfg.max_tokens_per_batch // tokens_per_question)
