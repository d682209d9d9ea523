"""One training step run on fake tensors: every tensor the step would create, with its shape,
dtype and lifetime, and none of its memory or arithmetic.

torch's `MemTracker` (a dispatch mode) counts the bytes alive at every op, by kind (parameters,
gradients, optimizer states, activations saved for backward, temporaries); run under
`FakeTensorMode` the step allocates nothing, so a plan for t5-3b at 100 passages takes seconds
on a laptop. What it counts is what the tensors hold: the allocator's rounding and the
runtime's own memory are the plan's allowances (fid.memory.plan).

SDPA's saved tensors depend on the kernel the device picks, which a fake CPU run does not: a
plan for CUDA (`StepRun.device`) runs every `scaled_dot_product_attention` as CUDA's
memory-efficient kernel (the one it picks for T5's biased and BERT's masked attention; flash
takes no bias), which keeps its output and log-sum-exp instead of the math path's B x H x L x L
probabilities (`_cuda_attention`).

The reader's step is FiDReader's at its largest for the shape: every passage full length
(FiD's Wikipedia chunks nearly always are), so the encoder's buckets and the fused sequence
hold B x N x L tokens. FiDReader's bookkeeping (which positions are real) is data-dependent
and cannot run on fake tensors; its two copies of the fused states are made here as it makes
them. The retriever's step runs DualEncoder and the distillation loss themselves.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType
from transformers import AutoModel, PretrainedConfig
from transformers.modeling_outputs import BaseModelOutput

from fid.memory.model_shapes import build_t5
from fid.models.bucketed_encoder import attach_bucket_forward, encode_buckets
from fid.models.reader_variants import remove_cross_attention
from fid.models.retriever import DualEncoder
from fid.models.retriever_spec import DualEncoderSpec

# MemTracker's kinds -> the plan's components
_KINDS = {
    _MemRefType.PARAM: "weights",
    _MemRefType.BUFFER: "weights",
    _MemRefType.GRAD: "gradients",
    _MemRefType.OPT: "optimizer states",
    _MemRefType.ACT: "activations",
    _MemRefType.TEMP: "temporaries",
    _MemRefType.OTH: "temporaries",
}


class _PeakTracker(MemTracker):
    """MemTracker keeping the whole step's peak only. Its per-module peaks cost a pass over
    every module at every op (18.9 M calls, 80 of the 100 s of a t5-base trace); no plan reads
    them. (A private method of torch 2.13's MemTracker, which the pinned torch keeps.)"""

    def _update_peak_stats(self, peak_state) -> None:
        for device, snapshot in self._curr_mem_snap.items():
            if self._peak_mem.get(device, 0) < snapshot["Total"]:
                self._peak_mem[device] = snapshot["Total"]
                self._peak_mem_snap[device] = dict(snapshot)


@dataclass(frozen=True)
class StepShape:
    """What one micro-batch holds: `questions` x `passages` passages of `passage_tokens`
    tokens, and `answer_tokens` target tokens a question (the retriever: question tokens)."""

    questions: int
    passages: int
    passage_tokens: int
    answer_tokens: int


@dataclass(frozen=True)
class StepRun:
    """How the step runs: the knobs that change what it holds."""

    checkpointing: bool = False
    autocast_dtype: torch.dtype | None = None  # bf16 / fp16 autocast; None: fp32
    attention: str = "eager"  # T5's kernel: "sdpa" on a GPU (no L x L scores saved)
    device: str = "cpu"  # where the step runs: "cuda" traces SDPA as CUDA's kernel runs it
    foreach: bool = False  # AdamW's multi-tensor update (CUDA's default), with its temporaries
    gradients_held: bool = False  # accumulation: the gradients live through the forward
    # FSDP with fsdp_gradient_sync: last_micro_batch: those held gradients are unsharded
    unsharded_gradients_held: bool = False
    encoder_buckets: int = 8  # FiDReader encodes the passages in this many groups
    light_tokens: int | None = None  # FiD-Light: the decoder reads k tokens a passage
    cross_attention_every: int | None = None  # FiDO: cross-attention in every K-th layer


@dataclass(frozen=True)
class StepTrace:
    """Bytes of one steady-state optimizer step (the optimizer's states exist).

    Attributes:
        peak: bytes alive at the step's peak.
        at_peak: component -> bytes at that moment.
        encoder_activations: activations alive after the encoder's forward (all passages).
        forward_activations: activations alive at the loss (all the backward will read).
        update_peak: the peak during the optimizer's update alone.
    """

    peak: int
    at_peak: dict[str, int]
    encoder_activations: int
    forward_activations: int
    update_peak: int


def fused_encoder_states(
    t5: torch.nn.Module,
    rows: int,
    L: int,
    k: int,
    buckets: int,
    tracker: MemTracker | None = None,
    block_by_block: bool = False,
) -> tuple[torch.Tensor, int | None]:
    """FiDReader.encode at full length, as it makes its tensors: the `rows` passages (questions
    x passages) of L tokens in `buckets` groups, one after the other (inference) or,
    `block_by_block` (training), each block over all groups (fid.models.bucketed_encoder; the
    recomputation of a checkpointed block holds one bucket's activations), each group's first
    k tokens picked out (a copy; its backward
    keeps the row and position of each), concatenated (rows * k, D) and scattered into the
    fused sequence: two copies. Training and inference plans trace it alike.

    Returns:
        The fused states (rows * k, D), and the activations alive after the buckets (bytes;
        `tracker`'s, None without one).
    """
    groups = torch.tensor_split(torch.arange(rows), min(buckets, rows))
    inputs = []
    for group in groups:
        ids = torch.ones(len(group), L, dtype=torch.long)
        # a group of several passages holds padding (it is padded to its longest), so
        # attention gets a (group, heads, L, L) mask; one passage alone has none: transformers
        # (5.25) drops an all-ones mask, for eager and SDPA alike
        inputs.append((ids, None if len(group) == 1 else torch.ones_like(ids)))
    attach_bucket_forward(t5.encoder)  # the trace's own model, built unsharded
    states = encode_buckets(t5.encoder, inputs, block_by_block)
    parts = []
    for group, hidden in zip(groups, states, strict=True):
        kept = hidden[:, :k].reshape(len(group) * k, -1)  # hidden: (group, L, D)
        row_and_position = torch.arange(len(group) * k * 2).view(2, -1)
        parts.append(kept.index_select(0, row_and_position[0] % (len(group) * k)))
    encoder_bytes = _activations(tracker) if tracker is not None else None
    tokens = torch.cat(parts)
    fused = tokens.new_zeros(tokens.shape).index_copy(0, torch.arange(rows * k), tokens)
    return fused, encoder_bytes


def trace_reader_step(config: PretrainedConfig, shape: StepShape, run: StepRun) -> StepTrace:
    """A FiD reader's forward, backward and AdamW update at `shape`, on fake tensors."""
    with _fake_mode():
        t5 = build_t5(config)
        if run.cross_attention_every is not None:
            remove_cross_attention(t5, run.cross_attention_every)
        t5.set_attn_implementation(run.attention)
        if run.checkpointing:
            t5.gradient_checkpointing_enable({"use_reentrant": False})
        t5.train()
        B, N, L, A = shape.questions, shape.passages, shape.passage_tokens, shape.answer_tokens
        k = L if run.light_tokens is None else min(run.light_tokens, L)  # tokens handed on

        def forward(tracker: MemTracker) -> tuple[torch.Tensor, int]:
            fused, encoder_bytes = fused_encoder_states(t5, B * N, L, k, run.encoder_buckets,
                                                        tracker, block_by_block=True)  # fmt: skip
            loss = t5(
                encoder_outputs=BaseModelOutput(last_hidden_state=fused.view(B, N * k, -1)),
                attention_mask=torch.ones(B, N * k, dtype=torch.long),
                labels=torch.ones(B, A, dtype=torch.long),
                use_cache=False,
            ).loss
            return loss, encoder_bytes

        # A checkpointed stack keeps each bucket's (rows, heads, L, L) fp32 position bias (the
        # mask added) until its backward: it is an input of every later block's checkpoint.
        # The real step keeps it too: at benchmarks/memory/memory_plan.py's tiny 1 x 10 x 250 (8
        # buckets, 1 MB each) its tensors peak at 24.2 MiB, the trace at 24.9, 17.2 without them.
        return _trace(t5, forward, run)


def trace_retriever_step(
    config: PretrainedConfig, spec: DualEncoderSpec, shape: StepShape, run: StepRun
) -> StepTrace:
    """A retriever's step at `shape` (`answer_tokens` = question tokens), on fake tensors:
    DualEncoder's forward, a KL loss over each question's passages, backward, AdamW."""
    with _fake_mode():
        question_encoder = AutoModel.from_config(config)
        passage_encoder = None if spec.shared else AutoModel.from_config(config)
        model = DualEncoder(question_encoder, passage_encoder, spec)
        if run.checkpointing:
            for encoder in (question_encoder, passage_encoder):
                if encoder is not None:
                    encoder.gradient_checkpointing_enable({"use_reentrant": False})
        model.train()
        B, N, L, Q = shape.questions, shape.passages, shape.passage_tokens, shape.answer_tokens

        def forward(tracker: MemTracker) -> tuple[torch.Tensor, int]:
            questions = torch.ones(B, Q, dtype=torch.long)
            passages = torch.ones(B * N, L, dtype=torch.long)
            q, p = model(questions, torch.ones_like(questions), passages, torch.ones_like(passages))
            encoder_bytes = _activations(tracker)
            scores = model.scores(q, p.view(B, N, -1))  # (B, N)
            teacher = torch.softmax(torch.zeros(B, N), dim=-1)
            loss = torch.nn.functional.kl_div(
                torch.log_softmax(scores.float(), dim=-1), teacher, reduction="batchmean"
            )
            return loss, encoder_bytes

        return _trace(model, forward, run)


def _trace(model: torch.nn.Module, forward, run: StepRun) -> StepTrace:
    """Traces `forward` (loss, activations after the encoder), backward and the update."""
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, foreach=run.foreach)
    # The steady state: after the first update AdamW holds its two moments (and a step count)
    # per parameter; with accumulation the gradients of earlier micro-batches are alive too.
    for parameter in parameters:
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    if not run.gradients_held:
        optimizer.zero_grad(set_to_none=True)
    tracker = _PeakTracker()
    tracker.track_external(model, optimizer)
    autocast = (  # training keeps no weight casts (fid.runtime.precision.autocast)
        torch.autocast("cpu", dtype=run.autocast_dtype, cache_enabled=False)
        if run.autocast_dtype is not None
        else contextlib.nullcontext()
    )
    with tracker, _cuda_attention() if run.device == "cuda" else contextlib.nullcontext():
        start = _activations(tracker)
        with autocast:
            # one root module: MemTracker refuses a root module called twice (the encoder,
            # once per bucket), taking it for a second iteration
            loss, encoder_end = _Root(model, forward)(tracker)
        forward_end = _activations(tracker)
        loss.backward()
        backward = _snapshot(tracker, "peak")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        whole = _snapshot(tracker, "peak")
    update_peak = whole["total"] if whole["total"] > backward["total"] else 0
    at_peak = {name: whole.get(name, 0) for name in dict.fromkeys(_KINDS.values())}
    return StepTrace(
        peak=whole["total"],
        at_peak=at_peak,
        encoder_activations=encoder_end - start,
        forward_activations=forward_end - start,
        update_peak=update_peak,
    )


@contextlib.contextmanager
def _cuda_attention():
    """`scaled_dot_product_attention` as CUDA dispatches it for training: the memory-efficient
    (cutlass) kernel. Its autograd node keeps q, k, v, the bias, the output and the (B, H,
    L rounded up to 32) log-sum-exp; its backward makes the bias's gradient at the padded
    width. What the dispatcher does first is done here too: a boolean mask becomes an additive
    one, a bias whose rows are not 16-aligned is copied into a padded one (T5's L = 250 is
    not), and under autocast every input is cast to the autocast dtype (SDPA is on CUDA
    autocast's lower-precision list). Measured on an H200: benchmarks/memory/memory_plan.py.

    The function is replaced where transformers' SDPA attention looks it up (at each call), not
    intercepted by a TorchFunctionMode: a mode is off while it handles a call, and
    `loss.backward()` is a call, inside which checkpointed blocks are recomputed."""
    original = torch.nn.functional.scaled_dot_product_attention
    torch.nn.functional.scaled_dot_product_attention = _memory_efficient_attention
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = original


def _memory_efficient_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
    enable_gqa=False,
):  # fmt: skip
    if enable_gqa:
        raise NotImplementedError("the memory plan does not model grouped-query attention")
    if torch.is_autocast_enabled("cpu"):  # the trace's autocast stands for CUDA's
        dtype = torch.get_autocast_dtype("cpu")
        query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
        if attn_mask is not None and attn_mask.is_floating_point():
            attn_mask = attn_mask.to(dtype)
    bias = attn_mask
    if bias is not None and bias.dtype == torch.bool:
        zero = torch.zeros((), dtype=query.dtype)
        bias = torch.where(bias, zero, zero - float("inf"))
    if bias is not None and any(stride % 16 for stride in bias.stride()[:-1] if stride):
        width = bias.size(-1)
        bias = torch.nn.functional.pad(bias, (0, -width % 16))[..., :width]
    if bias is not None:
        bias = bias.expand(*query.shape[:-1], key.size(-2))
    keep_logsumexp = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    output, *_ = torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, bias, keep_logsumexp, dropout_p, is_causal, scale=scale
    )
    return output


class _Root(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, forward):
        super().__init__()
        self.model = model
        self.step = forward

    def forward(self, tracker: MemTracker):
        return self.step(tracker)


def _snapshot(tracker: MemTracker, kind: str) -> dict[str, int]:
    """component -> bytes (and "total") of the tracker's current or peak snapshot."""
    totals: dict[str, int] = {"total": 0}
    for per_kind in tracker.get_tracker_snapshot(kind).values():
        for ref, size in per_kind.items():
            if ref in _KINDS:
                totals[_KINDS[ref]] = totals.get(_KINDS[ref], 0) + size
                totals["total"] += size
    return totals


def _activations(tracker: MemTracker) -> int:
    return _snapshot(tracker, "current").get("activations", 0)


@contextlib.contextmanager
def _fake_mode():
    with warnings.catch_warnings():
        # MemTracker's module hooks warn when a module was collected before its backward
        # hook ran (T5's checkpointed blocks): nothing is mis-counted
        warnings.filterwarnings("ignore", "Module is None")
        with FakeTensorMode(), torch.device("cpu"):
            yield
