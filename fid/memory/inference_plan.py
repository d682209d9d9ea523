"""Memory plans of the inference commands: `fid eval-reader` (generation), `fid score-passages`
(every mode) and `fid embed-passages`, per batch at its largest, and the largest batch size
that fits a device.

Each is traced like a training step (fid.memory.traced_step): the command's forward on fake
tensors under torch's MemTracker, without gradients, through fid's own code where it does not
depend on the data (the score arithmetic, the answer log-likelihood, DualEncoder's passage
encoder) and as FiDReader does it where it does (the length-sorted encoder buckets and the
fusion, written out as in the training trace). What each holds at its peak:

- eval-reader: the fused encoder states (B x beams, N x L, D) and, from the first decoding
  step on, every decoder layer's cross-attention keys and values over them (the cache: 2 x
  layers x B x beams x N x L x H x dk), the step's logits in fp32; traced over two steps (the
  second reads the cache; later steps add only the self-attention cache, A x D a layer).
  Passage pruning and token elimination (keep_passages / keep_tokens) start from the same
  first step and hold less after it: the plan is their upper bound.
- score-passages, mean_logit / attention_mass: the fused states, one decoder step whose
  cross-attention keys are kept for every layer (the scores read them), the scores in fp32.
  pdist: 64 single-passage rows at a time (FiDReader.answer_log_likelihoods), each decoding
  the answer: (64, A, vocab) logits in fp32. loop: the batch's fused states, one
  question's cross-attention keys and values (projected once, shared by its copies), and 8
  masked copies of it at a time decoding the answer.
- embed-passages: one batch of passages through the passage encoder.

Allowances as for training (fid.memory.plan), with one cuBLAS workspace (no backward thread).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace

import torch
from transformers import AutoModel, PretrainedConfig
from transformers.modeling_outputs import BaseModelOutput

from fid.errors import ConfigError
from fid.memory.model_shapes import build_t5
from fid.memory.plan import (
    ALLOCATOR_FRACTION,
    CPU_RUNTIME_BYTES,
    CUBLAS_WORKSPACE_BYTES,
    CUDA_RUNTIME_BYTES,
    format_bytes,
    largest_that_fits,
)
from fid.memory.traced_step import (
    _cuda_attention,
    _fake_mode,
    _PeakTracker,
    _Root,
    _snapshot,
    fused_encoder_states,
)
from fid.models.cross_attention_scores import capture_cross_attention, scores_from_projections
from fid.models.fused_encoding import FusedEncoding
from fid.models.reader import FiDReader
from fid.models.retriever import DualEncoder
from fid.models.retriever_spec import DualEncoderSpec

INFERENCE_COMMANDS = ("eval-reader", "score-passages", "embed-passages")
ROWS_PER_PASS = {"pdist": 64, "loop": 8}  # FiDReader's answer_log_likelihoods / leave-one-out


@dataclass(frozen=True)
class InferenceInputs:
    """What decides an inference batch's memory.

    Attributes:
        command: one of INFERENCE_COMMANDS.
        config: the model's config (the reader's T5, the retriever's encoder).
        batch: questions a batch (eval-reader, score-passages) or passages (embed-passages).
        passages, passage_tokens: N and L of the reader's inputs (passages: 1 for embedding).
        answer_tokens: tokens generated (eval-reader) or of an answer (pdist, loop).
        mode: "generate", a score-passages mode, or "embed".
        num_beams: beam search's beams (eval-reader).
        attention: T5's kernel ("eager" or "sdpa").
        autocast_dtype: bf16 / fp16 autocast; None: fp32.
        device: "cuda" or "cpu".
        encoder_buckets: FiDReader's length-sorted encoder groups.
        light_tokens: FiD-Light's tokens handed to the decoder a passage.
        spec: the retriever's build (embed-passages).
    """

    command: str
    config: PretrainedConfig
    batch: int
    passages: int
    passage_tokens: int
    answer_tokens: int = 20
    mode: str = "generate"
    num_beams: int = 1
    attention: str = "eager"
    autocast_dtype: torch.dtype | None = None
    device: str = "cuda"
    encoder_buckets: int = 8
    light_tokens: int | None = None
    spec: DualEncoderSpec = field(default_factory=DualEncoderSpec)


@dataclass(frozen=True)
class InferencePlan:
    """Predicted peak bytes of one batch (`components` sums to `peak`)."""

    inputs: InferenceInputs
    components: dict[str, int]
    notes: dict[str, int]
    peak: int


def plan_inference(inputs: InferenceInputs) -> InferencePlan:
    """The predicted peak of one of the command's batches at its largest."""
    peak = _trace(inputs)
    parts = {"weights": peak.get("weights", 0)}
    parts["inputs, encoder states, caches and temporaries"] = peak["total"] - parts["weights"]
    if inputs.device == "cuda":
        parts["cuBLAS workspace"] = CUBLAS_WORKSPACE_BYTES  # the forward's thread only
        parts["allocator allowance"] = int(ALLOCATOR_FRACTION * sum(parts.values()))
        parts["CUDA runtime allowance"] = CUDA_RUNTIME_BYTES
    else:
        parts["CPU runtime allowance"] = CPU_RUNTIME_BYTES
    notes = {}
    if inputs.mode == "generate":
        config, k = inputs.config, _handed_tokens(inputs)
        rows = inputs.batch * inputs.num_beams
        layers = config.num_decoder_layers or config.num_layers
        width = 2 if inputs.autocast_dtype is not None else 4
        cache = 2 * layers * rows * inputs.passages * k * config.num_heads * config.d_kv * width
        notes["cross-attention cache (keys and values)"] = cache
    return InferencePlan(inputs, parts, notes, sum(parts.values()))


@dataclass(frozen=True)
class InferenceFit:
    """The largest batch size whose plan fits a memory (0: not even one)."""

    batch: int
    plan: InferencePlan


def fit_inference(inputs: InferenceInputs, memory: int) -> InferenceFit:
    """The largest batch that fits `memory` bytes (a batch's peak is linear in its size:
    `largest_that_fits`)."""
    batch, plan = largest_that_fits(lambda n: plan_inference(replace(inputs, batch=n)), memory)
    return InferenceFit(batch, plan)


def _handed_tokens(inputs: InferenceInputs) -> int:
    L = inputs.passage_tokens
    return L if inputs.light_tokens is None else min(inputs.light_tokens, L)


def _trace(inputs: InferenceInputs) -> dict[str, int]:
    """component -> bytes at the batch's peak ("total" too)."""
    if inputs.command not in INFERENCE_COMMANDS:
        raise ConfigError(f"{inputs.command!r}: expected one of {', '.join(INFERENCE_COMMANDS)}")
    with _fake_mode():
        if inputs.command == "embed-passages":
            encoder = AutoModel.from_config(inputs.config)
            second = None if inputs.spec.shared else AutoModel.from_config(inputs.config)
            model = DualEncoder(encoder, second, inputs.spec)
        else:
            t5 = build_t5(inputs.config)
            t5.set_attn_implementation(inputs.attention)
            model = FiDReader(t5, encoder_buckets=inputs.encoder_buckets)
        model.eval()
        tracker = _PeakTracker()
        tracker.track_external(model)
        autocast = (
            torch.autocast("cpu", dtype=inputs.autocast_dtype)
            if inputs.autocast_dtype is not None
            else contextlib.nullcontext()
        )
        kernels = _cuda_attention() if inputs.device == "cuda" else contextlib.nullcontext()
        run = _RUNS.get(inputs.mode)
        if run is None:
            raise ConfigError(f"mode {inputs.mode!r}: no memory plan for it")
        with tracker, kernels, torch.no_grad(), autocast:
            # one root call: MemTracker refuses a root module called twice (the encoder, once
            # a bucket), taking it for a second iteration
            _Root(model, lambda _tracker: run(model, inputs))(tracker)
        return _snapshot(tracker, "peak")


def _encode(reader: FiDReader, inputs: InferenceInputs, questions: int, passages: int):
    """FiDReader.encode at full length (fused_encoder_states): the fused (questions,
    passages * k, D) states and their (.., T) mask."""
    T = passages * _handed_tokens(inputs)
    fused, _ = fused_encoder_states(reader.t5, questions * passages, inputs.passage_tokens,
                                    _handed_tokens(inputs), inputs.encoder_buckets)  # fmt: skip
    return fused.view(questions, T, -1), torch.ones(questions, T, dtype=torch.long)


def _generate(reader: FiDReader, inputs: InferenceInputs) -> None:
    """transformers' generate from given encoder states: expanded by the beams, the first
    step builds the cache, the second reads it."""
    fused, fused_mask = _encode(reader, inputs, inputs.batch, inputs.passages)
    hidden, mask = fused, fused_mask  # FiDReader.generate holds these through generate
    if inputs.num_beams > 1:  # generate's _expand_inputs_for_generation: a copy
        hidden = fused.repeat_interleave(inputs.num_beams, dim=0)
        mask = fused_mask.repeat_interleave(inputs.num_beams, dim=0)
    rows = hidden.shape[0]
    encoder_outputs = BaseModelOutput(last_hidden_state=hidden)
    start = torch.zeros(rows, 1, dtype=torch.long)
    out = reader.t5(encoder_outputs=encoder_outputs, attention_mask=mask,
                    decoder_input_ids=start, use_cache=True)  # fmt: skip
    scores = out.logits[:, -1, :].float()  # (rows, vocab): generate's next-token scores
    if inputs.num_beams > 1:
        scores = scores.log_softmax(dim=-1)
    cache = out.cache
    del out, scores
    if inputs.num_beams > 1:  # beam search reorders the cache (both attentions) every step
        cache.reorder_cache(torch.arange(rows))
    reader.t5(encoder_outputs=encoder_outputs, attention_mask=mask, decoder_input_ids=start,
              cache=cache, use_cache=True).logits[:, -1, :].float()  # fmt: skip


def _attention_scores(reader: FiDReader, inputs: InferenceInputs) -> None:
    """FiDReader.passage_scores: one decoder step, each layer's cross-attention q and k kept."""
    B, N, k = inputs.batch, inputs.passages, _handed_tokens(inputs)
    hidden, mask = _encode(reader, inputs, B, N)
    token_passage = torch.arange(N).repeat_interleave(k).expand(B, N * k)
    encoding = FusedEncoding(hidden, mask, token_passage)
    start = torch.zeros(B, 1, dtype=torch.long)
    with capture_cross_attention(reader.t5) as captured:
        reader.t5.decoder(input_ids=start, encoder_hidden_states=hidden,
                          encoder_attention_mask=mask, use_cache=False)  # fmt: skip
    with torch.autocast("cpu", enabled=False):
        scores_from_projections(captured, encoding, N, reader.config.num_heads, inputs.mode)


def _pdist(reader: FiDReader, inputs: InferenceInputs) -> None:
    """FiDReader.answer_log_likelihoods: ROWS_PER_PASS single-passage rows at a time."""
    rows = min(ROWS_PER_PASS["pdist"], inputs.batch * inputs.passages)
    hidden, mask = _encode(reader, inputs, rows, 1)
    labels = torch.ones(rows, inputs.answer_tokens, dtype=torch.long)
    reader._answer_log_likelihood(hidden, mask, labels)


def _loop(reader: FiDReader, inputs: InferenceInputs) -> None:
    """FiDReader.leave_one_out_log_likelihoods: the fused states of every question, then one
    question's copies (all passages, then each left out), ROWS_PER_PASS at a time, reading its
    cross-attention keys and values, projected once for every layer (a pass of the
    question's first copies: the passes are alike)."""
    B, N, k = inputs.batch, inputs.passages, _handed_tokens(inputs)
    hidden, mask = _encode(reader, inputs, B, N)
    token_passage = torch.arange(N).repeat_interleave(k).expand(B, N * k).contiguous()
    encoding = FusedEncoding(hidden, mask, token_passage)  # held through the questions
    labels = torch.ones(inputs.answer_tokens, dtype=torch.long)
    slots = torch.arange(min(N, ROWS_PER_PASS["loop"] - 1))  # + the all-passages copy
    reader._leave_one_out_question(encoding, 0, slots, labels, ROWS_PER_PASS["loop"])


def _embed(model: DualEncoder, inputs: InferenceInputs) -> None:
    ids = torch.ones(inputs.batch, inputs.passage_tokens, dtype=torch.long)
    model.encode_passages(ids, torch.ones_like(ids))


def _no_forward(model, inputs: InferenceInputs) -> None:
    """score-passages' uniform control: the reader is loaded, never run."""


_RUNS = {"generate": _generate, "mean_logit": _attention_scores,
         "attention_mass": _attention_scores, "pdist": _pdist, "loop": _loop,
         "uniform": _no_forward, "embed": _embed}  # fmt: skip


def inference_summary(plan: InferencePlan, model: str, memory: int | None,
                      fit: InferenceFit | None, batch_key: str) -> str:  # fmt: skip
    """What `fid plan-memory --for <inference command>` prints."""
    from fid.memory.plan import plan_table

    inputs = plan.inputs
    precision = {None: "fp32", torch.bfloat16: "bf16 autocast", torch.float16: "fp16 autocast"}
    what = (
        f"{inputs.batch} passage(s) x {inputs.passage_tokens} tokens"
        if inputs.command == "embed-passages"
        else f"{inputs.batch} question(s) x {inputs.passages} passages x "
        f"{inputs.passage_tokens} tokens, {inputs.mode}"
        + (f", {inputs.num_beams} beams" if inputs.num_beams > 1 else "")
    )
    lines = [
        f"fid {inputs.command} from {model}: on {inputs.device}, "
        f"{precision[inputs.autocast_dtype]}",
        f"largest batch: {what} ({batch_key}: {inputs.batch})",
        "",
        plan_table(plan),
    ]
    if memory is None or fit is None:
        return "\n".join(lines)
    verdict = "fits" if plan.peak <= memory else "does NOT fit"
    lines += ["", f"{verdict} in {format_bytes(memory)}: predicted peak {format_bytes(plan.peak)}"]
    if fit.batch:
        lines.append(
            f"largest that fits: {batch_key}: {fit.batch} (peak {format_bytes(fit.plan.peak)})"
        )
    else:
        lines.append(
            f"not even a batch of one fits (peak {format_bytes(fit.plan.peak)}): fewer "
            "passages, shorter passages, bf16, or a device with more memory"
        )
    return "\n".join(lines)
