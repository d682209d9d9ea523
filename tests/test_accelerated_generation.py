"""Passage pruning and token elimination (fid.inference.accelerated_generation): exact when
they keep everything, and they keep what the brute-force first-step attention ranks highest."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import write_json

from fid.config import ConfigError, EvalReaderConfig
from fid.data.examples import load_examples
from fid.data.reader_batches import ReaderCollator
from fid.inference import accelerated_generation
from fid.inference.accelerated_generation import accelerated_generate
from fid.models.reader import FiDReader

STEPS = 6


@pytest.fixture
def batch(tokenizer, toy_records, tmp_path):
    """3 questions x 6 passage slots; question 1 has only 2 passages (empty slots)."""
    examples = load_examples(write_json(tmp_path / "q.json", toy_records["dev"][:3]))
    examples[1].ctxs = examples[1].ctxs[:2]
    return ReaderCollator(tokenizer, n_passages=6, passage_max_tokens=40)(examples)


@pytest.fixture
def reader(tiny_t5):
    torch.manual_seed(0)
    return FiDReader(tiny_t5, encoder_buckets=3).eval()


def _recorded_encodings(monkeypatch) -> list:
    """The encodings that `_keep_tokens` returns, in call order."""
    seen = []
    original = accelerated_generation._keep_tokens

    def record(encoding, cache, keep):
        kept = original(encoding, cache, keep)
        seen.append((encoding, keep, kept))
        return kept

    monkeypatch.setattr(accelerated_generation, "_keep_tokens", record)
    return seen


@pytest.mark.parametrize(
    "knobs",
    [
        {"keep_passages": 6},
        {"keep_tokens": 100.0},
        {"keep_tokens": 100.0, "keep_tokens_step": 3, "keep_tokens_layer": 1},
        {"keep_tokens": 100.0, "keep_tokens_layer": 0},  # layer 1 cut inside step 1
        {"keep_tokens": 100.0, "keep_tokens_step": 2, "keep_tokens_layer": 0},  # its cache
        {"keep_passages": 99, "keep_tokens": 100.0, "keep_tokens_by_value_norm": True},
    ],
)
def test_keeping_everything_gives_the_plain_answers(reader, batch, knobs, monkeypatch):
    seen = _recorded_encodings(monkeypatch)
    plain = reader.generate(batch.input_ids, batch.attention_mask, STEPS)
    fast = accelerated_generate(
        reader, batch.input_ids, batch.attention_mask, STEPS, EvalReaderConfig(**knobs)
    )
    assert torch.equal(plain, fast)
    assert seen, "the cache was never cut: the test would not exercise the gather"


def test_one_question_without_padding_keeps_the_plain_answer(reader, batch):
    # B = 1: the kernel gets no encoder mask at all; the cut inside the step builds one
    ids, mask = batch.input_ids[:1], batch.attention_mask[:1]
    cfg = EvalReaderConfig(keep_tokens=100.0, keep_tokens_layer=0)
    plain = reader.generate(ids, mask, STEPS)
    assert torch.equal(plain, accelerated_generate(reader, ids, mask, STEPS, cfg))


def test_layers_after_the_chosen_one_project_only_the_kept_tokens(reader, batch, monkeypatch):
    seen = _recorded_encodings(monkeypatch)
    widths = []
    k = reader.t5.decoder.block[1].layer[1].EncDecAttention.k
    handle = k.register_forward_hook(lambda module, args, out: widths.append(out.shape[1]))
    cfg = EvalReaderConfig(keep_tokens=20.0, keep_tokens_layer=0)
    accelerated_generate(reader, batch.input_ids, batch.attention_mask, STEPS, cfg)
    handle.remove()
    before, keep, after = seen[0]
    # layer 1 projected keys once (step 1), for the kept tokens only: T' of T
    assert widths == [after.mask.shape[1]] and after.mask.shape[1] < before.mask.shape[1]
    assert int(keep.sum(dim=1).max()) == after.mask.shape[1]


def test_pruning_keeps_the_passages_first_step_attention_ranks_highest(reader, batch, monkeypatch):
    seen = _recorded_encodings(monkeypatch)
    cfg = EvalReaderConfig(keep_passages=2, keep_passages_by="mean_logit")
    accelerated_generate(reader, batch.input_ids, batch.attention_mask, STEPS, cfg)
    brute = reader.passage_scores(batch.input_ids, batch.attention_mask, "mean_logit")  # (B, N)
    before, _, after = seen[0]
    assert len(seen) == 1  # pruned once, after the first step
    for b in range(len(brute)):
        ranked = [n for n in brute[b].argsort(descending=True).tolist() if not brute[b, n].isnan()]
        kept = set(after.token_passage[b][after.mask[b].bool()].tolist())
        assert kept == set(ranked[:2])
        # every token of the kept passages, and nothing else
        wanted = sum(int((before.token_passage[b] == n).sum()) for n in ranked[:2])
        assert int(after.mask[b].sum()) == wanted


def test_token_elimination_keeps_the_top_tokens_of_the_chosen_layer(reader, batch, monkeypatch):
    seen = _recorded_encodings(monkeypatch)
    cfg = EvalReaderConfig(keep_tokens=30.0, keep_tokens_step=1, keep_tokens_layer=1)
    accelerated_generate(reader, batch.input_ids, batch.attention_mask, STEPS, cfg)
    before, keep, after = seen[0]
    # Brute force: layer 1's cross-attention probabilities at the first step, mean over heads.
    t5 = reader.t5
    t5.set_attn_implementation("eager")
    start = torch.full((len(keep), 1), t5.config.decoder_start_token_id)
    out = t5.decoder(
        input_ids=start,
        encoder_hidden_states=before.hidden,
        encoder_attention_mask=before.mask,
        output_attentions=True,
    )
    probs = out.cross_attentions[1][:, :, 0].mean(dim=1)  # (B, T)
    for b in range(len(keep)):
        real = before.mask[b].bool()
        n_keep = math.ceil(int(real.sum()) * 30 / 100)
        top = set(probs[b].masked_fill(~real, -1).argsort(descending=True)[:n_keep].tolist())
        assert set(torch.nonzero(keep[b]).squeeze(1).tolist()) == top
        assert int(after.mask[b].sum()) == n_keep
        # the kept tokens' states, in their original order
        kept_rows = sorted(top)
        torch.testing.assert_close(after.hidden[b, :n_keep], before.hidden[b, kept_rows])


def test_pruning_decides_the_first_token_over_every_passage(reader, batch):
    # One passage of six: the answers after the first token may differ; the first may not.
    plain = reader.generate(batch.input_ids, batch.attention_mask, STEPS)
    pruned = accelerated_generate(
        reader, batch.input_ids, batch.attention_mask, STEPS, EvalReaderConfig(keep_passages=1)
    )
    assert torch.equal(plain[:, :2], pruned[:, :2])


@pytest.mark.parametrize(
    "knobs, key",
    [
        ({"keep_passages": 0}, "keep_passages"),
        ({"keep_tokens": 0.0}, "keep_tokens"),
        ({"keep_tokens": 100.5}, "keep_tokens"),
        ({"keep_tokens": float("nan")}, "keep_tokens"),
        ({"keep_tokens": 50.0, "keep_tokens_step": 0}, "keep_tokens_step"),
        ({"keep_tokens": 50.0, "keep_tokens_layer": -1}, "keep_tokens_layer"),
        ({"keep_passages": 3, "num_beams": 4}, "num_beams"),
        ({"keep_passages": 3, "keep_tokens": 10.0, "keep_tokens_layer": 0}, "keep_tokens_step 1"),
    ],
)
def test_bad_knobs_are_config_errors(knobs, key):
    with pytest.raises(ConfigError, match=key):
        EvalReaderConfig(**knobs)


def test_a_layer_the_decoder_lacks_is_a_config_error(reader, batch):
    cfg = EvalReaderConfig(keep_tokens=50.0, keep_tokens_layer=7)
    with pytest.raises(ConfigError, match="keep_tokens_layer = 7 .* 2 layers"):
        accelerated_generate(reader, batch.input_ids, batch.attention_mask, STEPS, cfg)
