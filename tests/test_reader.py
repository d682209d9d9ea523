"""FiDReader: equivalence with plain T5, passage-order invariance, exact bucketing and packing."""

from __future__ import annotations

import torch
from conftest import SAMPLES  # noqa: F401  (keeps the import path of shared fixtures)

from fid.data.examples import load_examples
from fid.data.reader_batches import ReaderCollator
from fid.models.reader import FiDReader


def _batch(tokenizer, toy_records, tmp_path, n_passages=6, n_questions=3):
    from conftest import write_json

    path = write_json(tmp_path / "q.json", toy_records["train"][:n_questions])
    examples = load_examples(path)
    # Give the questions different passage counts: one has fewer than n_passages.
    examples[1].ctxs = examples[1].ctxs[:2]
    collator = ReaderCollator(tokenizer, n_passages=n_passages, passage_max_tokens=40)
    return collator(examples, [e.answers[0] for e in examples])


def test_one_passage_matches_plain_t5(tiny_t5, tokenizer, toy_records, tmp_path):
    batch = _batch(tokenizer, toy_records, tmp_path, n_passages=1)
    reader = FiDReader(tiny_t5).eval()
    ours = reader(batch.input_ids, batch.attention_mask, labels=batch.labels)
    plain = tiny_t5(
        input_ids=batch.input_ids[:, 0],
        attention_mask=batch.attention_mask[:, 0],
        labels=batch.labels,
    )
    torch.testing.assert_close(ours.logits, plain.logits)
    torch.testing.assert_close(ours.loss, plain.loss)


def test_permuting_passages_leaves_loss_unchanged(tiny_t5, tokenizer, toy_records, tmp_path):
    batch = _batch(tokenizer, toy_records, tmp_path)
    permutation = torch.tensor([3, 0, 5, 1, 4, 2])
    for pack in (True, False):
        reader = FiDReader(tiny_t5, encoder_buckets=3, pack_passages=pack).eval()
        loss = reader(batch.input_ids, batch.attention_mask, labels=batch.labels).loss
        permuted = reader(
            batch.input_ids[:, permutation], batch.attention_mask[:, permutation], batch.labels
        ).loss
        torch.testing.assert_close(loss, permuted)


def test_buckets_and_packing_are_exact(tiny_t5, tokenizer, toy_records, tmp_path):
    """The original layout (one bucket, (B, N*L) with padding) and ours agree."""
    batch = _batch(tokenizer, toy_records, tmp_path)
    original = FiDReader(tiny_t5, encoder_buckets=1, pack_passages=False).eval()
    ours = FiDReader(tiny_t5, encoder_buckets=4, pack_passages=True).eval()
    a = original(batch.input_ids, batch.attention_mask, labels=batch.labels)
    b = ours(batch.input_ids, batch.attention_mask, labels=batch.labels)
    torch.testing.assert_close(a.logits, b.logits, atol=1e-5, rtol=1e-5)
    for beams in (1, 3):
        assert torch.equal(
            original.generate(batch.input_ids, batch.attention_mask, 6, beams),
            ours.generate(batch.input_ids, batch.attention_mask, 6, beams),
        )
    # Padding every passage to the maximum (the original's collator) changes nothing either.
    padded = torch.nn.functional.pad(batch.input_ids, (0, 9))
    padded_mask = torch.nn.functional.pad(batch.attention_mask, (0, 9))
    c = original(padded, padded_mask, labels=batch.labels)
    torch.testing.assert_close(a.logits, c.logits, atol=1e-5, rtol=1e-5)


def test_fused_encoding_layout(tiny_t5, tokenizer, toy_records, tmp_path):
    batch = _batch(tokenizer, toy_records, tmp_path)
    encoding = (
        FiDReader(tiny_t5, encoder_buckets=2).eval().encode(batch.input_ids, batch.attention_mask)
    )
    lengths = batch.attention_mask.sum(-1)  # (B, N)
    assert encoding.hidden.shape[1] == int(lengths.sum(1).max())
    for b in range(lengths.shape[0]):
        assert int(encoding.mask[b].sum()) == int(lengths[b].sum())
        for n in range(lengths.shape[1]):
            assert int((encoding.token_passage[b] == n).sum()) == int(lengths[b, n])
        # Padding slots (question 1 has 2 passages) get no tokens.
    assert int((encoding.token_passage[1] >= 2).sum()) == 0


def test_activation_checkpointing_only_while_training(tiny_t5, tokenizer, toy_records, tmp_path):
    batch = _batch(tokenizer, toy_records, tmp_path)
    calls = []
    tiny_t5.encoder.block[0].layer[0].register_forward_hook(lambda *args: calls.append(1))
    reader = FiDReader(tiny_t5, encoder_buckets=1)
    plain = FiDReader(type(tiny_t5)(tiny_t5.config), encoder_buckets=1)
    plain.load_state_dict(reader.state_dict())

    reader.set_activation_checkpointing(True)
    reader.train()
    loss = reader(batch.input_ids, batch.attention_mask, labels=batch.labels).loss
    loss.backward()
    assert len(calls) == 2  # forward + recomputation in backward

    plain.train()
    plain(batch.input_ids, batch.attention_mask, labels=batch.labels).loss.backward()
    for (name, p), q in zip(reader.named_parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)

    calls.clear()
    reader.eval()
    with torch.no_grad():
        reader(batch.input_ids, batch.attention_mask, labels=batch.labels)
    assert len(calls) == 1
