"""The `fid plan-memory` and `fid plan-disk` handlers: what a command will hold in memory per
rank, and what it will write to disk, from its config and inputs, before it runs (the formulas
of fid.memory, which the workflow's plans use too). Imports are local, as in fid.cli.commands.
"""

from __future__ import annotations

from pathlib import Path

from fid.cli.commands import _load_config

# What each command of `fid plan-disk` needs beside --config: flag -> what it is.
_DISK_NEEDS = {
    "train-reader": ("model",), "train-retriever": ("model",),
    "embed-passages": ("model", "passages"), "build-index": ("model", "passages"),
    "build-bm25": ("passages",), "retrieve": ("passages", "questions"),
    "retrieve-bm25": ("passages", "questions"), "score-passages": ("lists",),
}  # fmt: skip


def plan_disk(args) -> None:
    from fid.config import (
        BM25Config,
        ConfigError,
        EmbedPassagesConfig,
        IndexConfig,
        ReaderTrainConfig,
        RetrieveConfig,
        RetrieverTrainConfig,
        ScorePassagesConfig,
    )
    from fid.errors import InputError
    from fid.memory.disk_sizes import command_rows, model_width
    from fid.retrieval.residual_layout import code_bytes
    from fid.runtime.disk_plan import file_systems, format_plan, short

    missing = [f"--{n}" for n in _DISK_NEEDS[args.planned] if getattr(args, n) is None]
    if missing:
        raise ConfigError(f"fid plan-disk --for {args.planned} needs {' and '.join(missing)}")
    for path in [args.passages, args.lists, *(args.questions or [])]:
        if path is not None and not Path(path).is_file():
            raise InputError(f"{path}: no such file")
    config_class = {
        "train-reader": ReaderTrainConfig, "train-retriever": RetrieverTrainConfig,
        "embed-passages": EmbedPassagesConfig, "build-index": IndexConfig,
        "build-bm25": BM25Config, "retrieve": RetrieveConfig, "retrieve-bm25": BM25Config,
        "score-passages": ScorePassagesConfig,
    }[args.planned]  # fmt: skip
    cfg = _load_config(args, config_class)
    refine, text = 0, None
    if args.planned == "build-bm25":
        from fid.memory.disk_sizes import TextStats
        from fid.retrieval.bm25 import text_statistics

        text = TextStats(**text_statistics(args.passages, cfg))
    if args.planned == "build-index" and cfg.refine_residual:
        refine = code_bytes(cfg.refine_residual, model_width(args.model))
    rows = command_rows(args.planned, cfg, args.where, model=args.model, passages=args.passages,
                        questions=args.questions, lists=args.lists,
                        compact=args.list_format == "compact", refine_bytes=refine,
                        **({"text": text} if text else {}))  # fmt: skip
    systems = file_systems(rows, resumed=False)  # --where may hold other files
    print(format_plan(rows, systems))
    if short(systems):
        raise InputError(f"fid {args.planned}: does not fit on disk at {args.where} (above)")


def plan_memory(args) -> None:
    from fid.config import (
        ConfigError,
        EmbedPassagesConfig,
        EvalReaderConfig,
        ReaderTrainConfig,
        RetrieverTrainConfig,
        ScorePassagesConfig,
    )
    from fid.memory.command_plans import (
        command_plan_inputs,
        effective_tokens,
        inference_plan_inputs,
    )
    from fid.memory.inference_plan import fit_inference, inference_summary, plan_inference
    from fid.memory.plan import MemoryDoesNotFit, fit_memory, parse_size, plan_step, plan_summary

    if args.world_size < 1:
        raise ConfigError(f"--world-size = {args.world_size} is out of range: expected >= 1")
    if args.answer_tokens < 1:
        raise ConfigError(f"--answer-tokens = {args.answer_tokens} is out of range: expected >= 1")
    memory = None if args.gpu_memory is None else parse_size(args.gpu_memory)
    config_class = {
        "train-reader": ReaderTrainConfig, "train-retriever": RetrieverTrainConfig,
        "eval-reader": EvalReaderConfig, "score-passages": ScorePassagesConfig,
        "embed-passages": EmbedPassagesConfig,
    }[args.planned]  # fmt: skip
    cfg = _load_config(args, config_class)
    if args.planned.startswith("train-"):
        inputs = command_plan_inputs(args.planned, cfg, args.model, args.world_size,
                                     args.plan_device)  # fmt: skip
        plan = plan_step(inputs)
        fit = None if memory is None else fit_memory(inputs, memory, effective_tokens(inputs, cfg))
        print(plan_summary(plan, args.model, cfg, memory, fit))
    else:  # one rank's batch: inference commands shard their data, not their model
        inputs = inference_plan_inputs(args.planned, cfg, args.model, args.plan_device,
                                       args.answer_tokens)  # fmt: skip
        plan = plan_inference(inputs)
        fit = None if memory is None else fit_inference(inputs, memory)
        batch_key = "eval_batch_size" if args.planned == "eval-reader" else "batch_size"
        print(inference_summary(plan, args.model, memory, fit, batch_key))
    if memory is not None and plan.peak > memory:
        where = args.config or f"the default {config_class.__name__}"
        raise MemoryDoesNotFit(f"{where}: does not fit in {args.gpu_memory} (above)")
