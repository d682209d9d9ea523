"""The training stages' memory plans as the workflow uses them (rules/memory.smk): each stage's
plan (`fid plan-memory`'s, fid.memory), cached on disk; the check of a stage against the memory
its jobs will have; a job's host memory request; and the plan of a trained model for the
report's predicted against measured table (report_memory.py).

Nothing here imports torch until a plan must be computed, and a plan is computed once per
(stage knobs, model shape, ranks, device, fid and torch versions): the workflow loads as fast
with the check as without it once its plans are cached. (A plan traces a step on fake tensors:
~1 s for the demo's tiny models, 17 s for t5-base at 100 passages, 34 s for t5-large, on a
busy 2-core machine; importing torch and transformers alone takes ~4 s.)
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
import math
import os
import warnings
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from fid.config import ReaderTrainConfig, RetrieverTrainConfig, config_from_dict
from fid.memory.sizes import format_bytes as mib

# What a training process holds on the host beyond its planned step: the interpreter, torch and
# transformers, the tokenizer, the dev evaluation. A tiny reader's rank peaks at ~0.45 GB
# resident with a plan of a few MiB (tests/workflow/config.yaml, measured); a CUDA process adds
# the context and the CUDA libraries' host memory (assumed 4 GiB: not yet measured on a GPU).
PROCESS_BYTES = {"cpu": 1 << 30, "cuda": 4 << 30}
# The parsed training and dev lists: 1.5-1.8 times their files (the demo's FiD json, measured
# through fid.data.examples.load_examples); the rest is room for larger files' Python objects.
DATA_FACTOR = 3
# A GPU rank's weights and AdamW's two moments, fp32, on the host at once (a resumed run loads
# its checkpoint there first): 3 x the weights' bytes, unsharded.
HOST_STATE_COPIES = 3
MEM_FLOOR_MB = 1000
_ALLOWANCES = ("allocator allowance", "CUDA runtime allowance")


class PlanUnavailable(Exception):
    """The model's shape cannot be read without the network (an unknown hub name, a folder that
    is not there): the stage is not planned."""


@dataclass(frozen=True)
class TrainingJob:
    """A training stage as its jobs run it.

    Attributes:
        rule: train_reader or train_retriever.
        stage: the config section whose YAML the job reads (reader, reader_later, ...).
        knobs: that section as the config gives it (dataclass defaults fill the rest).
        model: where the chain's shape comes from: {"init": "reader", "knobs": {...}} (built by
            the workflow from init_reader), {"package": module} or {"name": hub name or folder};
            every round of a chain has the shape of its start.
        model_arg: what `--init-model` / `fid plan-memory --model` is given for it.
        world: ranks of the job; ranks_per_node: those that share one host.
        device: "cuda" or "cpu".
        stage_file: the section's YAML as the job reads it (for the error's hint).
    """

    rule: str
    stage: str
    knobs: dict
    model: dict
    model_arg: str
    world: int
    ranks_per_node: int
    device: str
    stage_file: str = "<the stage's config file>"

    @property
    def command(self) -> str:
        return "train-reader" if self.rule == "train_reader" else "train-retriever"

    def config(self) -> ReaderTrainConfig | RetrieverTrainConfig:
        cls = ReaderTrainConfig if self.rule == "train_reader" else RetrieverTrainConfig
        return config_from_dict(self.knobs, cls, source=f"config section '{self.stage}'")


# ---------------------------------------------------------------- plans, cached
def plan(job: TrainingJob, questions: int | None = None) -> dict:
    """The plan of one step per rank of `job` (at `questions` per micro-batch instead of the
    config's largest): {"peak", "components" (bytes by name, summing to peak), "summary"
    (`fid plan-memory`'s text without a verdict)}."""
    return _cached("plan", job, questions, lambda: _compute_plan(job, questions))


def weights(job: TrainingJob) -> int:
    """fp32 bytes of the job's trained parameters, unsharded (no trace: cheap)."""
    return _cached("weights", job, None, lambda: {"bytes": _compute_weights(job)})["bytes"]


def width(model: dict) -> int:
    """The hidden size of a model given as TrainingJob.model is (an encoder's embedding width
    unless it projects)."""
    material = {"kind": "width", "model": _model_material(model), "planner": _planner_fingerprint()}
    return _stored(material, lambda: {"width": _compute_width(model)})["width"]


def cache_dir() -> Path:
    """Where plans are kept: one JSON file per key, shared by every run and working folder of
    this user (a plan depends only on what its key holds)."""
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "fid" / "memory-plans"


_MEMO: dict[str, dict] = {}


def _cached(kind: str, job: TrainingJob, questions: int | None, compute) -> dict:
    material = {
        "kind": kind, "command": job.command, "knobs": dataclasses.asdict(job.config()),
        "questions": questions, "model": _model_material(job.model), "world": job.world,
        "device": job.device, "planner": _planner_fingerprint(),
    }  # fmt: skip
    if kind == "weights":  # the step's knobs do not matter, but for the retriever's build
        material["knobs"] = {k: v for k, v in material["knobs"].items() if k == "shared_encoder"}
        material.pop("world")
    return _stored(material, compute)


def _stored(material: dict, compute) -> dict:
    """compute(), kept in memory and on disk under the digest of `material`."""
    key = hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()
    if key in _MEMO:
        return _MEMO[key]
    path = cache_dir() / f"{key}.json"
    try:
        _MEMO[key] = json.loads(path.read_text())
        return _MEMO[key]
    except (OSError, ValueError):
        pass
    entry = compute()
    try:  # one file per key, replaced whole: concurrent workflows may write the same one
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(entry))
        os.replace(tmp, path)
    except OSError:  # a read-only home: planned again next time
        pass
    _MEMO[key] = entry
    return entry


@cache
def _planner_fingerprint() -> str:
    """The fid sources and the torch and transformers versions: what a plan is computed by."""
    root = Path(importlib.util.find_spec("fid").origin).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    for name in ("torch", "transformers"):
        digest.update(importlib.metadata.version(name).encode())
    return digest.hexdigest()


def _model_material(model: dict) -> dict:
    """What the shape of `model` depends on: the init section's knobs; a folder's config.json."""
    if "init" in model:
        return {"init": model["init"], "knobs": model["knobs"]}
    if "name" in model and (Path(model["name"]) / "config.json").is_file():
        return {"folder": (Path(model["name"]) / "config.json").read_text()}
    return model


def _model_config(model: dict):
    """The model's transformers config, read or built without weights."""
    import torch

    from fid.errors import ConfigError
    from fid.memory.model_shapes import model_config

    if "init" in model:
        from fid.config import InitReaderConfig, InitRetrieverConfig
        from fid.demo.tiny_models import build_tiny_bert, build_tiny_t5

        kind = model["init"]
        cls, build = {"reader": (InitReaderConfig, build_tiny_t5),
                      "retriever": (InitRetrieverConfig, build_tiny_bert)}[kind]  # fmt: skip
        cfg = config_from_dict(model["knobs"], cls, source=f"config section 'init_{kind}'")
        with torch.device("meta"):  # the tokenizer's vocabulary is at most vocab_size
            return build(cfg, vocab_size=cfg.vocab_size).config
    try:
        if "package" in model:
            from fid.models.packaged import packaged_model_path

            return model_config(str(packaged_model_path(model["package"])))
        return model_config(model["name"])
    except (ConfigError, OSError) as error:
        raise PlanUnavailable(str(error)) from None


def _inputs(job: TrainingJob, questions: int | None = None):
    from dataclasses import replace

    from fid.memory.command_plans import command_plan_inputs

    inputs = command_plan_inputs(
        job.command, job.config(), _model_config(job.model), job.world, job.device
    )
    if questions is not None:
        inputs = replace(inputs, shape=replace(inputs.shape, questions=questions))
    return inputs


def _compute_plan(job: TrainingJob, questions: int | None) -> dict:
    from fid.memory.plan import plan_step, plan_summary

    with warnings.catch_warnings():  # transformers' deprecations, on the workflow's console
        warnings.simplefilter("ignore", FutureWarning)
        step = plan_step(_inputs(job, questions))
    summary = plan_summary(step, job.model_arg, job.config(), None, None)
    return {"peak": step.peak, "components": step.components, "summary": summary}


def _compute_width(model: dict) -> int:
    return int(_model_config(model).hidden_size)  # T5's d_model too


def _compute_weights(job: TrainingJob) -> int:
    from fid.memory.plan import model_bytes

    return model_bytes(_inputs(job))


# ---------------------------------------------------------------- the check and the request
def splits_on_oom(job: TrainingJob) -> bool:
    """Whether a step out of memory is split and redone (docs/memory.md "Out of memory in a
    step"): on CUDA only (a CPU process out of memory is killed by the kernel), not FSDP over
    several ranks (the others wait inside its collective), and not the retriever's in-batch
    negatives, which are part of its loss."""
    cfg = job.config()
    if job.device != "cuda" or (cfg.sharding == "fsdp" and job.world > 1):
        return False
    return job.rule == "train_reader" or not cfg.in_batch_negatives


def check(job: TrainingJob, gpu_memory: int | None, host_memory: int) -> tuple[str, str]:
    """(error, warning) of `job` against the memory its ranks will have, "" when none: on CUDA
    each rank's GPU (`gpu_memory`; None: not checked), on a CPU the host's memory less what
    the processes hold beyond their step, shared by the job's ranks on it.

    A reader whose `max_tokens_per_batch` is `auto` needs one question to fit (it chooses its
    micro-batch at its first start); a job that splits a step out of memory needs one question
    to fit and is warned when its configured micro-batch does not.
    """
    if job.device == "cuda":
        if gpu_memory is None:
            return "", ""
        memory, where = gpu_memory, f"gpu_memory = {mib(gpu_memory)} (each rank's GPU)"
    else:
        memory = host_memory // job.ranks_per_node - PROCESS_BYTES["cpu"]
        where = (
            f"this machine's memory, {mib(host_memory)}, for {job.ranks_per_node} rank(s) "
            f"less {mib(PROCESS_BYTES['cpu'])} each beyond the step"
        )
    auto = job.rule == "train_reader" and job.config().max_tokens_per_batch == "auto"
    planned = plan(job, questions=1) if auto else plan(job)
    if planned["peak"] <= memory:
        return "", ""
    least = "one question per micro-batch" if auto else "its micro-batch"
    if splits_on_oom(job) and not auto:
        one = plan(job, questions=1)
        if one["peak"] <= memory:
            return "", (
                f"{job.rule}, config section '{job.stage}': its micro-batch needs "
                f"{mib(planned['peak'])} per rank, more than {where}: its first step will run "
                f"out of memory and be redone in smaller micro-batches (one question needs "
                f"{mib(one['peak'])}). Hint: {_smaller(job)} in '{job.stage}' fits from the start"
            )
        planned, least = one, "one question per micro-batch (the least a step splits into)"
    return (
        f"{job.rule}, config section '{job.stage}': the predicted peak per rank at {least}, "
        f"{mib(planned['peak'])}, does not fit {where}; nothing was run.\n\n"
        f"{planned['summary']}\n\nHint: lower the step's memory in section '{job.stage}' "
        f"({_smaller(job)}; fewer n_passages or passage_max_tokens; sharding: fsdp over more "
        f"ranks) or give it more; `fid plan-memory --for {job.command} --config "
        f"{job.stage_file} --model {job.model_arg} --world-size {job.world} --device "
        f"{job.device}{f' --gpu-memory {memory}' if job.device == 'cuda' else ''}` says which of "
        f"these fit{_written(job)}", ""
    )  # fmt: skip


def _smaller(job: TrainingJob) -> str:
    if job.rule == "train_reader":
        return "activation_checkpointing: true; max_tokens_per_batch: auto"
    return "a smaller batch_size_per_device"  # the retriever refuses auto: its negatives


def _written(job: TrainingJob) -> str:
    if job.device != "cuda":  # the host's check has no switch: write the section by hand
        return f" (that file holds config section '{job.stage}')"
    return f" (`snakemake --config gpu_memory= {job.stage_file}` writes that file unchecked)"


def host_mem_mb(job: TrainingJob, data_bytes: int) -> int:
    """The host memory (MiB, the unit of sbatch --mem) of one of `job`'s nodes: per rank, the
    process beyond its step, its parsed lists (`data_bytes`: the training and dev files), and
    on a CPU the planned step, on CUDA the weights and AdamW's moments on the host."""
    per_rank = PROCESS_BYTES[job.device] + DATA_FACTOR * data_bytes
    if job.device == "cpu":
        per_rank += plan(job)["peak"]
    else:
        per_rank += HOST_STATE_COPIES * weights(job)
    return max(MEM_FLOOR_MB, math.ceil(job.ranks_per_node * per_rank / 2**20))


# ---------------------------------------------------------------- the report
def comparable_peak(job: TrainingJob, planned: dict) -> int:
    """The part of a plan that the training log's peak measures (fid.runtime.logs.PeakMemory):
    on CUDA torch's max_memory_allocated, the tensors without the plan's allowances for the
    CUDA context and the allocator; on a CPU the process's resident peak, all of the plan (and
    the process's own memory, which the plan leaves out)."""
    if job.device != "cuda":
        return planned["peak"]
    return planned["peak"] - sum(planned["components"].get(name, 0) for name in _ALLOWANCES)
