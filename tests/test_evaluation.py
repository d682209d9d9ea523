"""Exact match and F1 against a table of cases (SQuAD normalization)."""

import pytest

from fid.evaluation import answer_metrics, exact_match, f1_score, normalize_answer


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
    assert metrics == {"exact_match": 50.0, "f1": 50.0, "n_scored": 2, "n_unlabeled": 1}
    none = answer_metrics(["Paris"], [[]])
    assert none["exact_match"] is None and none["n_scored"] == 0
