"""`fid prepare-questions` (raw question files into splits) and `fid eval-baseline`."""

from __future__ import annotations

import json

import pytest
from conftest import SAMPLES

from fid.cli import main
from fid.config import ConfigError, PrepareQuestionsConfig
from fid.data.prepare import prepare_questions
from fid.errors import DataError


def _read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def raw(tmp_path):
    path = tmp_path / "NQ-open.train.jsonl"
    rows = [{"question": f"q{i}?", "answer": [f"a{i % 3}"] if i != 4 else []} for i in range(10)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_index_selects_records_in_index_order(raw, tmp_path):
    (tmp_path / "idx.json").write_text("[7, 2, 9]")
    n = prepare_questions(
        raw, tmp_path / "out.jsonl", PrepareQuestionsConfig(), tmp_path / "idx.json"
    )
    out = _read(tmp_path / "out.jsonl")
    assert n == 3 and [q["question"] for q in out] == ["q7?", "q2?", "q9?"]
    assert out[0] == {"id": "NQ-open.train-7", "question": "q7?", "answers": ["a1"]}


def test_seeded_fractions_cut_disjoint_splits(raw, tmp_path):
    parts = {}
    for name, (lo, hi) in {"train": (0, 0.6), "dev": (0.6, 0.8), "test": (0.8, 1.0)}.items():
        cfg = PrepareQuestionsConfig(shuffle_seed=0, select_from=lo, select_to=hi)
        prepare_questions(raw, tmp_path / f"{name}.jsonl", cfg)
        parts[name] = [q["id"] for q in _read(tmp_path / f"{name}.jsonl")]
    assert [len(p) for p in parts.values()] == [6, 2, 2]
    assert sorted(sum(parts.values(), [])) == sorted(f"NQ-open.train-{i}" for i in range(10))
    again = tmp_path / "again.jsonl"
    prepare_questions(raw, again, PrepareQuestionsConfig(shuffle_seed=0, select_to=0.6))
    assert [q["id"] for q in _read(again)] == parts["train"]


def test_drop_unlabeled_and_max_questions(raw, tmp_path):
    cfg = PrepareQuestionsConfig(drop_unlabeled=True, max_questions=5)
    prepare_questions(raw, tmp_path / "out.jsonl", cfg)
    out = _read(tmp_path / "out.jsonl")
    assert (
        len(out) == 5
        and all(q["answers"] for q in out)
        and "q4?" not in {q["question"] for q in out}
    )


def test_answers_that_normalise_to_nothing_are_dropped(tmp_path, caplog):
    """SQuAD has "." as an answer and NQ-open "A+": under SQuAD normalisation an empty
    prediction matches them exactly, so they are dropped, and a question left without an
    answer is unlabeled (dropped with drop_unlabeled)."""
    raw = tmp_path / "raw.jsonl"
    rows = [{"question": "q0?", "answer": ["Denver", "."]}, {"question": "q1?", "answer": ["A+"]},
            {"question": "q2?", "answer": ["the"]}, {"question": "q3?", "answer": ["x"]}]  # fmt: skip
    raw.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "q.jsonl"
    assert prepare_questions(raw, out, PrepareQuestionsConfig()) == 4
    assert [q["answers"] for q in _read(out)] == [["Denver"], [], [], ["x"]]
    assert "dropped 3 gold answers that normalise to the empty string" in caplog.text
    assert "2 questions are left without an answer" in caplog.text
    assert prepare_questions(raw, out, PrepareQuestionsConfig(drop_unlabeled=True)) == 2


def test_bad_index_and_empty_selection(raw, tmp_path):
    (tmp_path / "idx.json").write_text("[1, 10]")
    with pytest.raises(DataError, match="position 10 is outside .* 10 records"):
        prepare_questions(
            raw, tmp_path / "o.jsonl", PrepareQuestionsConfig(), tmp_path / "idx.json"
        )
    (tmp_path / "idx.json").write_text('{"a": 1}')
    with pytest.raises(DataError, match="list of record positions"):
        prepare_questions(
            raw, tmp_path / "o.jsonl", PrepareQuestionsConfig(), tmp_path / "idx.json"
        )
    with pytest.raises(DataError, match="keeps no question"):
        prepare_questions(raw, tmp_path / "o.jsonl", PrepareQuestionsConfig(select_to=0.01))
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.parametrize(
    "knobs", [{"select_from": 0.5, "select_to": 0.5}, {"select_to": 1.5}, {"max_questions": 0}]
)
def test_config_ranges(knobs):
    with pytest.raises(ConfigError, match="out of range"):
        PrepareQuestionsConfig(**knobs)


@pytest.mark.parametrize(
    "name",
    [
        "nq-open/NQ-open.dev.jsonl",
        "dpr/trivia-test.qas.head300.tsv",
        "triviaqa/triviaqa_sample.json",
    ],
)
def test_cli_on_real_formats(tmp_path, name):
    out = tmp_path / "q.jsonl"
    (tmp_path / "cfg.yaml").write_text("max_questions: 50\n")
    code = main(["prepare-questions", "--config", str(tmp_path / "cfg.yaml"),
                 "--input", str(SAMPLES / name), "--output", str(out)])  # fmt: skip
    assert code == 0
    questions = _read(out)
    assert 1 <= len(questions) <= 50 and all(q["question"] and q["answers"] for q in questions)


def test_eval_baseline(tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"question": f"t{i}", "answers": [a]}) + "\n"
                             for i, a in enumerate(["red", "blue", "red", "green"])))  # fmt: skip
    test = tmp_path / "test.jsonl"
    test.write_text('{"question": "x", "answers": ["Red"]}\n{"question": "y", "answers": ["b"]}\n')
    code = main(["eval-baseline", "--train", str(train), "--questions", str(test),
                 "--output", str(tmp_path / "m.json")])  # fmt: skip
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert code == 0 and metrics["answer"] == "red" and metrics["exact_match"] == 50.0


def test_make_reader_lists_forces_the_gold_passage_in(tmp_path):
    from fid.config import ReaderListsConfig
    from fid.data.prepare import make_reader_lists

    passages = tmp_path / "passages.tsv"
    passages.write_text("id\ttext\ttitle\n" + "".join(f"p{i}\ttext {i}\tT{i}\n" for i in range(8)))
    (tmp_path / "q.jsonl").write_text(
        '{"id": "a", "question": "qa?", "answers": ["x"], "gold_passage_id": "p1"}\n'
        '{"id": "b", "question": "qb?", "answers": ["y"], "gold_passage_id": "p7"}\n'
    )
    ctx = [
        {"id": f"p{i}", "title": f"T{i}", "text": f"text {i}", "score": 9.0 - i} for i in range(5)
    ]
    retrieved = [{"id": "a", "question": "qa?", "answers": ["x"], "ctxs": ctx},
                 {"id": "b", "question": "qb?", "answers": ["y"], "ctxs": ctx}]  # fmt: skip
    (tmp_path / "r.json").write_text(json.dumps(retrieved))
    out = tmp_path / "lists.json"
    added = make_reader_lists(tmp_path / "r.json", tmp_path / "q.jsonl", passages, out,
                              ReaderListsConfig(n_passages=3))  # fmt: skip
    lists = json.loads(out.read_text())
    assert added == 1 and [len(r["ctxs"]) for r in lists] == [3, 3]
    assert {c["id"] for c in lists[0]["ctxs"]} == {"p0", "p1", "p2"}  # gold p1 kept in place
    assert {c["id"] for c in lists[1]["ctxs"]} == {"p0", "p1", "p7"}  # p7 fetched from the TSV
    assert next(c for c in lists[1]["ctxs"] if c["id"] == "p7")["text"] == "text 7"
    assert all("score" not in c for r in lists for c in r["ctxs"])  # the shuffled order stands

    (tmp_path / "q.jsonl").write_text('{"id": "a", "question": "qa?"}\n')
    with pytest.raises(DataError, match="gold_passage_id"):
        make_reader_lists(tmp_path / "r.json", tmp_path / "q.jsonl", passages, out,
                          ReaderListsConfig())  # fmt: skip
