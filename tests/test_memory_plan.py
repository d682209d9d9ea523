"""fid plan-memory (fid.memory): the traced step's components equal exact counts and the real
step's tensors; the fit, the command line and its errors; glibc's heap setting."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch
from transformers import BertConfig, T5Config, T5ForConditionalGeneration

from fid.cli import main
from fid.memory.model_shapes import build_t5, model_config
from fid.memory.plan import PlanInputs, fit_memory, parse_size, plan_step
from fid.memory.traced_step import (
    StepRun,
    StepShape,
    _PeakTracker,
    _snapshot,
    trace_reader_step,
    trace_retriever_step,
)
from fid.models.reader import FiDReader
from fid.models.retriever_spec import DualEncoderSpec
from fid.runtime.heap import return_freed_memory

T5_SHAPE = dict(d_model=32, d_ff=64, d_kv=8, num_layers=2, num_decoder_layers=2, num_heads=4,
                vocab_size=400, decoder_start_token_id=0, pad_token_id=0)  # fmt: skip
SHAPE = StepShape(questions=2, passages=6, passage_tokens=40, answer_tokens=5)


def _real_reader(checkpointing: bool) -> FiDReader:
    torch.manual_seed(0)
    reader = FiDReader(T5ForConditionalGeneration(T5Config(**T5_SHAPE)), encoder_buckets=3)
    reader.set_attention("eager", torch.device("cpu"))
    reader.set_activation_checkpointing(checkpointing)
    return reader.train()


def _batch():
    B, N, L, A = SHAPE.questions, SHAPE.passages, SHAPE.passage_tokens, SHAPE.answer_tokens
    ids = torch.randint(2, 400, (B, N, L))  # every passage full length, as the plan assumes
    return ids, torch.ones_like(ids), torch.randint(2, 400, (B, A))


def test_weights_gradients_and_optimizer_states_equal_exact_counts():
    reader = _real_reader(False)
    optimizer = torch.optim.AdamW(reader.parameters())
    ids, mask, labels = _batch()
    reader(ids, mask, labels=labels).loss.backward()
    optimizer.step()
    weights = sum(p.numel() * p.element_size() for p in reader.parameters())
    moments = sum(
        t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
    )
    trace = trace_reader_step(
        T5Config(**T5_SHAPE), SHAPE, StepRun(gradients_held=True, encoder_buckets=3)
    )
    assert trace.at_peak["weights"] == weights  # to the byte
    assert trace.at_peak["gradients"] == weights  # accumulating: every gradient is alive
    assert trace.at_peak["optimizer states"] == moments  # two moments and a step count each


def test_activations_equal_what_the_real_step_saves_for_backward():
    reader = _real_reader(False)
    parameters = {p.untyped_storage().data_ptr() for p in reader.parameters()}
    saved = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    ids, mask, labels = _batch()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        reader(ids, mask, labels=labels)
    trace = trace_reader_step(T5Config(**T5_SHAPE), SHAPE, StepRun(encoder_buckets=3))
    assert trace.forward_activations == pytest.approx(sum(saved.values()), rel=1e-3)


@pytest.fixture
def masks_kept(monkeypatch):
    """The real step as the plan plans it: every passage full length, and each bucket's
    attention mask kept as a bucket holding padding keeps it (transformers drops an all-ones
    mask, which a fake trace cannot see: the data decide)."""
    import transformers.masking_utils

    monkeypatch.setattr(transformers.masking_utils, "_ignore_bidirectional_mask_sdpa",
                        lambda *args, **kwargs: False)  # fmt: skip


def _real_step_peak(reader: FiDReader, ids, mask, labels) -> int:
    """Tensor bytes at the peak of a steady-state step (AdamW's moments exist), counted by
    the plan's tracker on real tensors."""
    optimizer = torch.optim.AdamW(reader.parameters())
    for parameter in reader.parameters():
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    tracker = _PeakTracker()
    tracker.track_external(reader, optimizer)
    with tracker:
        reader(ids, mask, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return _snapshot(tracker, "peak")["total"]


@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_traced_peak_equals_the_real_steps_tensors(checkpointing, masks_kept):
    """The real FiDReader step on real tensors, counted by the same tracker."""
    real = _real_step_peak(_real_reader(checkpointing), *_batch())
    run = StepRun(checkpointing=checkpointing, encoder_buckets=3)
    assert trace_reader_step(T5Config(**T5_SHAPE), SHAPE, run).peak == pytest.approx(real, rel=0.02)


def test_a_checkpointed_step_keeps_each_buckets_position_bias():
    """A checkpointed T5 stack keeps each bucket's (rows, heads, L, L) position bias (the mask
    added) for its backward: an input of every later block's checkpoint. Passages of unequal
    lengths, as real ones (each bucket padded to its longest, its mask kept); at L = 120 the 3
    biases are a third of the step's tensors (a plan without them was 16% under). The plan
    bounds the step from above (it plans full length), closely: 1.1% over."""
    torch.manual_seed(0)
    config = T5Config(**{**T5_SHAPE, "num_heads": 8})
    reader = FiDReader(T5ForConditionalGeneration(config), encoder_buckets=3)
    reader.set_attention("eager", torch.device("cpu"))
    reader.set_activation_checkpointing(True)
    shape = StepShape(questions=1, passages=6, passage_tokens=120, answer_tokens=5)
    lengths = torch.tensor([114, 115, 116, 117, 118, 120])  # every bucket holds padding
    mask = (torch.arange(120) < lengths[:, None]).long().view(1, 6, 120)
    ids = torch.randint(2, 400, (1, 6, 120)) * mask
    real = _real_step_peak(reader.train(), ids, mask, torch.randint(2, 400, (1, 5)))
    planned = trace_reader_step(config, shape, StepRun(checkpointing=True, encoder_buckets=3))
    assert real <= planned.peak <= 1.03 * real


def test_a_cuda_plan_traces_sdpa_as_the_memory_efficient_kernel():
    """CUDA runs T5's biased attention in the memory-efficient kernel, which keeps no
    probabilities; a CPU runs SDPA's math path, which keeps them (and a dropout mask)."""
    config, run = T5Config(**T5_SHAPE), StepRun(encoder_buckets=3, attention="sdpa")
    on_cpu = trace_reader_step(config, SHAPE, run)
    on_cuda = trace_reader_step(config, SHAPE, replace(run, device="cuda"))
    B, N, L, H = SHAPE.questions, SHAPE.passages, SHAPE.passage_tokens, T5_SHAPE["num_heads"]
    probabilities = T5_SHAPE["num_layers"] * B * N * H * L * L * 4  # fp32, one a layer
    assert on_cpu.encoder_activations - on_cuda.encoder_activations >= probabilities
    # the padded bias (L = 40 rows aligned to 48) and the (.., H, 64) log-sum-exp are kept
    assert on_cuda.encoder_activations > T5_SHAPE["num_layers"] * B * N * H * L * 48 * 4
    # nothing of it leaks out of the trace: SDPA is torch's own again
    assert torch.nn.functional.scaled_dot_product_attention.__module__ != "fid.memory.traced_step"


def test_a_cuda_plan_counts_the_cublas_workspaces():
    cuda, cpu = plan_step(_inputs(device="cuda")), plan_step(_inputs())
    assert cuda.components["cuBLAS workspaces"] == 64 * 2**20  # two of Hopper's 32 MiB
    assert "cuBLAS workspaces" not in cpu.components


def test_a_retriever_step_is_traced():
    config = BertConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4,
                        num_hidden_layers=2, vocab_size=400)  # fmt: skip
    small = trace_retriever_step(config, DualEncoderSpec(), StepShape(2, 4, 30, 10), StepRun())
    large = trace_retriever_step(config, DualEncoderSpec(), StepShape(4, 4, 30, 10), StepRun())
    assert small.at_peak["activations"] > 0
    assert large.peak > small.peak  # more questions, more activations


def test_known_models_need_no_network_and_unknown_names_are_one_error():
    with torch.device("meta"):
        t5 = T5ForConditionalGeneration(model_config("google-t5/t5-small"))
    assert sum(p.numel() for p in t5.parameters()) == 60_506_624  # t5-small's published count
    with torch.device("meta"):
        flan = build_t5(model_config("google/flan-t5-small"))
    assert sum(p.numel() for p in flan.parameters()) == 76_961_152  # its own lm_head
    with pytest.raises(ValueError, match="neither a model folder.*t5-base"):
        model_config("no-such-org/no-such-model")


def _inputs(**changes) -> PlanInputs:
    inputs = PlanInputs("train-reader", T5Config(**T5_SHAPE), replace(SHAPE, questions=1),
                        StepRun(encoder_buckets=3), device="cpu")  # fmt: skip
    return replace(inputs, **changes)


def test_the_fit_is_the_largest_batch_under_the_memory_and_shrinks_with_it():
    one = plan_step(_inputs()).peak
    memory = one + 20 * (plan_step(_inputs(shape=replace(SHAPE, questions=2))).peak - one)
    fit = fit_memory(_inputs(), memory, effective_tokens=64 * 6 * 40)
    assert fit.plan.peak <= memory
    bigger = replace(SHAPE, questions=fit.questions + 1)
    assert plan_step(_inputs(shape=bigger)).peak > memory
    assert fit.max_tokens_per_batch == fit.questions * 6 * 40
    assert fit.accumulation == -(-64 // fit.questions)  # keeps the 64 questions a step
    smaller = fit_memory(_inputs(), memory // 2, effective_tokens=64 * 6 * 40)
    assert 0 < smaller.questions < fit.questions


def test_sharding_over_more_ranks_plans_less_per_rank():
    ddp = plan_step(_inputs())
    fsdp = plan_step(_inputs(sharding="fsdp", world_size=4))
    assert fsdp.components["optimizer states"] < ddp.components["optimizer states"]
    assert "FSDP gathered blocks" in fsdp.components
    # replicas: one flat bucket of gradients at a time (fid.training.replicas), no full copy
    from fid.memory.plan import REPLICA_BUCKET_BYTES

    replicas = plan_step(_inputs(world_size=4))
    bucket = replicas.components["gradient averaging bucket"]
    assert bucket == min(REPLICA_BUCKET_BYTES, ddp.components["weights"])
    assert replicas.peak == ddp.peak + bucket


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "train_reader.yaml"
    path.write_text("n_passages: 6\npassage_max_tokens: 40\ntarget_max_tokens: 5\n"
                    "activation_checkpointing: false\nencoder_buckets: 3\n")  # fmt: skip
    return path


def _plan(config, model, *flags):
    argv = ["plan-memory", "--for", "train-reader", "--model", str(model), "--config",
            str(config), "--device", "cpu", *flags]  # fmt: skip
    return main(argv)


def test_plan_memory_says_what_fits(config, tiny_model_dir, capsys):
    assert _plan(config, tiny_model_dir) == 0
    out = capsys.readouterr().out
    assert "activations at the loss" in out and "peak per rank" in out
    assert _plan(config, tiny_model_dir, "--gpu-memory", "4GiB") == 0
    out = capsys.readouterr().out
    assert "fits in 4.00 GiB" in out and "largest that fits: max_tokens_per_batch:" in out


def test_plan_memory_refuses_what_cannot_fit(config, tiny_model_dir, capsys, caplog):
    assert _plan(config, tiny_model_dir, "--gpu-memory", "14MiB") == 1
    out = capsys.readouterr().out
    assert "does NOT fit" in out and "not even one question fits" in out
    assert "does not fit in 14MiB" in caplog.text


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--gpu-memory", "lots"], "--gpu-memory = 'lots' is not a size"),
        (["--gpu-memory", "0GiB"], "is not a size"),
        (["--world-size", "0"], "--world-size = 0 is out of range"),
        (["--answer-tokens", "0"], "--answer-tokens = 0 is out of range"),
    ],
)
def test_bad_plan_inputs_are_one_error(flags, message, config, tiny_model_dir, caplog):
    assert _plan(config, tiny_model_dir, *flags) == 1
    assert message in caplog.text


def test_an_unknown_model_offline_is_one_error(config, caplog):
    assert _plan(config, "someone/unknown-model") == 1
    assert "'someone/unknown-model' is neither a model folder" in caplog.text


def test_sizes():
    assert parse_size("80GiB") == 80 * 2**30
    assert parse_size("40 GB") == 40 * 10**9
    assert parse_size("512mib") == 512 * 2**20


def test_the_heap_keeps_large_blocks_in_their_own_mappings(monkeypatch):
    assert return_freed_memory() is True  # glibc on Linux, as CI's machines
    monkeypatch.setitem(os.environ, "MALLOC_MMAP_THRESHOLD_", "65536")
    assert return_freed_memory() is False  # the user's own setting wins


def test_the_plan_runs_the_step_as_the_config_says(tiny_model_dir):
    from fid.config import ReaderTrainConfig
    from fid.memory.command_plans import command_plan_inputs

    cfg = ReaderTrainConfig(
        n_passages=6,
        passage_max_tokens=40,
        encoder_buckets=1,
        activation_checkpointing=True,
        precision="auto",
        max_new_tokens=20,
    )  # fmt: skip (answers short: the encoder peaks)
    inputs = command_plan_inputs("train-reader", cfg, str(tiny_model_dir), 1, "cpu")
    assert (inputs.run.encoder_buckets, inputs.run.checkpointing) == (1, True)
    assert inputs.run.autocast_dtype is None  # "auto" is fp32 for training on a CPU
    on_gpu = command_plan_inputs("train-reader", cfg, str(tiny_model_dir), 1, "cuda")
    assert on_gpu.run.autocast_dtype == torch.bfloat16 and on_gpu.run.attention == "sdpa"
    assert (inputs.run.device, on_gpu.run.device) == ("cpu", "cuda")  # which kernels it traces
    # one bucket: a checkpointed block recomputes every passage at once, more than in 3
    three = replace(inputs, run=replace(inputs.run, encoder_buckets=3))
    assert plan_step(inputs).peak > plan_step(three).peak


def test_fsdp_accumulation_plans_the_gradients_the_run_holds():
    """Under FSDP with accumulation, fsdp_gradient_sync decides what a rank holds between
    micro-batches (tests/test_sharding.py measures it): its gradient shard (every_micro_batch,
    the default) or every unit's whole gradients (last_micro_batch); the plan counts the same
    (issue 43, item 1: it counted the shard for both)."""
    from fid.config import ReaderTrainConfig
    from fid.memory.command_plans import command_plan_inputs

    def plan(policy):
        cfg = ReaderTrainConfig(sharding="fsdp", gradient_accumulation_steps=2,
                                fsdp_gradient_sync=policy, n_passages=2, passage_max_tokens=16,
                                precision="fp32")  # fmt: skip
        inputs = command_plan_inputs("train-reader", cfg, T5Config(**T5_SHAPE), 4, "cpu")
        return plan_step(inputs)

    every, last = plan("every_micro_batch"), plan("last_micro_batch")
    assert every.inputs.run.gradients_held and last.inputs.run.unsharded_gradients_held
    assert not every.inputs.run.unsharded_gradients_held
    # held whole: about 4x the shard's bytes for the blocks (4 ranks)
    assert last.components["gradients"] > 2 * every.components["gradients"]
    assert last.components["weights"] == every.components["weights"]


def test_fsdp_plans_the_decoder_held_whole_through_dev_generation():
    """Dev generation under FSDP keeps the decoder gathered (issue 43.2: one all-gather, not
    one per token): the plan holds the rank's shards and the whole decoder at least, and says
    so; a wide decoder over many ranks makes that the run's peak."""
    from fid.config import ReaderTrainConfig
    from fid.memory.command_plans import command_plan_inputs

    # a deep, wide decoder: its blocks whole outweigh the step's activations and 2 gathered blocks
    shape = dict(T5_SHAPE, d_ff=4096, num_decoder_layers=12)
    cfg = ReaderTrainConfig(sharding="fsdp", n_passages=2, passage_max_tokens=8, precision="fp32")
    plan = plan_step(command_plan_inputs("train-reader", cfg, T5Config(**shape), 8, "cpu"))
    decoder = plan.notes["dev generation holds the decoder whole"]
    assert decoder > 0
    held = plan.components["weights"] + plan.components["optimizer states"] + decoder * 7 // 8
    assert plan.peak >= held
    assert plan.components["dev generation's whole decoder, beyond the step"] > 0
    replicated = ReaderTrainConfig(n_passages=2, passage_max_tokens=8, precision="fp32")
    plain = plan_step(command_plan_inputs("train-reader", replicated, T5Config(**shape), 8, "cpu"))
    assert "dev generation holds the decoder whole" not in plain.notes
