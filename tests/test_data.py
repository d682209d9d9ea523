"""FiD-format loading and validation, the collator, batching orders and answer sampling."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import write_json

from fid.data.examples import choose_target, load_examples, top_passages
from fid.data.reader_batches import ReaderCollator, epoch_batches, passage_text
from fid.errors import DataError


def _record(i=0, n_ctx=3, **overrides):
    record = {
        "id": f"q{i}",
        "question": "who founded rome?",
        "answers": ["romulus"],
        "ctxs": [
            {"id": str(k), "title": f"t{k}", "text": f"passage {k} " * (k + 1), "score": k / 10}
            for k in range(n_ctx)
        ],
    }
    record.update(overrides)
    return record


def test_loads_json_list_and_jsonl(tmp_path):
    records = [_record(0), _record(1, answers=[])]
    as_list = load_examples(write_json(tmp_path / "a.json", records))
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in records) + "\n")
    as_lines = load_examples(jsonl)
    assert [e.id for e in as_list] == [e.id for e in as_lines] == ["q0", "q1"]
    assert as_lines[1].answers == [] and as_lines[0].record == records[0]


@pytest.mark.parametrize(
    "content, message",
    [
        ('[{"question": "x", ', "invalid JSON at line 1"),
        (json.dumps([{"answers": ["a"], "ctxs": []}]), "record 0: field 'question'"),
        (
            json.dumps([_record(answers="romulus")]),
            "record 0 (id 'q0'): field 'answers' must be a list",
        ),
        (
            json.dumps([_record(), _record(1, ctxs=[])]),
            "record 1 (id 'q1'): field 'ctxs' must be a non-empty",
        ),
        (
            json.dumps([{"id": 1, "question": "q", "answers": []}]),
            "field 'ctxs' must be a non-empty list of passages, found missing",
        ),
        (
            json.dumps([_record(ctxs=[{"title": "t"}])]),
            "ctxs[0].text must be a string, found missing",
        ),
        (
            json.dumps([_record(ctxs=[{"title": "t", "text": "x", "score": "high"}])]),
            "ctxs[0].score must be a number",
        ),
        (json.dumps([_record(target=3)]), "field 'target' must be a string"),
        ("[]", "no question records"),
        (json.dumps([[1, 2]]), "record 0: expected an object"),
    ],
)
def test_bad_records_name_file_record_and_field(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(DataError) as error:
        load_examples(path)
    assert str(path) in str(error.value) and message in str(error.value)


def test_jsonl_errors_name_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(_record()) + "\n\n{oops\n")
    with pytest.raises(DataError, match=r"bad.jsonl: line 3: invalid JSON"):
        load_examples(path)


def test_missing_file_and_training_needs_answers(tmp_path):
    with pytest.raises(DataError, match="file not found"):
        load_examples(tmp_path / "nope.json")
    path = write_json(tmp_path / "a.json", [_record(answers=[])])
    assert load_examples(path)[0].answers == []
    with pytest.raises(DataError, match="needs a 'target' or a non-empty 'answers'"):
        load_examples(path, require_answers=True)


def test_duplicate_ids_name_both_records(tmp_path):
    path = tmp_path / "dup.jsonl"
    records = [_record(0), _record(1), _record(0)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(
        DataError, match=r"dup.jsonl: record 2 \(line 3\).*duplicate id 'q0' \(first in record 0"
    ):
        load_examples(path)
    # Without ids the positions are the ids, and they cannot repeat.
    no_ids = [_record(i) for i in range(3)]
    for record in no_ids:
        del record["id"]
    path = write_json(tmp_path / "a.json", no_ids)
    assert [example.id for example in load_examples(path)] == ["0", "1", "2"]


def test_top_passages_by_score_else_file_order(tmp_path):
    example = load_examples(write_json(tmp_path / "a.json", [_record(n_ctx=4)]))[0]
    assert top_passages(example, 2) == [3, 2]
    del example.ctxs[1]["score"]
    assert top_passages(example, 2) == [0, 1]


def test_collator_masks_padding_and_truncation(tmp_path, tokenizer):
    examples = load_examples(write_json(tmp_path / "a.json", [_record(0, 4), _record(1, 2)]))
    collator = ReaderCollator(tokenizer, n_passages=3, passage_max_tokens=12)
    batch = collator(examples, ["romulus", "remus and romulus"])
    B, N, L = batch.input_ids.shape
    assert (B, N) == (2, 3) and L <= 12
    # Question 1 has two passages: slot 2 is a masked, empty passage.
    assert batch.passage_mask.tolist() == [[True, True, True], [True, True, False]]
    assert batch.attention_mask[1, 2].sum() == 0
    assert (batch.input_ids[batch.attention_mask == 0] == tokenizer.pad_token_id).all()
    assert batch.ctx_indices == [[3, 2, 1], [1, 0]]
    # Each passage reads "question: Q title: T context: P", truncated to 12 tokens, no EOS.
    full = tokenizer(
        passage_text(examples[0].question, examples[0].ctxs[3]), add_special_tokens=False
    )
    assert batch.input_ids[0, 0].tolist() == full["input_ids"][:12]
    # Targets end with EOS and are padded with -100.
    assert batch.labels[0, (batch.labels[0] != -100).sum() - 1] == tokenizer.eos_token_id
    assert (batch.labels[0] == -100).any()
    padded = ReaderCollator(tokenizer, 3, 12, pad_to_max_length=True)(examples)
    assert padded.input_ids.shape[-1] == 12 and padded.labels is None


def test_fixed_answer_length(tmp_path, tokenizer):
    examples = load_examples(write_json(tmp_path / "a.json", [_record(0), _record(1)]))
    collator = ReaderCollator(tokenizer, 2, 16, target_max_tokens=4)
    labels = collator(examples, ["a", "one two three four five six"]).labels
    assert labels.shape == (2, 4)
    n_answer = len(tokenizer("a", add_special_tokens=False)["input_ids"])
    assert (labels[0] != -100).sum() == n_answer + 1 and labels[0, n_answer] == 1
    assert labels[1, -1] == tokenizer.eos_token_id  # truncated, EOS kept


def test_target_choice_is_reproducible(tmp_path):
    example = load_examples(
        write_json(tmp_path / "a.json", [_record(answers=[str(i) for i in range(20)])])
    )[0]
    draws = [choose_target(example, seed=1, epoch=e) for e in range(10)]
    assert draws == [choose_target(example, seed=1, epoch=e) for e in range(10)]
    assert len(set(draws)) > 1
    example.target = "fixed"
    assert choose_target(example, 1, 0) == "fixed"


def test_epoch_batches_cover_every_example_once():
    batches = epoch_batches(10, 3, seed=0, epoch=0)
    assert sorted(i for b in batches for i in b) == list(range(10))
    assert batches == epoch_batches(10, 3, seed=0, epoch=0)
    assert batches != epoch_batches(10, 3, seed=0, epoch=1)


def test_token_budget_batches():
    counts = [5, 50, 12, 7, 30, 8, 90, 3, 20, 60]
    batches = epoch_batches(10, 1, seed=0, epoch=0, token_counts=counts, max_tokens=64)
    assert sorted(i for b in batches for i in b) == list(range(10))
    for batch in batches:
        assert len(batch) == 1 or sum(counts[i] for i in batch) <= 64
    assert [6] in batches  # longer than the budget: a batch of its own
    assert len(batches) < 10  # small questions share batches


def test_token_counts_match_collated_tokens(tmp_path, tokenizer):
    examples = load_examples(write_json(tmp_path / "a.json", [_record(0, 4), _record(1, 2)]))
    collator = ReaderCollator(tokenizer, n_passages=3, passage_max_tokens=12)
    counts = collator.question_token_counts(examples)
    batch = collator(examples)
    assert counts == batch.attention_mask.sum(dim=(1, 2)).tolist()
    assert torch.is_tensor(batch.input_ids)
