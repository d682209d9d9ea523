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
_AUTOCAST = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}  # by precision


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
    kind = "t5" if command == "train-reader" else "encoder"
    shape_config = model if isinstance(model, PretrainedConfig) else model_config(model, kind)
    precision = resolve_precision(cfg.precision, torch.device(device))  # as training resolves it
    run = StepRun(
        autocast_dtype=_AUTOCAST[precision],
        foreach=device == "cuda",  # AdamW's default there, with its multi-tensor temporaries
        gradients_held=cfg.gradient_accumulation_steps > 1,
        unsharded_gradients_held=cfg.gradient_accumulation_steps > 1
        and cfg.fsdp_gradient_sync == "last_micro_batch",
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


def inference_plan_inputs(command: str, cfg, model: str, device: str, answer_tokens: int):
    """The plan's inputs for `fid <command> --config ...` reading `model` on `device`: an
    eval-reader, score-passages or embed-passages config; the passage length and FiD-Light's
    tokens as the command resolves them (the model folder's record, else the config's, else the
    default: fid.models.settings). `answer_tokens`: an answer's tokens for pdist / loop."""
    from pathlib import Path

    from fid.memory.inference_plan import InferenceInputs
    from fid.models.loading import DEFAULT_PASSAGE_MAX_TOKENS as RETRIEVER_PASSAGE_MAX_TOKENS
    from fid.models.retriever_spec import CONFIG_FILE
    from fid.models.settings import READER_PASSAGE_MAX_TOKENS, ReaderSettings, resolve_setting
    from fid.text_files import read_json

    folder = Path(model)
    if command == "embed-passages":
        spec = DualEncoderSpec()
        if (folder / CONFIG_FILE).is_file():  # a trained retriever: its spec, its encoders
            spec = DualEncoderSpec(**read_json(folder / CONFIG_FILE, "the dual encoder's spec"))
            model = str(
                folder / "passage_encoder" if not spec.shared else folder / "question_encoder"
            )
        length = resolve_setting("passage_max_tokens", spec.passage_max_tokens,
                                 cfg.passage_max_tokens, model=folder,
                                 override=cfg.override_model_settings,
                                 default=RETRIEVER_PASSAGE_MAX_TOKENS)  # fmt: skip
        config = model_config(model, "encoder")
        precision = resolve_precision(cfg.precision, torch.device(device), config.hidden_size)
        return InferenceInputs(command, config, cfg.batch_size, 1, length, mode="embed",
                               autocast_dtype=_AUTOCAST[precision], device=device,
                               spec=spec)  # fmt: skip
    settings = ReaderSettings.load(folder) if folder.is_dir() else ReaderSettings()
    length, light_tokens = (
        resolve_setting(name, recorded, configured, model=folder,
                        override=cfg.override_model_settings, default=default)
        for name, recorded, configured, default in (
            ("passage_max_tokens", settings.passage_max_tokens, cfg.passage_max_tokens,
             READER_PASSAGE_MAX_TOKENS),
            ("light_tokens", settings.light_tokens, cfg.light_tokens, None),
        )
    )  # fmt: skip
    config = model_config(model, "t5")
    generation = command == "eval-reader"
    width = config.d_model if generation else None  # scores: fp32 "auto" on a CPU, as run
    precision = resolve_precision(cfg.precision, torch.device(device), width)
    attention = (
        cfg.attention if cfg.attention != "auto" else "sdpa" if device == "cuda" else "eager"
    )
    return InferenceInputs(
        command, config,
        batch=cfg.eval_batch_size if generation else cfg.batch_size,
        passages=cfg.n_passages, passage_tokens=length,
        answer_tokens=cfg.max_new_tokens if generation else answer_tokens,
        mode="generate" if generation else cfg.mode,
        num_beams=cfg.num_beams if generation else 1,
        attention=attention, autocast_dtype=_AUTOCAST[precision], device=device,
        encoder_buckets=cfg.encoder_buckets, light_tokens=light_tokens,
    )  # fmt: skip
