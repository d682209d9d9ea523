"""Question files in every supported format, unlabeled questions, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fid.data.questions import load_questions
from fid.errors import DataError

SAMPLES = Path(__file__).resolve().parents[1] / "samples"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_nq_open_dev():
    questions = load_questions(SAMPLES / "nq-open" / "NQ-open.dev.jsonl")
    assert len(questions) == 3610
    assert questions[0] == {
        "id": "NQ-open.dev-0",
        "question": "when was the last time anyone was on the moon",
        "answers": ["14 December 1972 UTC", "December 1972"],
    }
    assert all(q["answers"] for q in questions)
    assert questions[-1]["id"] == "NQ-open.dev-3609"


def test_squad_open_tiny_questions():
    questions = load_questions(SAMPLES / "squad-open-tiny" / "questions.jsonl")
    assert len(questions) == 200
    assert questions[0]["answers"] == ["Denver Broncos"]


def test_dpr_qas_tsv():
    nq = load_questions(SAMPLES / "dpr" / "nq-test.qas.head300.tsv")
    assert len(nq) == 300
    assert nq[0] == {
        "id": "nq-test.qas.head300-0",
        "question": "who got the first nobel prize in physics",
        "answers": ["Wilhelm Conrad Röntgen"],
    }
    assert nq[2]["answers"] == ["Olivia", "MFSK"]
    trivia = load_questions(SAMPLES / "dpr" / "trivia-test.qas.head300.tsv")
    assert len(trivia) == 300
    # csv quoting: a quoted answer list holding quotes, as DPR's reader sees it
    hitler = next(q for q in trivia if "Bomb Plot" in q["question"])
    assert "Hitler's medical health" in hitler["answers"]
    assert "Adolf Hitler" in hitler["answers"]


def test_triviaqa_raw_json():
    questions = load_questions(SAMPLES / "triviaqa" / "triviaqa_sample.json")
    assert questions == [
        {
            "id": "tc_33",
            "question": "Which Lloyd Webber musical premiered in the US on 10th December 1993?",
            "answers": [
                "Sunset Blvd",
                "West Sunset Boulevard",
                "Sunset Boulevard",
                "Sunset Bulevard",
                "Sunset Blvd.",
            ],
            "target": "Sunset Boulevard",  # FiD's: Answer.Value (issue 31)
        }
    ]
    assert (
        "target"
        not in load_questions(
            SAMPLES / "triviaqa" / "triviaqa_sample.json", triviaqa="random_alias"
        )[0]
    )


def test_triviaqa_aliases_are_deduplicated_and_unlabeled_allowed(tmp_path):
    data = {
        "Data": [
            {"Question": "Q1?", "QuestionId": "a", "Answer": {"Aliases": ["X", "Y", "X"]}},
            {"Question": "Q2?", "QuestionId": "b"},  # the test set has no answers
        ]
    }
    path = write(tmp_path, "tqa.json", json.dumps(data))
    assert [q["answers"] for q in load_questions(path)] == [["X", "Y"], []]


def test_fid_json_and_jsonl(tmp_path):
    records = [
        {"id": 17, "question": "Q1?", "answers": ["A"], "ctxs": [{"title": "t", "text": "x"}]},
        {"id": "q2", "question": "Q2?", "target": "B"},
        {"id": "q3", "question": "Q3?"},
    ]
    expected = [
        {"id": "17", "question": "Q1?", "answers": ["A"]},
        {"id": "q2", "question": "Q2?", "answers": ["B"], "target": "B"},  # the target is kept
        {"id": "q3", "question": "Q3?", "answers": []},
    ]
    assert load_questions(write(tmp_path, "dev.json", json.dumps(records, indent=1))) == expected
    jsonl = "".join(json.dumps(r) + "\n" for r in records)
    assert load_questions(write(tmp_path, "dev.jsonl", jsonl)) == expected
    biencoder = load_questions(SAMPLES / "dpr" / "nq-dev-biencoder-sample.json")
    assert len(biencoder) == 5
    assert biencoder[0]["answers"] == ["Linda Davis"]


def test_unlabeled_questions(tmp_path):
    jsonl = write(tmp_path, "test.jsonl", '{"question": "who?"}\n\n{"question": "when?"}\n')
    assert load_questions(jsonl) == [
        {"id": "test-0", "question": "who?", "answers": []},
        {"id": "test-1", "question": "when?", "answers": []},
    ]
    tsv = write(tmp_path, "test.tsv", "who?\nwhen?\t[]\n")
    assert [q["answers"] for q in load_questions(tsv)] == [[], []]


def test_suffix_unknown_content_decides(tmp_path):
    path = write(tmp_path, "questions.txt", '{"question": "who?", "answer": ["me"]}\n')
    assert load_questions(path)[0]["answers"] == ["me"]


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("bad.json", '[{"question": "q", "answers": ["a"]},\n  oops]', "line 2: expected one of"),
        ("bad.jsonl", '{"question": "q"}\n{"question": \n', "line 2: expected one of"),
        ("bad.jsonl", '{"query": "q", "answers": []}\n', r"line 1: expected one of .*'query'"),
        ("bad.jsonl", '{"question": "q"}\n{"text": "q"}\n', "line 2: expected a question record"),
        ("bad.json", "[1, 2]", "record 0: expected one of"),
        ("bad.json", '"just a string"', "line 1: expected one of"),
        ("bad.jsonl", '{"question": "q", "answer": "a"}\n', "'answer' must be a list"),
        ("bad.jsonl", '{"question": "", "answers": []}\n', "non-empty string"),
        ("bad.tsv", "id\ttext\ttitle\n1\tx\ty\n", "line 1: expected one of .*3 tab-separated"),
        ("bad.tsv", "who?\tDavid Seville\n", "line 1: expected one of"),
        ("bad.tsv", "who?\t['a']\nwhen?\tnot a list\n", "line 2: expected a python list"),
        ("bad.tsv", "who?\t['a']\nwhen?\t['a', 3]\n", "line 2: .*must be a list of strings"),
        ("bad.tsv", "\n\n", "line 1: expected one of .*empty file"),
        ("bad.json", '{"Data": [{"Question": 3}]}', r"Data\[0\]: expected a TriviaQA record"),
    ],
)
def test_malformed_files_give_one_clear_error(tmp_path, name, content, message):
    path = write(tmp_path, name, content)
    with pytest.raises(DataError, match=f"{name}: .*{message}"):
        load_questions(path)


def test_expected_formats_are_listed(tmp_path):
    path = write(tmp_path, "bad.jsonl", "not json at all\n")
    with pytest.raises(DataError) as error:
        load_questions(path)
    for fmt in ("NQ-open jsonl", "FiD json/jsonl", "DPR qas TSV", "TriviaQA json"):
        assert fmt in str(error.value)


def test_duplicate_ids_and_missing_file(tmp_path):
    records = [{"id": "x", "question": "a?"}, {"id": "x", "question": "b?"}]
    with pytest.raises(DataError, match="duplicate id 'x'"):
        load_questions(write(tmp_path, "dup.json", json.dumps(records)))
    with pytest.raises(DataError, match="nope.jsonl: question file not found"):
        load_questions(tmp_path / "nope.jsonl")


def test_duplicate_ids_name_both_lines(tmp_path):
    path = write(
        tmp_path, "dup.jsonl", '{"id": 1, "question": "a?"}\n\n{"id": "1", "question": "b?"}\n'
    )
    with pytest.raises(DataError, match=r"dup.jsonl: line 3: duplicate id '1' \(first in line 1\)"):
        load_questions(path)
    items = [{"Question": "a?", "QuestionId": "t1"}, {"Question": "b?", "QuestionId": "t1"}]
    path = write(tmp_path, "dup.json", json.dumps({"Data": items}))
    with pytest.raises(DataError, match=r"Data\[1\]: duplicate id 't1' \(first in Data\[0\]\)"):
        load_questions(path)
