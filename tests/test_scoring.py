"""Passage scores from cross-attention, checked against a brute-force computation."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import write_json

from fid.data.examples import load_examples
from fid.data.reader_batches import ReaderCollator
from fid.models.reader import FiDReader


@pytest.fixture
def batch(tokenizer, toy_records, tmp_path):
    examples = load_examples(write_json(tmp_path / "q.json", toy_records["dev"][:3]))
    examples[2].ctxs = examples[2].ctxs[:4]  # fewer passages than slots
    return ReaderCollator(tokenizer, n_passages=6, passage_max_tokens=48)(examples)


def brute_force_scores(t5, input_ids, attention_mask, mode):
    """Question by question, passage by passage, token by token, with plain HF modules.

    mean_logit: q.k computed from the decoder's per-layer states, averaged over heads, layers
    and the passage's tokens. attention_mass: HF's own eager cross-attention probabilities
    (B, H, 1, T), summed per passage, averaged over heads and layers.
    """
    B, N, L = input_ids.shape
    H, layers = t5.config.num_heads, t5.config.num_decoder_layers
    scores = torch.full((B, N), math.nan)
    for b in range(B):
        states, owner = [], []
        for n in range(N):
            length = int(attention_mask[b, n].sum())
            if length == 0:
                continue
            hidden = t5.encoder(input_ids=input_ids[b, n, :length][None]).last_hidden_state[0]
            states.append(hidden)
            owner += [n] * length
        encoder_states = torch.cat(states)[None]  # (1, T, D)
        owner = torch.tensor(owner)
        start = torch.tensor([[t5.config.decoder_start_token_id]])
        if mode == "attention_mass":
            t5.set_attn_implementation("eager")
            out = t5.decoder(
                input_ids=start, encoder_hidden_states=encoder_states, output_attentions=True
            )
            t5.set_attn_implementation("sdpa")
            probs = torch.stack(out.cross_attentions)[:, 0, :, 0, :]  # (layers, H, T)
            for n in owner.unique().tolist():
                scores[b, n] = probs[:, :, owner == n].sum(-1).mean()
            continue
        out = t5.decoder(
            input_ids=start, encoder_hidden_states=encoder_states, output_hidden_states=True
        )
        total = torch.zeros(N)
        for layer, block in enumerate(t5.decoder.block):
            after_self = block.layer[0](out.hidden_states[layer])[0]
            cross = block.layer[1]
            q = cross.EncDecAttention.q(cross.layer_norm(after_self))[0, 0].view(H, -1)
            k = cross.EncDecAttention.k(encoder_states)[0].view(-1, H, q.shape[-1])
            for t in range(k.shape[0]):
                for h in range(H):
                    total[owner[t]] += float(q[h] @ k[t, h])
        for n in owner.unique().tolist():
            scores[b, n] = total[n] / (H * layers * int((owner == n).sum()))
    return scores


@pytest.mark.parametrize("mode", ["mean_logit", "attention_mass"])
def test_scores_match_brute_force(tiny_t5, batch, mode):
    reader = FiDReader(tiny_t5, encoder_buckets=3).eval()
    with torch.no_grad():
        ours = reader.passage_scores(batch.input_ids, batch.attention_mask, mode)
        expected = brute_force_scores(tiny_t5, batch.input_ids, batch.attention_mask, mode)
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=1e-4, equal_nan=True)
    assert torch.isnan(ours[2, 4:]).all() and not torch.isnan(ours[2, :4]).any()
    if mode == "attention_mass":
        # Each question's passages share the whole attention mass.
        torch.testing.assert_close(ours.nan_to_num().sum(1), torch.ones(3))


@pytest.mark.parametrize("mode", ["mean_logit", "attention_mass"])
@pytest.mark.parametrize("pack", [True, False])
def test_scores_independent_of_padding_and_batch(tiny_t5, batch, mode, pack):
    reader = FiDReader(tiny_t5, encoder_buckets=2, pack_passages=pack).eval()
    together = reader.passage_scores(batch.input_ids, batch.attention_mask, mode)
    padded = reader.passage_scores(
        torch.nn.functional.pad(batch.input_ids, (0, 20)),
        torch.nn.functional.pad(batch.attention_mask, (0, 20)),
        mode,
    )
    torch.testing.assert_close(together, padded, equal_nan=True, atol=1e-5, rtol=1e-5)
    for b in range(3):
        alone = reader.passage_scores(
            batch.input_ids[b : b + 1], batch.attention_mask[b : b + 1], mode
        )
        torch.testing.assert_close(together[b : b + 1], alone, equal_nan=True, atol=1e-5, rtol=1e-5)


def test_scores_under_bf16_autocast_are_float32(tiny_t5, batch):
    reader = FiDReader(tiny_t5).eval()
    exact = reader.passage_scores(batch.input_ids, batch.attention_mask, "attention_mass")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = reader.passage_scores(batch.input_ids, batch.attention_mask, "attention_mass")
    assert mixed.dtype == torch.float32
    torch.testing.assert_close(mixed, exact, atol=2e-2, rtol=5e-2, equal_nan=True)


def test_pdist_equals_one_fid_pass_per_passage(tiny_t5, tokenizer, toy_records, tmp_path):
    """Atlas's PDist teacher, batched (the N passages of a question as N single-passage inputs,
    in chunks), equals N separate FiD passes, one per passage alone: log p(answer | q, passage)
    = -(the reader's mean token loss x the answer's tokens), in fp32 within 1e-5."""
    import copy

    examples = load_examples(write_json(tmp_path / "q.json", toy_records["dev"][:3]))
    examples[2].ctxs = examples[2].ctxs[:4]  # fewer passages than slots: NaN there
    answers = [e.answers[0] for e in examples]
    collator = ReaderCollator(tokenizer, n_passages=6, passage_max_tokens=48)
    batch = collator(examples, answers)
    reader = FiDReader(tiny_t5, encoder_buckets=2).eval()
    with torch.no_grad():
        ours = reader.answer_log_likelihoods(
            batch.input_ids, batch.attention_mask, batch.labels, rows_per_pass=5
        )
        expected = torch.full((3, 6), float("nan"))
        for b, example in enumerate(examples):
            for n, ctx in enumerate(batch.ctx_indices[b]):  # slot n reads ctxs[ctx]
                alone = copy.copy(example)
                alone.ctxs = [example.ctxs[ctx]]
                one = ReaderCollator(tokenizer, n_passages=1, passage_max_tokens=48)(
                    [alone], [answers[b]]
                )
                loss = reader(one.input_ids, one.attention_mask, labels=one.labels).loss
                expected[b, n] = -loss * int((one.labels != -100).sum())
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5, equal_nan=True)
    assert torch.isnan(ours[2, 4:]).all() and (ours[:, :4] < 0).all()


def test_pdist_scores_through_the_command_and_refuses_a_question_without_answers(
    tiny_model_dir, toy_records, tmp_path, capsys
):
    import json

    import yaml

    from fid.cli import main

    config = tmp_path / "score.yaml"
    config.write_text(yaml.safe_dump(dict(mode="pdist", n_passages=3, passage_max_tokens=32)))
    questions = write_json(tmp_path / "q.json", toy_records["dev"][:2])
    out = tmp_path / "scored.json"
    assert main(["score-passages", "--config", str(config), "--model", str(tiny_model_dir),
                 "--questions", str(questions), "--output", str(out)]) == 0  # fmt: skip
    scored = json.loads(out.read_text())
    for record in scored:
        values = [c["reader_score"] for c in record["ctxs"]]
        assert sum(v is not None for v in values) == 3  # the 3 passages read
        assert all(v < 0 for v in values if v is not None)  # log-likelihoods
        assert record["reader_scoring"]["mode"] == "pdist"

    unanswered = [dict(toy_records["dev"][0]), dict(toy_records["dev"][1], answers=[])]
    unanswered[1].pop("target", None)
    bad = write_json(tmp_path / "bad.json", unanswered)
    failed = tmp_path / "failed.json"
    code = main(["score-passages", "--config", str(config), "--model", str(tiny_model_dir),
                 "--questions", str(bad), "--output", str(failed)])  # fmt: skip
    assert code != 0 and not failed.exists()
    error = capsys.readouterr().err
    assert f"question {unanswered[1]['id']!r}: mode 'pdist'" in error and "no `answers`" in error


@pytest.mark.parametrize("pack", [True, False])
def test_loop_equals_one_fid_pass_per_left_out_passage(
    tiny_t5, tokenizer, toy_records, tmp_path, pack
):
    """Atlas's LOOP teacher, batched (one encoding, each passage masked from the decoder's
    cross-attention, in chunks), equals K + 1 separate FiD passes: log p(answer | all passages)
    - log p(answer | all but passage k), the latter with passage k removed from the input."""
    import copy

    examples = load_examples(write_json(tmp_path / "q.json", toy_records["dev"][:3]))
    examples[2].ctxs = examples[2].ctxs[:4]
    answers = [e.answers[0] for e in examples]
    collator = ReaderCollator(tokenizer, n_passages=6, passage_max_tokens=48)
    batch = collator(examples, answers)
    reader = FiDReader(tiny_t5, encoder_buckets=2, pack_passages=pack).eval()

    def log_likelihood(example, ctxs, answer):
        reduced = copy.copy(example)
        reduced.ctxs = ctxs
        one = ReaderCollator(tokenizer, n_passages=len(ctxs), passage_max_tokens=48)(
            [reduced], [answer]
        )
        loss = reader(one.input_ids, one.attention_mask, labels=one.labels).loss
        return -loss * int((one.labels != -100).sum())

    with torch.no_grad():
        ours = reader.leave_one_out_log_likelihoods(
            batch.input_ids, batch.attention_mask, batch.labels, rows_per_pass=4
        )
        expected, totals = torch.full((3, 6), float("nan")), []
        for b, example in enumerate(examples):
            read = [example.ctxs[i] for i in batch.ctx_indices[b]]
            every = log_likelihood(example, read, answers[b])
            totals.append(abs(float(every)))
            for n in range(len(read)):
                expected[b, n] = every - log_likelihood(
                    example, read[:n] + read[n + 1 :], answers[b]
                )
    # A drop is the difference of two fp32 sums of ~50 nats, each exact to ~1e-7 of itself:
    # the drops agree within 1e-5 in those units (1e-5 x the largest log-likelihood).
    tolerance = 1e-5 * max(totals)
    torch.testing.assert_close(ours, expected, atol=tolerance, rtol=0, equal_nan=True)
    assert torch.isnan(ours[2, 4:]).all() and not torch.isnan(ours[:, :4]).any()


def unshared_leave_one_out(reader, input_ids, attention_mask, labels, rows_per_pass):
    """LOOP as it was before its copies shared the cross-attention keys and values: all
    questions decoded with every passage at once, then `rows_per_pass` masked copies at a time
    across questions, each copy projecting the keys and values of all its encoder states."""
    B, N, _ = input_ids.shape
    encoding = reader.encode(input_ids, attention_mask)
    every = reader._answer_log_likelihood(encoding.hidden, encoding.mask, labels)  # (B,)
    scores = torch.full((B, N), float("nan"))
    question, slot = (attention_mask.sum(dim=-1) > 0).nonzero(as_tuple=True)
    for start in range(0, len(question), rows_per_pass):
        q, n = question[start : start + rows_per_pass], slot[start : start + rows_per_pass]
        kept = encoding.mask[q].bool() & (encoding.token_passage[q] != n[:, None])
        without = reader._answer_log_likelihood(
            encoding.hidden[q], kept.to(encoding.mask.dtype), labels[q]
        )
        scores[q, n] = every[q] - without
    return scores


@pytest.mark.parametrize(
    ("variant", "attention"),
    [("plain", "sdpa"), ("plain", "eager"), ("unpacked", "sdpa"), ("light", "sdpa"),
     ("fido", "eager"), ("bias", "eager")],
)  # fmt: skip
def test_loop_projects_cross_attention_keys_and_values_once_a_question(
    tiny_t5, tokenizer, toy_records, tmp_path, variant, attention
):
    """LOOP's copies of a question share each decoder layer's cross-attention keys and values:
    every layer's k and v projections run once a question (on its (1, T, D) states), not once
    a copy, and the drops equal the unshared computation's within 1e-5 in fp32, for the plain
    reader and every variant that changes cross-attention."""
    examples = load_examples(write_json(tmp_path / "q.json", toy_records["dev"][:3]))
    examples[2].ctxs = examples[2].ctxs[:4]
    answers = [e.answers[0] for e in examples]
    batch = ReaderCollator(tokenizer, n_passages=6, passage_max_tokens=48)(examples, answers)
    if variant == "bias":  # a released FiD checkpoint's, kept: positions matter (unpacked)
        from fid.models.cross_attention_bias import add_cross_attention_bias

        add_cross_attention_bias(tiny_t5, torch.randn(32, tiny_t5.config.num_heads))
    knobs = {"unpacked": {"pack_passages": False}, "light": {"light_tokens": 5},
             "fido": {"cross_attention_every": 2}}.get(variant, {})  # fmt: skip
    reader = FiDReader(tiny_t5, encoder_buckets=2, **knobs).eval()
    reader.set_attention(attention, torch.device("cpu"))

    projections = {  # "layer i k" -> the cross-attention's key projection (and v)
        f"layer {i} {name}": getattr(block.layer[1].EncDecAttention, name)
        for i, block in enumerate(tiny_t5.decoder.block)
        if hasattr(block.layer[1], "EncDecAttention")
        for name in ("k", "v")
    }
    assert len(projections) == (2 if variant == "fido" else 4)  # FiDO: layer 0 only
    rows: dict[str, list[int]] = {key: [] for key in projections}  # the rows of each call
    handles = [
        module.register_forward_hook(
            lambda module, inputs, output, key=key: rows[key].append(inputs[0].shape[0])
        )
        for key, module in projections.items()
    ]
    with torch.no_grad():
        try:
            ours = reader.leave_one_out_log_likelihoods(
                batch.input_ids, batch.attention_mask, batch.labels, rows_per_pass=4
            )
        finally:
            for handle in handles:
                handle.remove()
        expected = unshared_leave_one_out(
            reader, batch.input_ids, batch.attention_mask, batch.labels, rows_per_pass=4
        )
    # 3 questions of 7, 7 and 5 copies (all passages, then each left out): one projection each,
    # of one row. Unshared: 5 calls, of 3 rows (all passages) and 4 x 4 (the 16 copies).
    assert all(seen == [1, 1, 1] for seen in rows.values()), rows
    for block in tiny_t5.decoder.block:  # the projections are put back
        if hasattr(block.layer[1], "EncDecAttention"):
            assert isinstance(block.layer[1].EncDecAttention.k, torch.nn.Linear)
            assert isinstance(block.layer[1].EncDecAttention.v, torch.nn.Linear)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5, equal_nan=True)
    assert torch.isnan(ours[2, 4:]).all() and not torch.isnan(ours[:, :4]).any()


def test_loop_scores_a_lone_passage_0_at_every_batch_size(
    tiny_t5, tokenizer, toy_records, tmp_path
):
    """LOOP is undefined for a question with one passage (nothing is left when it is left out):
    its score is exactly 0.0, whatever the scoring batch size, and a question with several
    passages scores the same beside it as alone. (The all-masked copy used to decode over
    whatever padding its batch had: -0.056 at batch 1, +0.219 at 8.)"""
    from fid.inference.scoring import passage_scores

    examples = load_examples(write_json(tmp_path / "q.json", toy_records["dev"][:8]))
    for example in examples[::2]:  # questions 0, 2, 4, 6: one passage each
        example.ctxs = example.ctxs[:1]
    collator = ReaderCollator(tokenizer, n_passages=6, passage_max_tokens=48)
    reader = FiDReader(tiny_t5, encoder_buckets=2).eval()
    cpu = torch.device("cpu")

    def scores(chosen, batch_size):
        with torch.no_grad():
            found = passage_scores(reader, collator, chosen, batch_size, "loop", cpu)
        return [read.values for read in found]

    lone = examples[::2]
    for batch_size in (1, 8):
        assert [v.tolist() for v in scores(lone, batch_size)] == [[0.0]] * 4, batch_size
    mixed = scores(examples, 8)  # lone and 6-passage questions in one batch
    assert [v.tolist() for v in mixed[::2]] == [[0.0]] * 4
    for i in range(1, 8, 2):
        alone = scores([examples[i]], 1)[0]
        assert len(alone) == 6 and (alone != 0).all()
        torch.testing.assert_close(torch.from_numpy(mixed[i]), torch.from_numpy(alone),
                                   atol=1e-5, rtol=1e-5)  # fmt: skip


@pytest.mark.parametrize("mode", ["pdist", "loop"])
def test_atlas_per_token_mean_is_the_sum_over_the_answers_tokens(
    tiny_t5, tokenizer, toy_records, tmp_path, mode
):
    """Issue 49.2: the project's pdist/loop teacher is the answer's summed log-likelihood, so a
    temperature acts as Atlas's times the answer's length; `answer_log_likelihood: mean` gives
    Atlas's convention, the sum over the answer's tokens (EOS included), question by
    question."""
    from fid.inference.scoring import passage_scores

    examples = load_examples(write_json(tmp_path / "q.json", toy_records["dev"][:6]))
    collator = ReaderCollator(tokenizer, n_passages=4, passage_max_tokens=48)
    reader = FiDReader(tiny_t5, encoder_buckets=2).eval()
    cpu = torch.device("cpu")
    with torch.no_grad():
        summed = passage_scores(reader, collator, examples, 3, mode, cpu)
        mean = passage_scores(reader, collator, examples, 3, mode, cpu, per_answer_token=True)
    for example, total, per_token in zip(examples, summed, mean, strict=True):
        tokens = len(collator.encode_targets([example.answers[0]])[0].ne(-100).nonzero())
        assert tokens > 1  # an answer of several tokens: the two conventions differ
        torch.testing.assert_close(torch.from_numpy(per_token.values),
                                   torch.from_numpy(total.values) / tokens)  # fmt: skip


def test_answer_log_likelihood_is_refused_where_no_answer_is_scored():
    from fid.config import ConfigError, ScorePassagesConfig

    assert ScorePassagesConfig(mode="pdist", answer_log_likelihood="mean")
    with pytest.raises(ConfigError, match="only pdist and loop score the answer's likelihood"):
        ScorePassagesConfig(mode="mean_logit", answer_log_likelihood="mean")


def test_the_uniform_control_scores_every_read_passage_0(tiny_t5, tokenizer, toy_records, tmp_path):
    """Issue 49.1: the no-teacher control. With 5 candidates, in-batch negatives and nearly flat
    teachers a student mostly learns "my candidates vs other questions' passages"; a retriever
    distilled from `mode: uniform` learns only that, so a signal is read against it. Every
    passage the reader would read scores 0 (a uniform target at any temperature): the
    n_passages it reads, or fewer where a question has fewer."""
    from fid.inference.scoring import passage_scores

    examples = load_examples(write_json(tmp_path / "q.json", toy_records["dev"][:5]))
    examples[0].ctxs = examples[0].ctxs[:2]
    collator = ReaderCollator(tokenizer, n_passages=4, passage_max_tokens=48)
    reader = FiDReader(tiny_t5, encoder_buckets=2).eval()
    found = passage_scores(reader, collator, examples, 2, "uniform", torch.device("cpu"))
    assert [read.values.tolist() for read in found] == [[0.0] * 2] + [[0.0] * 4] * 4
    assert all(len(set(read.ctx_indices.tolist())) == len(read.values) for read in found)
