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


def test_answers_that_normalise_to_nothing_are_kept_as_fid_keeps_them(tmp_path, caplog):
    """SQuAD has "." as an answer and NQ-open "A+": FiD keeps them and scores them (only a
    prediction that normalises to the empty string matches), so a question whose every answer
    is such is still labeled and scored (issue 31: NQ test scored 3,608 of 3,610 questions)."""
    import logging

    from fid.metrics.answers import answer_metrics

    raw = tmp_path / "raw.jsonl"
    rows = [{"question": "q0?", "answer": ["Denver", "."]}, {"question": "q1?", "answer": ["A+"]},
            {"question": "q2?", "answer": ["the"]}, {"question": "q3?", "answer": ["x"]}]  # fmt: skip
    raw.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "q.jsonl"
    caplog.set_level(logging.INFO, logger="fid")
    assert prepare_questions(raw, out, PrepareQuestionsConfig(drop_unlabeled=True)) == 4
    answers = [q["answers"] for q in _read(out)]
    assert answers == [["Denver", "."], ["A+"], ["the"], ["x"]]
    assert "3 gold answers normalise to the empty string" in caplog.text
    # FiD's ems: "" matches "the" (both normalise to ""), "B+" misses "A+" ("b" is not "")
    metrics = answer_metrics(["Denver", "B+", "", "y"], answers)
    assert metrics["n_scored"] == 4 and metrics["exact_match"] == 50.0


def test_nq_test_split_keeps_and_scores_all_3610_questions(tmp_path, caplog):
    """NQ-open's dev file (FiD's NQ test, 3,610 questions) in the sample: every question is
    kept with its answers, so all 3,610 are scored, as in the paper; 290 ('---') and 363 (')')
    have only answers that normalise to the empty string."""
    from fid.metrics.answers import answer_metrics

    out = tmp_path / "test.jsonl"
    (tmp_path / "cfg.yaml").write_text("drop_unlabeled: true\n")
    code = main(["prepare-questions", "--config", str(tmp_path / "cfg.yaml"), "--input",
                 str(SAMPLES / "nq-open" / "NQ-open.dev.jsonl"), "--output", str(out),
                 "--expected-size", "3610"])  # fmt: skip
    questions = _read(out)
    assert code == 0 and len(questions) == 3610 and all(q["answers"] for q in questions)
    assert questions[290]["answers"] == ["---"] and questions[363]["answers"] == [")"]
    metrics = answer_metrics(["nothing"] * len(questions), [q["answers"] for q in questions])
    assert metrics["n_scored"] == 3610 and metrics["n_unlabeled"] == 0
    assert "should hold" not in caplog.text


def test_a_split_of_another_size_is_refused_naming_both_numbers(raw, tmp_path, caplog):
    """Training days on a wrong split cost more than a stop: refused before it is written;
    `accept_other_size: true` writes it with a warning."""
    out = tmp_path / "out.jsonl"
    (tmp_path / "idx.json").write_text("[7, 2, 9]")
    argv = ["prepare-questions", "--input", str(raw), "--index", str(tmp_path / "idx.json"),
            "--output", str(out), "--expected-size", "8757"]  # fmt: skip
    assert main(argv) == 1 and not out.exists()
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and f"{raw}: the split selects 3 questions" in errors[0], errors
    assert "should hold 8757" in errors[0] and "accept_other_size: true" in errors[0]
    caplog.clear()
    (tmp_path / "accept.yaml").write_text("accept_other_size: true\n")
    assert main([*argv, "--config", str(tmp_path / "accept.yaml")]) == 0
    assert len(_read(out)) == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("selects 3 questions, but this split should hold 8757" in w for w in warnings)


def _fid_triviaqa_target(answer: dict) -> str:
    """facebookresearch/FiD src/preprocess.py (select_examples_TQA), restated: the target is
    `ex['Answer']['Value']`, and `if target.isupper(): target = target.title()`."""
    target = answer["Value"]
    if target.isupper():
        target = target.title()
    return target


def test_triviaqa_targets_are_fids(tmp_path):
    """Issue 31: FiD trains TriviaQA on Answer.Value (title-cased when all upper case), not on a
    random alias, and evaluates on every alias."""
    sample = json.loads((SAMPLES / "triviaqa" / "triviaqa_sample.json").read_text())
    data = sample["Data"] + [
        {"Question": f"Q{i}?", "QuestionId": f"x{i}", "Answer": {"Value": v, "Aliases": aliases}}
        for i, (v, aliases) in enumerate([
            ("ABBA", ["abba", "Abba"]), ("U2", ["U2", "u2"]), ("AC/DC", ["AC/DC", "acdc"]),
            ("the BBC", ["BBC", "the BBC"]), ("ÉTÉ", ["été"]), ("Paris", ["Paris", "paris"]),
        ])
    ]  # fmt: skip
    raw = tmp_path / "unfiltered-web-dev.json"
    raw.write_text(json.dumps({**sample, "Data": data}))
    out = tmp_path / "test.jsonl"
    prepare_questions(raw, out, PrepareQuestionsConfig())
    prepared = _read(out)
    assert [q["target"] for q in prepared] == [_fid_triviaqa_target(d["Answer"]) for d in data]
    assert [q["target"] for q in prepared] == [
        "Sunset Boulevard", "Abba", "U2", "Ac/Dc", "the BBC", "Été", "Paris"
    ]  # fmt: skip
    assert [q["answers"] for q in prepared] == [d["Answer"]["Aliases"] for d in data]
    prepare_questions(raw, out, PrepareQuestionsConfig(triviaqa_target="random_alias"))
    assert all("target" not in q for q in _read(out))


@pytest.mark.parametrize("list_format", ["fid_json", "compact"])
def test_triviaqa_target_reaches_the_reader_through_retrieval(tmp_path, list_format):
    """The target written by prepare-questions survives retrieval (both list formats) and is
    what reader training takes (choose_target), every epoch."""
    from fid.data.examples import choose_target, load_examples

    passages = SAMPLES / "squad-open-tiny" / "psgs_w100.tsv"
    questions = tmp_path / "train.jsonl"
    (tmp_path / "bm25.yaml").write_text(f"top_k: 3\nlist_format: {list_format}\n")
    commands = [
        ["prepare-questions", "--input", SAMPLES / "triviaqa" / "triviaqa_sample.json",
         "--output", questions],
        ["build-bm25", "--passages", passages, "--output", tmp_path / "index"],
        ["retrieve-bm25", "--config", tmp_path / "bm25.yaml", "--index", tmp_path / "index",
         "--passages", passages, "--questions", questions, "--output", tmp_path / "lists"],
    ]  # fmt: skip
    for command in commands:
        assert main([str(c) for c in command]) == 0, command
    (example,) = load_examples(tmp_path / "lists", require_answers=True, passages=passages)
    assert len(example.answers) == 5 and len(example.ctxs) == 3
    assert {choose_target(example, seed=0, epoch=e) for e in range(20)} == {"Sunset Boulevard"}


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
