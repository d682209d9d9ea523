"""Reader variants that are fine-tuned (fid.models.reader_variants): FiD-Light's first-k encoder
vectors per passage and FiDO's layer-sparse cross-attention. Each is exact where it should be,
removes what it says, and trains, resumes, exports and loads back like any reader."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch
import yaml
from conftest import TINY, write_json
from safetensors.torch import load_file
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput

from fid.cli import main
from fid.config import ConfigError, EvalReaderConfig, InitReaderConfig, ReaderTrainConfig
from fid.data.examples import load_examples
from fid.data.reader_batches import ReaderCollator
from fid.demo.tiny_models import build_tiny_t5
from fid.inference.batching import reader_and_collator
from fid.models.cross_attention_bias import add_cross_attention_bias
from fid.models.loading import load_reader, load_t5
from fid.models.reader import FiDReader
from fid.models.reader_variants import NoCrossAttention, cross_attention_layers
from fid.models.settings import READER_SETTINGS_FILE, ModelSettingsError
from fid.training import reader as reader_training
from fid.training.reader import train_reader

# Passage lengths of the test batch (the toy passages all fill 40 tokens): some shorter than
# the k tested, question 1 with only two passages.
LENGTHS = torch.tensor([[40, 7, 23, 2, 15], [31, 5, 0, 0, 0], [12, 40, 9, 3, 27]])


def _batch(tokenizer, toy_records, tmp_path):
    path = write_json(tmp_path / "q.json", toy_records["train"][:3])
    examples = load_examples(path)
    examples[1].ctxs = examples[1].ctxs[:2]  # a question with fewer passages than slots
    collator = ReaderCollator(tokenizer, n_passages=5, passage_max_tokens=40)
    batch = collator(examples, [e.answers[0] for e in examples])
    mask = (torch.arange(40) < LENGTHS[..., None]).long()  # (B, N, L) right-padded
    assert torch.equal(batch.attention_mask.sum(-1) > 0, LENGTHS > 0)
    return dataclasses.replace(batch, input_ids=batch.input_ids * mask, attention_mask=mask)


def _logits(reader, batch):
    return reader(batch.input_ids, batch.attention_mask, labels=batch.labels).logits


@pytest.fixture
def t5_3(tokenizer):
    """A tiny T5 with 3 decoder layers: K = 2 keeps layers 0 and 2 (as many encoder layers:
    transformers 5.24 sizes generate's DynamicCache by the encoder's layer count)."""
    sizes = {**TINY, "num_layers": 3, "num_decoder_layers": 3}
    return build_tiny_t5(InitReaderConfig(vocab_size=400, **sizes), vocab_size=len(tokenizer))


# ---------------------------------------------------------------- FiD-Light


def test_light_tokens_past_the_longest_passage_is_the_plain_reader(
    tiny_t5, tokenizer, toy_records, tmp_path
):
    batch = _batch(tokenizer, toy_records, tmp_path)
    plain = FiDReader(tiny_t5, encoder_buckets=3).eval()
    light = FiDReader(tiny_t5, encoder_buckets=3, light_tokens=int(LENGTHS.max())).eval()
    torch.testing.assert_close(_logits(light, batch), _logits(plain, batch))
    for beams in (1, 3):
        assert torch.equal(
            light.generate(batch.input_ids, batch.attention_mask, 6, beams),
            plain.generate(batch.input_ids, batch.attention_mask, 6, beams),
        )
    torch.testing.assert_close(
        light.passage_scores(batch.input_ids, batch.attention_mask),
        plain.passage_scores(batch.input_ids, batch.attention_mask),
        equal_nan=True,
    )


@pytest.mark.parametrize("pack", [True, False])
def test_light_tokens_hand_the_decoder_the_first_k_of_each_passage(
    tiny_t5, tokenizer, toy_records, tmp_path, pack
):
    batch = _batch(tokenizer, toy_records, tmp_path)
    k = 3
    reader = FiDReader(tiny_t5, encoder_buckets=2, pack_passages=pack, light_tokens=k).eval()
    with torch.no_grad():
        encoding = reader.encode(batch.input_ids, batch.attention_mask)
    lengths = batch.attention_mask.sum(-1)  # (B, N)
    B, N, _ = batch.input_ids.shape
    expected_T = int(lengths.clamp(max=k).sum(1).max()) if pack else N * k
    assert encoding.hidden.shape[1] == expected_T
    for b in range(B):
        for n in range(N):
            length = int(lengths[b, n])
            rows = encoding.token_passage[b] == n
            assert int(rows.sum()) == min(length, k)
            if length == 0:
                continue
            # The passage encoded whole, then its first k vectors, in order.
            with torch.no_grad():
                alone = tiny_t5.encoder(
                    input_ids=batch.input_ids[b, n, None, :length]
                ).last_hidden_state[0]
            torch.testing.assert_close(encoding.hidden[b][rows], alone[:k], atol=1e-5, rtol=1e-5)
            assert bool(encoding.mask[b][rows].all())
    assert int(encoding.mask.sum()) == int(lengths.clamp(max=k).sum())


# ---------------------------------------------------------------- FiDO


def test_cross_attention_in_every_layer_is_the_plain_reader(
    tiny_t5, tokenizer, toy_records, tmp_path
):
    batch = _batch(tokenizer, toy_records, tmp_path)
    plain = _logits(FiDReader(tiny_t5).eval(), batch)
    every = FiDReader(tiny_t5, cross_attention_every=1).eval()
    assert cross_attention_layers(tiny_t5) == [0, 1] and every.cross_attention_every == 1
    torch.testing.assert_close(_logits(every, batch), plain)


def test_sparse_cross_attention_does_not_read_the_removed_layers(
    t5_3, tokenizer, toy_records, tmp_path
):
    batch = _batch(tokenizer, toy_records, tmp_path)
    dense_logits = _logits(FiDReader(copy.deepcopy(t5_3)).eval(), batch)
    other = copy.deepcopy(t5_3)  # layer 1's cross-attention weights changed
    with torch.no_grad():
        for p in other.decoder.block[1].layer[1].parameters():
            p.normal_()
    assert not torch.allclose(_logits(FiDReader(copy.deepcopy(other)).eval(), batch), dense_logits)

    sparse = FiDReader(t5_3, cross_attention_every=2).eval()
    sparse_other = FiDReader(other, cross_attention_every=2).eval()
    assert cross_attention_layers(t5_3) == [0, 2] and sparse.cross_attention_every == 2
    block = t5_3.decoder.block[1]
    assert isinstance(block.layer[1], NoCrossAttention)
    assert not hasattr(block.layer[1], "EncDecAttention")  # how other code recognises it
    assert not any(".decoder.block.1.layer.1." in name for name, _ in sparse.named_parameters())
    logits = _logits(sparse, batch)
    torch.testing.assert_close(logits, _logits(sparse_other, batch))
    assert not torch.allclose(logits, dense_logits)
    # Scoring averages over the layers that read the encoder.
    scores = sparse.passage_scores(batch.input_ids, batch.attention_mask)
    real = batch.attention_mask.sum(-1) > 0
    assert bool(scores[real].isfinite().all()) and bool(scores[~real].isnan().all())


def test_sparse_generation_with_the_cache_equals_without(t5_3, tokenizer, toy_records, tmp_path):
    batch = _batch(tokenizer, toy_records, tmp_path)
    reader = FiDReader(t5_3, cross_attention_every=2).eval()
    encoding = reader.encode(batch.input_ids, batch.attention_mask)
    for beams in (3, 1):
        runs = [
            reader.t5.generate(
                encoder_outputs=BaseModelOutput(last_hidden_state=encoding.hidden),
                attention_mask=encoding.mask, max_new_tokens=6, num_beams=beams,
                do_sample=False, use_cache=use_cache, output_scores=True,
                return_dict_in_generate=True,
            )
            for use_cache in (True, False)
        ]  # fmt: skip
        assert torch.equal(runs[0].sequences, runs[1].sequences)
        for cached, uncached in zip(runs[0].scores, runs[1].scores, strict=True):
            torch.testing.assert_close(cached, uncached, atol=1e-5, rtol=1e-5)
    greedy = reader.generate(batch.input_ids, batch.attention_mask, 6)  # with the cache
    assert torch.equal(greedy, runs[0].sequences)

    # A removed layer leaves its cross-attention cache entry empty (keys None).
    cache = EncoderDecoderCache(DynamicCache(config=t5_3.config), DynamicCache(config=t5_3.config))
    start = torch.zeros(len(batch.labels), 1, dtype=torch.long)
    with torch.no_grad():
        reader.t5(
            encoder_outputs=BaseModelOutput(last_hidden_state=encoding.hidden),
            attention_mask=encoding.mask, decoder_input_ids=start, cache=cache, use_cache=True,
        )  # fmt: skip
    layers = cache.cross_attention_cache.layers
    assert [getattr(layers[i], "keys", None) is not None for i in range(3)] == [True, False, True]


# ---------------------------------------------------------------- bad knobs


def test_bad_variant_knobs_are_config_errors(tiny_t5):
    for cls, key, value in (
        (ReaderTrainConfig, "light_tokens", 0),
        (ReaderTrainConfig, "cross_attention_every", 0),
        (EvalReaderConfig, "light_tokens", -2),
    ):
        with pytest.raises(ConfigError, match=f"{key} = {value}"):
            cls(**{key: value})
    with pytest.raises(ConfigError, match="cross_attention_every = 3 .*decoder has 2 layers"):
        FiDReader(tiny_t5, cross_attention_every=3)
    with pytest.raises(ConfigError, match="light_tokens = 0"):
        FiDReader(tiny_t5, light_tokens=0)
    FiDReader(tiny_t5, cross_attention_every=2)
    with pytest.raises(ConfigError, match="cross_attention_every = 1 .*cannot be restored"):
        FiDReader(tiny_t5, cross_attention_every=1)


def test_a_model_with_a_cross_attention_bias_refuses_both_variants(tiny_t5):
    add_cross_attention_bias(tiny_t5, torch.randn(32, TINY["num_heads"]))
    for knob in ({"light_tokens": 4}, {"cross_attention_every": 2}):
        with pytest.raises(ConfigError, match=f"{next(iter(knob))} = .*position bias"):
            FiDReader(tiny_t5, **knob)
    FiDReader(tiny_t5, light_tokens=None, cross_attention_every=1)  # the plain reader is fine


# ---------------------------------------------------------------- fine-tuning


def _train_config(**variant):
    return ReaderTrainConfig(
        n_passages=3, passage_max_tokens=24, batch_size_per_device=2, max_steps=4,
        warmup_steps=0, lr=1e-3, eval_every_steps=2, save_every_steps=2, log_every_steps=1,
        eval_max_questions=2, eval_batch_size=2, max_new_tokens=3, precision="fp32",
        tensorboard=False, **variant,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("variant", "recorded"),
    [
        ({"light_tokens": 4}, {"light_tokens": 4}),
        ({"cross_attention_every": 2}, {"cross_attention_every": 2}),
    ],
)
def test_a_variant_is_fine_tuned_resumed_exported_and_loaded(
    tmp_path, tiny_model_dir, toy_records, monkeypatch, caplog, variant, recorded
):
    """The start model is an existing full reader (a T5 folder); the config makes it a variant."""
    train = write_json(tmp_path / "train.json", toy_records["train"][:8])
    dev = write_json(tmp_path / "dev.json", toy_records["dev"][:2])
    cfg = _train_config(**variant)
    cpu = torch.device("cpu")
    straight = tmp_path / "straight"
    train_reader(cfg, train, dev, str(tiny_model_dir), straight / "model", straight / "state", cpu)

    original_loss = reader_training.ReaderTask.loss
    calls = {"n": 0}

    def crashing_loss(self, model, item):
        calls["n"] += 1
        if calls["n"] == 3:  # inside step 3, after the checkpoint of step 2
            raise KeyboardInterrupt("simulated kill")
        return original_loss(self, model, item)

    monkeypatch.setattr(reader_training.ReaderTask, "loss", crashing_loss)
    resumed = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        train_reader(
            cfg, train, dev, str(tiny_model_dir), resumed / "model", resumed / "state", cpu
        )
    assert sorted(p.name for p in (resumed / "state").glob("step-*")) == ["step-2"]
    monkeypatch.setattr(reader_training.ReaderTask, "loss", original_loss)
    train_reader(cfg, train, dev, str(tiny_model_dir), resumed / "model", resumed / "state", cpu)

    model = resumed / "model"
    a, b = (
        load_file(straight / "model" / "model.safetensors"),
        load_file(model / "model.safetensors"),
    )
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    layer_1 = [k for k in b if k.startswith("decoder.block.1.layer.1.")]
    assert not layer_1 if "cross_attention_every" in variant else layer_1  # removed: dropped
    settings = json.loads((model / READER_SETTINGS_FILE).read_text())
    assert {k: settings.get(k) for k in recorded} == recorded
    assert ("light_tokens" in settings) == ("light_tokens" in variant)  # only when set

    # Loaded back by eval and scoring as trained, and it generates.
    reader, tokenizer, collator = reader_and_collator(EvalReaderConfig(n_passages=3), model, cpu)
    assert reader.light_tokens == variant.get("light_tokens")
    assert reader.cross_attention_every == variant.get("cross_attention_every", 1)
    examples = load_examples(dev)
    batch = collator(examples)
    answers = reader.generate(batch.input_ids, batch.attention_mask, 3)
    assert answers.shape[0] == len(examples)
    straight_reader, *_ = reader_and_collator(
        EvalReaderConfig(n_passages=3), straight / "model", cpu
    )
    assert torch.equal(answers, straight_reader.generate(batch.input_ids, batch.attention_mask, 3))

    if "light_tokens" in variant:  # another k than the model's is refused unless overridden
        with pytest.raises(ModelSettingsError, match="light_tokens = 8 in the config"):
            reader_and_collator(EvalReaderConfig(light_tokens=8), model, cpu)
        cfg8 = EvalReaderConfig(light_tokens=8, override_model_settings=True)
        assert reader_and_collator(cfg8, model, cpu)[0].light_tokens == 8
    else:  # removed layers cannot come back; more can go (K a multiple of 2)
        with pytest.raises(ConfigError, match="cannot be restored"):
            load_reader(str(model), 1, True, cross_attention_every=1)
        assert load_reader(str(model), 1, True)[0].cross_attention_every == 2
        assert FiDReader(load_t5(str(model))).cross_attention_every == 2


def test_train_reader_names_a_bad_knob_for_the_start_model(
    tmp_path, tiny_model_dir, toy_records, caplog
):
    train = write_json(tmp_path / "train.json", toy_records["train"][:2])
    dev = write_json(tmp_path / "dev.json", toy_records["dev"][:1])
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({"cross_attention_every": 5, "max_steps": 1}))
    status = main(["train-reader", "--config", str(config), "--train", str(train), "--dev",
                   str(dev), "--init-model", str(tiny_model_dir), "--output",
                   str(tmp_path / "model"), "--state-dir", str(tmp_path / "state")])  # fmt: skip
    assert status == 1
    assert "cross_attention_every = 5 is out of range" in caplog.text
    assert "decoder has 2 layers" in caplog.text
    assert not (tmp_path / "model").exists()
