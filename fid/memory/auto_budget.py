"""`max_tokens_per_batch: auto`: the reader's token budget chosen from the memory plan and the
memory this rank has, once per run.

The budget is the largest of at most `batch_size_per_device` full-size questions (N passages x
L tokens each) whose planned peak fits USABLE_SHARE of the memory free at the run's first start
(CUDA: the device's free memory; CPU: the host's available memory; either shared by the ranks
that run on it). `gradient_accumulation_steps` is multiplied by the micro-batches the config's
batch now takes, so an optimizer step holds the config's questions whatever the device: "auto"
changes how a step is computed, not what it computes (with token-weighted accumulation the
gradient is that of the step's union, fid.training.accumulation).

The choice is written to the run's state folder (token_budget.json) and read back by every later
start: a requeued or resumed run on a device with other free memory keeps its micro-batches, so
resume stays bitwise. FID_AVAILABLE_MEMORY (bytes, or a size like "40GiB") replaces the measured
free memory: for a job that shares its device with another, and for tests.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from pathlib import Path

import psutil
import torch

from fid.config import ConfigError, ReaderTrainConfig
from fid.memory.command_plans import command_plan_inputs
from fid.memory.plan import (
    MemoryDoesNotFit,
    fit_memory,
    format_bytes,
    parse_size,
    plan_step,
    plan_summary,
)
from fid.runtime import distributed
from fid.runtime.fileio import atomic_write_json

logger = logging.getLogger(__name__)

BUDGET_FILE = "token_budget.json"
# The plan's share of the free memory: its error is within 15% on a CPU (benchmarks/
# memory/memory_plan.py), and the allocator's fragmentation and the data pipeline come on top.
USABLE_SHARE = 0.85
MEMORY_ENV = "FID_AVAILABLE_MEMORY"


def resolve_token_budget(
    cfg: ReaderTrainConfig, model: str, state_dir: Path, device: torch.device
) -> ReaderTrainConfig:
    """`cfg` with `max_tokens_per_batch: auto` replaced by the run's budget (and accumulation);
    any other config is returned as it is.

    Raises:
        MemoryDoesNotFit: not even one question fits; the message holds the plan's table and
            what would make it fit.
    """
    if cfg.max_tokens_per_batch != "auto":
        return cfg
    record = Path(state_dir) / BUDGET_FILE
    if record.is_file():
        chosen = _read_record(record)
        logger.info(
            "max_tokens_per_batch: auto -> %d, gradient_accumulation_steps %d (as chosen at the "
            "run's first start, %s)", chosen["max_tokens_per_batch"],
            chosen["gradient_accumulation_steps"], record,
        )  # fmt: skip
    else:
        chosen = _choose(cfg, model, device)
        if distributed.is_main():
            atomic_write_json(record, chosen)
        distributed.barrier()
    return dataclasses.replace(
        cfg,
        max_tokens_per_batch=chosen["max_tokens_per_batch"],
        gradient_accumulation_steps=chosen["gradient_accumulation_steps"],
    )


def available_memory(device: torch.device) -> tuple[int, str]:
    """Bytes this rank may plan for, and where the figure comes from (for the log)."""
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("SLURM_NTASKS_PER_NODE",
                                                                       "1")))  # fmt: skip
    if os.environ.get(MEMORY_ENV):
        return parse_size(os.environ[MEMORY_ENV], MEMORY_ENV), f"{MEMORY_ENV}"
    if device.type == "cuda":
        # One rank a GPU (distributed.setup refuses two on one): each rank has its GPU's free
        # memory to itself, however many GPUs it sees (one with --gpus-per-task=1).
        free, _ = torch.cuda.mem_get_info(device)
        return free, f"free on {device}"
    available = psutil.virtual_memory().available
    return available // max(1, ranks_here), "available RAM" + (
        f" / {ranks_here} ranks" if ranks_here > 1 else ""
    )


def _choose(cfg: ReaderTrainConfig, model: str, device: torch.device) -> dict[str, int]:
    memory, source = available_memory(device)
    # every rank plans for the least memory any rank has: the ranks' micro-batches must agree
    memory = min(distributed.all_gather_objects(memory))
    usable = int(memory * USABLE_SHARE)
    _, world_size = distributed.world()
    full = dataclasses.replace(cfg, max_tokens_per_batch=None)  # batch_size_per_device questions
    inputs = command_plan_inputs("train-reader", full, model, world_size, device.type)
    questions = cfg.batch_size_per_device
    plan = plan_step(inputs)
    if plan.peak > usable:
        fit = fit_memory(inputs, usable, 0)
        if fit.questions == 0:
            raise MemoryDoesNotFit(
                f"max_tokens_per_batch = 'auto': not even one question of {cfg.n_passages} x "
                f"{cfg.passage_max_tokens} tokens fits {format_bytes(usable)} "
                f"({USABLE_SHARE:.0%} of {format_bytes(memory)}, {source}):\n"
                + plan_summary(fit.plan, model, cfg, usable, fit)
            )
        questions, plan = fit.questions, fit.plan
    tokens_per_question = cfg.n_passages * cfg.passage_max_tokens
    micro_batches = math.ceil(cfg.batch_size_per_device / questions)
    chosen = {
        "max_tokens_per_batch": questions * tokens_per_question,
        "gradient_accumulation_steps": cfg.gradient_accumulation_steps * micro_batches,
        "questions_per_micro_batch": questions,
        "planned_peak_bytes": plan.peak,
        "usable_bytes": usable,
        "memory_bytes": memory,
        "memory_source": source,
    }
    logger.info(
        "max_tokens_per_batch: auto -> %d (%d question(s) of %d x %d tokens; planned peak %s of "
        "%s usable = %.0f%% of %s, %s), gradient_accumulation_steps %d -> %d",
        chosen["max_tokens_per_batch"], questions, cfg.n_passages, cfg.passage_max_tokens,
        format_bytes(plan.peak), format_bytes(usable), 100 * USABLE_SHARE,
        format_bytes(memory), source, cfg.gradient_accumulation_steps,
        chosen["gradient_accumulation_steps"],
    )  # fmt: skip
    return chosen


def _read_record(path: Path) -> dict[str, int]:
    try:
        record = json.loads(path.read_text())
        budget = int(record["max_tokens_per_batch"])
        accumulation = int(record["gradient_accumulation_steps"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(
            f"{path}: does not hold the run's token budget ({error}); expected the JSON "
            "{max_tokens_per_batch, gradient_accumulation_steps} written at its first start: "
            "delete it to choose again (the run's checkpoints then refuse another budget)"
        ) from None
    if budget < 1 or accumulation < 1:
        raise ConfigError(f"{path}: budget {budget}, accumulation {accumulation}: expected >= 1")
    return {"max_tokens_per_batch": budget, "gradient_accumulation_steps": accumulation}
