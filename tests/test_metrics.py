"""Exact match and F1 against a table of cases (SQuAD normalization)."""

import pytest

from fid.metrics.answers import (
    answer_metrics,
    describe_answer_metrics,
    exact_match,
    f1_score,
    normalize_answer,
)
from fid.metrics.retrieval import describe_retrieval_accuracy, retrieval_accuracy


@pytest.mark.parametrize(
    "text, normalized",
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("  a   cat,  an apple ", "cat apple"),
        ("Theatre", "theatre"),  # an article only as a whole word
        ("U.S.A.", "usa"),
        ("", ""),
    ],
)
def test_normalize(text, normalized):
    assert normalize_answer(text) == normalized


@pytest.mark.parametrize(
    "prediction, answers, em, f1",
    [
        ("Paris", ["paris"], 1.0, 1.0),
        ("the Paris", ["Paris."], 1.0, 1.0),
        ("Paris France", ["Paris"], 0.0, 2 / 3),
        ("London", ["Paris", "London"], 1.0, 1.0),
        ("New York City", ["York"], 0.0, 0.5),
        ("cat dog", ["dog cat"], 0.0, 1.0),
        ("1,234", ["1234"], 1.0, 1.0),
        ("", ["Paris"], 0.0, 0.0),
        ("the", ["a"], 1.0, 1.0),  # both normalize to nothing
        ("Paris", [], 0.0, 0.0),
    ],
)
def test_exact_match_and_f1(prediction, answers, em, f1):
    assert exact_match(prediction, answers) == em
    assert f1_score(prediction, answers) == pytest.approx(f1)


def test_answer_metrics_skip_unlabeled_questions():
    metrics = answer_metrics(["Paris", "x", "Rome"], [["Paris"], [], ["Milan"]])
    assert metrics == {
        "exact_match": 50.0,
        "f1": 50.0,
        "unit": "percent",
        "n_scored": 2,
        "n_unlabeled": 1,
    }
    none = answer_metrics(["Paris"], [[]])
    assert none["exact_match"] is None and none["n_scored"] == 0


def test_one_unit_everywhere_percent_and_labeled():
    """EM was logged as 6.31 unlabeled; per-question scores in a predictions file were 0-1
    next to a metrics file in percent."""
    from fid.data.examples import Example
    from fid.evaluation.reader import prediction_records

    predictions = ["Paris", "x", "Rome y"]
    answers = [["Paris"], ["Berlin"], ["Rome"]]
    metrics = answer_metrics(predictions, answers)
    assert metrics["unit"] == "percent"
    assert describe_answer_metrics(metrics) == "EM 33.33%, F1 55.56% over 3 questions"
    examples = [
        Example(id=str(i), question="q", answers=a, target=None, ctxs=[], record={})
        for i, a in enumerate(answers)
    ]
    records = prediction_records(examples, predictions)
    assert [r["exact_match"] for r in records] == [100.0, 0.0, 0.0]
    assert sum(r["f1"] for r in records) / 3 == pytest.approx(metrics["f1"])

    ctxs = [[{"text": "in Paris", "has_answer": True}], [{"text": "no", "has_answer": False}]]
    accuracy = retrieval_accuracy([["Paris"], ["Berlin"]], ctxs, [1, 5])
    assert accuracy["unit"] == "percent"
    assert describe_retrieval_accuracy(accuracy) == "top-1 50.0%, top-5 50.0% over 2 questions"
