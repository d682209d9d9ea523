"""A training command's memory per rank, predicted from its config and the model's shape, and
the largest token budget that fits a device (`fid plan-memory`).

The step's tensors come from a fake-tensor run of it (fid.memory.traced_step). What the trace
cannot see is added as stated allowances: on a GPU the CUDA context and library workspaces
(CUDA_RUNTIME_BYTES) and the caching allocator's rounding and fragmentation
(ALLOCATOR_FRACTION of the tensors' peak; both to be measured on a GPU: benchmarks/
gpu/gpu_check.py); on a CPU what a training step adds beyond its tensors (CPU_RUNTIME_BYTES: 12-18
MiB measured at the tiny shapes). On a CPU the plan is what the step adds to the process
(the interpreter and torch's libraries are there before any model, ~0.4 GB); fid
fixes glibc's mmap threshold (fid.runtime.heap) so that freed activations go back to the
system instead of lingering in a fragmented heap, which made the resident size up to 1.6x the
tensors' (benchmarks/memory/memory_plan.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TypeVar

import torch
from transformers import PretrainedConfig

from fid.errors import ConfigError
from fid.memory.sizes import format_bytes, parse_size  # noqa: F401 (also from here)
from fid.memory.traced_step import (
    StepRun,
    StepShape,
    StepTrace,
    trace_reader_step,
    trace_retriever_step,
)
from fid.models.retriever_spec import DualEncoderSpec

# What a CPU step's process holds beyond its tensors: the resident peak above the process
# before the model, less the real step's tensor peak (the plan's tracker on real tensors), was
# 12-18 MiB in the five tiny reader cases of benchmarks/memory/memory_plan.py (torch 2.13, glibc 2.36,
# one thread). ~7 MiB of it is torch's kernel code paged in by the first real step (RssFile:
# the trace runs no kernel); the rest, 5-11 MiB, is anonymous: glibc's heap, which serves the
# blocks under the 256 KiB mmap threshold (fid.runtime.heap) and keeps freed ones resident
# between uses (fragmented), autograd's graph, Python's objects
CPU_RUNTIME_BYTES = 16 << 20
REPLICA_BUCKET_BYTES = 25 * 2**20  # fid.training.replicas' bucket (DDP's default size)
CUDA_RUNTIME_BYTES = 1 << 30  # CUDA context, NCCL's buffers: ~0.5-1 GiB measured
# torch's cuBLAS workspace is a caching-allocator tensor per (handle, stream): a training step
# has one for the forward's thread and one for autograd's device thread, inference one; 32 MiB
# each on Hopper (4-8 MiB on older GPUs: planned at the larger). Measured on an H200: a
# checkpointed step's tensors plus these came within 6% of max_memory_allocated
# (benchmarks/memory/memory_plan.py --device cuda)
CUBLAS_WORKSPACE_BYTES = 32 * 2**20
ALLOCATOR_FRACTION = 0.05  # the caching allocator's block rounding and fragmentation
FSDP_GATHERED_BLOCKS = 2  # FSDP2 holds the running block and prefetches the next one


@dataclass(frozen=True)
class PlanInputs:
    """What decides a step's memory.

    Attributes:
        command: "train-reader" or "train-retriever".
        config: the model's config (fid.memory.model_shapes).
        shape: one micro-batch at its largest.
        run: the step's knobs (checkpointing, autocast, attention kernel, ...).
        world_size: ranks of the run; sharding "ddp" or "fsdp".
        device: "cuda" or "cpu": which allowances apply.
        spec: the retriever's build (projection, shared encoder).
    """

    command: str
    config: PretrainedConfig
    shape: StepShape
    run: StepRun
    world_size: int = 1
    sharding: str = "ddp"
    device: str = "cuda"
    spec: DualEncoderSpec = field(default_factory=DualEncoderSpec)


@dataclass(frozen=True)
class MemoryPlan:
    """Predicted peak bytes per rank, by component (`components` sums to `peak`)."""

    inputs: PlanInputs
    components: dict[str, int]
    notes: dict[str, int]  # informative sizes, not added: activations per passage, logits, ...
    peak: int


def plan_step(inputs: PlanInputs) -> MemoryPlan:
    """The predicted peak of one steady-state optimizer step per rank."""
    trace = _trace(inputs)
    return _plan_from_trace(inputs, trace, _model_bytes(inputs))


# A trace depends on the model, the micro-batch and the step's knobs only (ranks and sharding
# are applied to it in closed form): the plans of one command (the fit, its remedies) share
# theirs. A t5-base trace takes ~11 s (2 cores), so each one saved is felt.
_TRACES: dict[tuple, StepTrace] = {}
_TRACES_KEPT = 32


def _trace_key(inputs: PlanInputs) -> tuple:
    return (inputs.command, inputs.config.to_json_string(), inputs.shape, inputs.run,
            inputs.spec if inputs.command == "train-retriever" else None)  # fmt: skip


def _trace(inputs: PlanInputs) -> StepTrace:
    key = _trace_key(inputs)
    if key not in _TRACES:
        if len(_TRACES) >= _TRACES_KEPT:
            _TRACES.pop(next(iter(_TRACES)))
        _TRACES[key] = _run_trace(inputs)
    return _TRACES[key]


def _run_trace(inputs: PlanInputs) -> StepTrace:
    if inputs.command == "train-reader":
        return trace_reader_step(inputs.config, inputs.shape, inputs.run)
    if inputs.command == "train-retriever":
        return trace_retriever_step(inputs.config, inputs.spec, inputs.shape, inputs.run)
    raise ConfigError(f"{inputs.command!r}: expected train-reader or train-retriever")


@dataclass(frozen=True)
class _ModelBytes:
    """fp32 bytes of the trained parameters: all of them, FSDP's sharded share, and one
    block's (the largest)."""

    total: int
    in_blocks: int
    largest_block: int
    in_decoder_blocks: int = 0


def model_bytes(inputs: PlanInputs) -> int:
    """fp32 bytes of all the trained parameters, unsharded, without a trace (the model is built
    on the meta device): what a rank's host holds of its weights when it loads them (the
    workflow's host memory request, workflow_scripts/memory_plans.py)."""
    return _model_bytes(inputs).total


def _model_bytes(inputs: PlanInputs) -> _ModelBytes:
    from transformers import AutoModel

    from fid.memory.model_shapes import build_t5

    decoder_blocks = []
    with torch.device("meta"):
        if inputs.command == "train-reader":
            model = build_t5(inputs.config)
            blocks = [*model.encoder.block, *model.decoder.block]
            decoder_blocks = list(model.decoder.block)
        else:
            model = AutoModel.from_config(inputs.config)
            blocks = list(model.encoder.layer)
            if not inputs.spec.shared:  # two encoders: twice the blocks
                blocks = blocks * 2
    copies = 1 if inputs.command == "train-reader" or inputs.spec.shared else 2
    total = copies * sum(p.numel() * 4 for p in model.parameters())

    def size(block) -> int:
        return sum(p.numel() * 4 for p in block.parameters())

    sizes = [size(block) for block in blocks]
    return _ModelBytes(total=total, in_blocks=sum(sizes), largest_block=max(sizes),
                       in_decoder_blocks=sum(size(block) for block in decoder_blocks))  # fmt: skip


def _plan_from_trace(inputs: PlanInputs, trace: StepTrace, model: _ModelBytes) -> MemoryPlan:
    parts = dict(trace.at_peak)
    k = inputs.world_size
    if inputs.sharding == "fsdp" and k > 1:
        # each rank keeps 1/k of the blocks' weights, gradients and AdamW moments; the
        # embeddings and norms stay whole; a block is gathered whole while it runs
        sharded_parts = ["weights", "optimizer states"]
        if not inputs.run.unsharded_gradients_held:  # else every unit's whole gradients
            sharded_parts.append("gradients")
        for name in sharded_parts:
            fraction = parts[name] / model.total if model.total else 0.0
            sharded = fraction * model.in_blocks
            parts[name] = int(parts[name] - sharded + sharded / k)
        parts["FSDP gathered blocks"] = FSDP_GATHERED_BLOCKS * model.largest_block
    elif k > 1:
        # replicas average their gradients after the step, a flat bucket at a time
        # (fid.training.replicas; DDP's reducer, which held a flat copy of every gradient, is
        # no longer used)
        parts["gradient averaging bucket"] = min(model.total, REPLICA_BUCKET_BYTES)
    parts["master weights"] = 0  # autocast computes from the fp32 weights: they are the master
    if inputs.device == "cuda":
        parts["cuBLAS workspaces"] = 2 * CUBLAS_WORKSPACE_BYTES  # forward and backward threads
    evaluation = _fsdp_evaluation_bytes(inputs, parts, model)
    if evaluation > sum(parts.values()):
        parts["dev generation's whole decoder, beyond the step"] = evaluation - sum(parts.values())
    tensors = sum(parts.values())
    if inputs.device == "cuda":
        parts["allocator allowance"] = int(ALLOCATOR_FRACTION * tensors)
        parts["CUDA runtime allowance"] = CUDA_RUNTIME_BYTES
    else:
        parts["CPU runtime allowance"] = CPU_RUNTIME_BYTES
    shape = inputs.shape
    vocab = getattr(inputs.config, "vocab_size", 0)
    logits_bytes = 2 if inputs.run.autocast_dtype is not None else 4
    notes = {
        "encoder activations per passage": trace.encoder_activations
        // max(1, shape.questions * shape.passages),
        "activations after the encoder": trace.encoder_activations,
        "activations at the loss (encoder, fusion, decoder)": trace.forward_activations,
    }
    if inputs.command == "train-reader":
        notes["logits B x A x vocab"] = shape.questions * shape.answer_tokens * vocab * logits_bytes
    if trace.update_peak:
        notes["peak is the optimizer update's"] = trace.update_peak
    if _fsdp_evaluation_bytes(inputs, parts, model):
        notes["dev generation holds the decoder whole"] = model.in_decoder_blocks
    return MemoryPlan(inputs=inputs, components=parts, notes=notes, peak=sum(parts.values()))


def _fsdp_evaluation_bytes(inputs: PlanInputs, parts: dict[str, int], model: _ModelBytes) -> int:
    """What a sharded reader's rank holds through dev generation, past the step: its shards of
    the weights and optimizer states, and the decoder's blocks whole (kept gathered for the
    whole generation: fid.training.sharding.kept_gathered), without the step's activations
    (a generation's own are an eval batch's, left out). 0 when nothing is sharded."""
    k = inputs.world_size
    if inputs.sharding != "fsdp" or k <= 1 or not model.in_decoder_blocks:
        return 0
    decoder_rest = model.in_decoder_blocks - model.in_decoder_blocks // k  # its shard is counted
    return parts["weights"] + parts["optimizer states"] + decoder_rest


@dataclass(frozen=True)
class Fit:
    """The largest micro-batch that fits a memory, or what would make one question fit.

    Attributes:
        questions: full-size questions a micro-batch can hold (0: not even one).
        max_tokens_per_batch: the token budget that holds them (questions x N x L).
        accumulation: gradient_accumulation_steps keeping the config's effective batch.
        plan: the plan at `questions` (or at one question, when none fits).
        remedies: when none fits: what fits instead (a sentence each).
    """

    questions: int
    max_tokens_per_batch: int
    accumulation: int
    plan: MemoryPlan
    remedies: list[str]


def fit_memory(inputs: PlanInputs, memory: int, effective_tokens: int) -> Fit:
    """The largest number of full-size questions a micro-batch can hold in `memory` bytes.

    The step's peak is linear in the questions of a micro-batch (each adds its encoder and
    decoder activations), but for the optimizer's update, which does not grow
    (`largest_that_fits`).
    """
    questions, plan = largest_that_fits(
        lambda n: plan_step(replace(inputs, shape=replace(inputs.shape, questions=n))), memory
    )
    if questions == 0:
        return Fit(0, 0, 0, plan, _remedies(inputs, memory, plan))
    tokens = questions * inputs.shape.passages * inputs.shape.passage_tokens
    return Fit(questions, tokens, max(1, math.ceil(effective_tokens / tokens)), plan, [])


Planned = TypeVar("Planned")  # a plan with a `peak` (bytes): MemoryPlan, InferencePlan


# The largest count `largest_that_fits` answers: far beyond any micro-batch or data set.
_MOST = 1 << 24


def largest_that_fits(plan_at: Callable[[int], Planned], memory: int) -> tuple[int, Planned]:
    """The largest n >= 1 whose plan `plan_at(n)` peaks within `memory` bytes, and that plan;
    (0, the plan of 1) when even 1 does not fit.

    A peak is linear in n (n questions or items a batch: each adds its activations) above
    what does not grow with it (the weights, an optimizer update that peaks higher than a
    small batch). Each plan costs a trace (seconds at t5-base), so the search traces a few
    sizes: 1 and 2 give a line, and the line's answer is traced; where the line is flat (the
    growing part still under a fixed peak) the size grows 8x a probe, and where a traced
    answer does not fit, the line through the last two sizes on either side narrows it
    (regula falsi, halving where it stalls). Typically 3 plans; at most ~2 log2(answer).
    """
    plans: dict[int, Planned] = {}

    def peak(n: int) -> int:
        if n not in plans:
            plans[n] = plan_at(n)
        return plans[n].peak

    if peak(1) > memory:
        return 0, plans[1]
    low, probe = 1, 2  # low fits; probe is the next size to try
    while peak(probe) <= memory:  # grow along the line until a size does not fit
        slope = (peak(probe) - peak(low)) / (probe - low)
        low = probe
        if low >= _MOST:
            return low, plans[low]
        if slope <= 0:  # flat so far: the batch's own memory is under a fixed peak
            probe = min(_MOST, low * 8)
            continue
        reach = int((memory - peak(low)) // slope)  # sizes beyond low the line allows
        if reach <= 0:  # the line's answer, traced, fits; the next size is over by the line
            return low, plans[low]
        probe = min(_MOST, low + reach)
    high = probe
    moved = []  # which bound each narrowing moved: the line is used until it stalls
    while high - low > 1:  # low fits, high does not: narrow along the line between them
        slope = (peak(high) - peak(low)) / (high - low)
        guess = low + int((memory - peak(low)) // slope) if slope > 0 else (low + high) // 2
        if moved[-2:] in (["low", "low"], ["high", "high"]):  # one side only: halve
            guess = (low + high) // 2
        guess = min(max(guess, low + 1), high - 1)
        fits = peak(guess) <= memory
        low, high = (guess, high) if fits else (low, guess)
        moved.append("low" if fits else "high")
    return low, plans[low]


def _remedies(inputs: PlanInputs, memory: int, one: MemoryPlan) -> list[str]:
    """What would make one question fit: checkpointing, FSDP over more ranks, fewer passages.

    A few traces at most: FSDP's ranks are applied to the one question's trace in closed form,
    and fewer passages are tried only when one passage fits.
    """
    found = []
    single = replace(inputs, shape=replace(inputs.shape, questions=1))
    if not inputs.run.checkpointing:
        plan = plan_step(replace(single, run=replace(inputs.run, checkpointing=True)))
        if plan.peak <= memory:
            found.append(f"activation_checkpointing: true (peak {format_bytes(plan.peak)})")
    for ranks in (2, 4, 8, 16, 32, 64):
        if ranks <= inputs.world_size and inputs.sharding == "fsdp":
            continue
        plan = plan_step(replace(single, sharding="fsdp", world_size=ranks))
        if plan.peak <= memory:
            found.append(f"sharding: fsdp over {ranks} ranks (peak {format_bytes(plan.peak)})")
            break

    def with_passages(n: int) -> MemoryPlan:
        return plan_step(replace(single, shape=replace(single.shape, passages=n)))

    halvings = []  # N/2, N/4, ..., 1: the counts offered
    passages = inputs.shape.passages // 2
    while passages >= 1:
        halvings.append(passages)
        passages //= 2
    if halvings and with_passages(halvings[-1]).peak <= memory:
        count, plan = largest_that_fits(with_passages, memory)
        offered = next(n for n in halvings if n <= count)
        plan = plan if offered == count else with_passages(offered)
        found.append(f"n_passages: {offered} (peak {format_bytes(plan.peak)})")
    return found


def plan_table(plan: MemoryPlan) -> str:
    """The plan as lines of `component  size`, its total last, then the informative sizes."""
    width = max(len(name) for name in [*plan.components, *plan.notes])
    lines = [f"{name:<{width}}  {format_bytes(size):>12}" for name, size in plan.components.items()]
    lines.append(f"{'peak per rank':<{width}}  {format_bytes(plan.peak):>12}")
    lines.append("")
    lines += [f"{name:<{width}}  {format_bytes(size):>12}" for name, size in plan.notes.items()]
    return "\n".join(lines)


class MemoryDoesNotFit(ConfigError):
    """A config whose step's predicted peak exceeds the device memory given."""


def plan_summary(plan: MemoryPlan, model: str, cfg, memory: int | None, fit: Fit | None) -> str:
    """What `fid plan-memory` prints: what was planned, the plan, and the verdict."""
    inputs, shape, run = plan.inputs, plan.inputs.shape, plan.inputs.run
    precision = {None: "fp32", torch.bfloat16: "bf16 autocast", torch.float16: "fp16 autocast"}
    checkpointing = "on" if run.checkpointing else "off"
    lines = [
        f"fid {inputs.command} from {model}: {inputs.world_size} rank(s), {inputs.sharding}, on "
        f"{inputs.device}, {precision[run.autocast_dtype]}, activation checkpointing "
        f"{checkpointing}",
        f"largest micro-batch: {shape.questions} question(s) x {shape.passages} passages x "
        f"{shape.passage_tokens} tokens (gradient_accumulation_steps "
        f"{cfg.gradient_accumulation_steps})",
        "",
        plan_table(plan),
    ]
    if memory is None or fit is None:
        return "\n".join(lines)
    lines.append("")
    verdict = "fits" if plan.peak <= memory else "does NOT fit"
    lines.append(f"{verdict} in {format_bytes(memory)}: predicted peak {format_bytes(plan.peak)}")
    if fit.questions:
        lines.append(
            f"largest that fits: max_tokens_per_batch: {fit.max_tokens_per_batch} "
            f"({fit.questions} full-size question(s), peak {format_bytes(fit.plan.peak)}), with "
            f"gradient_accumulation_steps: {fit.accumulation} to keep the step's tokens"
        )
    elif fit.remedies:
        lines.append("not even one question fits; each of these would make it fit:")
        lines += [f"  {remedy}" for remedy in fit.remedies]
    else:
        lines.append(
            "not even one question fits, and neither checkpointing, FSDP over up to 64 ranks "
            "nor fewer passages make it fit: a smaller model or shorter passages"
        )
    return "\n".join(lines)
