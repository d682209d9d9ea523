"""`fid plan-memory --for eval-reader|score-passages|embed-passages` (fid.memory.inference_plan):
the traced batch equals the real command's tensors, counted by the same tracker; the fit, the
command line."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from transformers import T5Config, T5ForConditionalGeneration

from fid.cli import main
from fid.memory.inference_plan import InferenceInputs, _trace, fit_inference, plan_inference
from fid.memory.traced_step import _PeakTracker, _Root, _snapshot
from fid.models.reader import FiDReader

T5_SHAPE = dict(d_model=32, d_ff=64, d_kv=8, num_layers=2, num_decoder_layers=2, num_heads=4,
                vocab_size=400, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)  # fmt: skip
B, N, L, A = 2, 6, 40, 5


def _real_peak(run) -> int:
    torch.manual_seed(0)
    reader = FiDReader(T5ForConditionalGeneration(T5Config(**T5_SHAPE)), encoder_buckets=3)
    reader.set_attention("eager", torch.device("cpu"))
    reader.eval()
    ids = torch.randint(2, 400, (B, N, L))  # every passage full length, as the plan assumes
    tracker = _PeakTracker()
    tracker.track_external(reader)
    labels = torch.randint(2, 400, (B, A))
    with tracker, torch.no_grad():  # one root call, as the trace makes (MemTracker's rule)
        _Root(reader, lambda _: run(reader, ids, torch.ones_like(ids), labels))(tracker)
    return _snapshot(tracker, "peak")["total"]


@pytest.mark.parametrize(
    ("mode", "beams"),
    [("generate", 1), ("generate", 3), ("mean_logit", 1), ("attention_mass", 1), ("pdist", 1),
     ("loop", 1)],
)  # fmt: skip
def test_the_traced_batch_equals_the_real_commands_tensors(mode, beams):
    def run(reader, ids, mask, labels):
        if mode == "generate":
            reader.generate(ids, mask, max_new_tokens=A, num_beams=beams)
        elif mode in ("mean_logit", "attention_mass"):
            reader.passage_scores(ids, mask, mode)
        elif mode == "pdist":
            reader.answer_log_likelihoods(ids, mask, labels)
        else:
            reader.leave_one_out_log_likelihoods(ids, mask, labels)

    real = _real_peak(run)
    command = "eval-reader" if mode == "generate" else "score-passages"
    inputs = InferenceInputs(command, T5Config(**T5_SHAPE), B, N, L, A, mode=mode,
                             num_beams=beams, device="cpu", encoder_buckets=3)  # fmt: skip
    assert _trace(inputs)["total"] == pytest.approx(real, rel=0.02)  # 0.983-1.014 measured


def test_generation_plans_the_cross_attention_cache_that_grows_with_the_passages():
    def plan(passages, beams=1):
        inputs = InferenceInputs("eval-reader", T5Config(**T5_SHAPE), 4, passages, L,
                                 device="cuda", attention="sdpa", num_beams=beams)  # fmt: skip
        return plan_inference(inputs)

    small, large = plan(8), plan(64)
    cache = large.notes["cross-attention cache (keys and values)"]
    assert cache == 2 * 2 * 4 * 64 * L * 4 * 8 * 4  # keys and values x layers x B x T x H x dk
    assert large.peak - small.peak > cache * (1 - 8 / 64)  # the states and the cache
    assert plan(8, beams=4).peak > small.peak  # each beam its own copy of the states
    assert small.components["cuBLAS workspace"] == 32 * 2**20  # the forward's thread only


def test_the_fit_is_the_largest_batch_under_the_memory():
    inputs = InferenceInputs("score-passages", T5Config(**T5_SHAPE), 1, N, L, A,
                             mode="mean_logit", device="cpu", encoder_buckets=3)  # fmt: skip
    one = plan_inference(inputs).peak
    memory = one + 6 * (plan_inference(replace(inputs, batch=2)).peak - one)
    fit = fit_inference(inputs, memory)
    assert fit.batch >= 2 and fit.plan.peak <= memory
    assert plan_inference(replace(inputs, batch=fit.batch + 1)).peak > memory
    assert fit_inference(inputs, one - 1).batch == 0


@pytest.fixture
def eval_config(tmp_path):
    path = tmp_path / "eval.yaml"
    path.write_text("n_passages: 6\neval_batch_size: 4\nmax_new_tokens: 5\nencoder_buckets: 3\n")
    return path


def _plan(command, config, model, *flags):
    return main(["plan-memory", "--for", command, "--model", str(model), "--config", str(config),
                 "--device", "cpu", *flags])  # fmt: skip


def test_plan_memory_plans_inference_commands(eval_config, tiny_model_dir, tmp_path, capsys):
    assert _plan("eval-reader", eval_config, tiny_model_dir, "--gpu-memory", "4GiB") == 0
    out = capsys.readouterr().out
    assert "fid eval-reader from" in out and "4 question(s) x 6 passages x 250 tokens" in out
    assert "cross-attention cache" in out and "largest that fits: eval_batch_size:" in out
    score = tmp_path / "score.yaml"
    score.write_text("n_passages: 6\nbatch_size: 2\nmode: pdist\npassage_max_tokens: 40\n")
    assert _plan("score-passages", score, tiny_model_dir, "--answer-tokens", "7") == 0
    assert "2 question(s) x 6 passages x 40 tokens, pdist" in capsys.readouterr().out
    score.write_text("n_passages: 6\nbatch_size: 2\nmode: uniform\npassage_max_tokens: 40\n")
    assert _plan("score-passages", score, tiny_model_dir) == 0  # the control: no forward
    assert "2 question(s) x 6 passages x 40 tokens, uniform" in capsys.readouterr().out
    assert _plan("eval-reader", eval_config, tiny_model_dir, "--gpu-memory", "1MiB") == 1
    assert "not even a batch of one fits" in capsys.readouterr().out


def test_embed_passages_is_planned_from_a_retriever_folder(tmp_path, capsys):
    from transformers import BertConfig, BertModel

    from fid.models.retriever import DualEncoder, DualEncoderSpec

    encoder = BertModel(BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=32, vocab_size=300))  # fmt: skip
    spec = DualEncoderSpec(projection_dim=8, passage_max_tokens=48)
    DualEncoder(encoder, None, spec).save_pretrained(tmp_path / "retriever")
    config = tmp_path / "embed.yaml"
    config.write_text("batch_size: 32\n")
    assert _plan("embed-passages", config, tmp_path / "retriever") == 0
    out = capsys.readouterr().out
    assert "fid embed-passages from" in out and "32 passage(s) x 48 tokens" in out
