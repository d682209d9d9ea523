"""DPR's has-answer rule: hand-made cases, and the tokenizer against DPR's own pattern."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest

from fid.data.passages import iter_passages
from fid.metrics.has_answer import AnswerMatcher, has_answer, tokenize

SAMPLES = Path(__file__).resolve().parents[1] / "samples"


@pytest.mark.parametrize(
    "text, tokens",
    [
        ("Hello, World!", ["hello", ",", "world", "!"]),
        ("U.S. Army", ["u", ".", "s", ".", "army"]),
        ("x_y 24–10", ["x", "_", "y", "24", "–", "10"]),
        ("  tabs\tand\nnewlines ", ["tabs", "and", "newlines"]),
        # NFD splits the accent into a combining mark, which stays inside the token.
        ("Beyoncé", ["beyonce\u0301"]),
        ("", []),
    ],
)
def test_tokenize(text, tokens):
    assert tokenize(text) == tokens


@pytest.mark.parametrize(
    "answer, text, expected",
    [
        # punctuation tokens count
        ("U.S.", "He served in the U.S. Army.", True),
        ("U.S. Army", "He served in the U.S. Army.", True),
        ("U.S.", "He served in the US Army.", False),
        ("US", "He served in the U.S. Army.", False),
        # case
        ("barack obama", "BARACK OBAMA was president.", True),
        # accents: DPR's real behaviour (NFD keeps the mark in the token)
        ("Beyonce", "Beyoncé released an album.", False),
        ("Beyoncé", "Beyonce released an album.", False),
        ("Beyoncé", "Beyoncé released an album.", True),
        ("Beyonce\u0301", "Beyoncé released an album.", True),  # decomposed == composed
        # multi-token answers must be contiguous
        ("New York City", "She moved to New York City in 1990.", True),
        ("New York City", "She moved to New York, a big city.", False),
        # a partial token is no match
        ("art", "They threw a party.", False),
        ("art", "They love modern art.", True),
        # numbers
        ("1,000", "About 1,000 people came.", True),
        ("1000", "About 1,000 people came.", False),
        ("24–10", "Denver won 24–10.", True),
        ("50", "Super Bowl 50 was played", True),
        ("5", "Super Bowl 50 was played", False),
        # no tokens: matches nothing (DPR would match everything)
        ("", "anything", False),
        ("   ", "anything", False),
    ],
)
def test_has_answer_string(answer, text, expected):
    assert has_answer([answer], text) is expected


def test_has_answer_any_of_several_answers_and_none():
    text = "The Denver Broncos won Super Bowl 50."
    assert has_answer(["Carolina Panthers", "Denver Broncos"], text)
    assert not has_answer(["Carolina Panthers"], text)
    assert not has_answer([], text)


@pytest.mark.parametrize(
    "pattern, text, expected",
    [
        (r"\b19[0-9]{2}\b", "It opened in 1969 to the public.", True),
        (r"\b19[0-9]{2}\b", "It opened in 2019 to the public.", False),
        (r"\b19[0-9]{2}\b", "Code 119690 is not a year.", False),
        (r"new\s+york", "He lives in NEW   York.", True),  # IGNORECASE
        (r"^second", "first line\nsecond line", True),  # MULTILINE
        (r"Beyonce\u0301", "Beyoncé", True),  # the pattern is NFD-normalized too
    ],
)
def test_has_answer_regex(pattern, text, expected):
    assert has_answer([pattern], text, mode="regex") is expected


def test_invalid_regex_raises_naming_the_pattern():
    with pytest.raises(ValueError, match=r"invalid answer regex '\(unclosed'"):
        has_answer(["(unclosed"], "text", mode="regex")


def test_matcher_reuses_prepared_answers_and_checks_mode():
    matcher = AnswerMatcher(["Denver Broncos", "Broncos"])
    texts = ["the Denver Broncos", "the broncos", "the Panthers"]
    assert [matcher.matches(text) for text in texts] == [True, True, False]
    assert matcher.matches_tokens(tokenize("go Broncos"))
    with pytest.raises(ValueError, match="mode"):
        AnswerMatcher(["x"], mode="exact")
    with pytest.raises(ValueError, match="string mode"):
        AnswerMatcher(["x"], mode="regex").matches_tokens(["x"])
    with pytest.raises(TypeError):
        AnswerMatcher("Denver Broncos")  # a bare string is not a list of answers


def test_tokenizer_equals_dpr_pattern_on_real_text():
    """DPR's SimpleTokenizer pattern, run with the `regex` module, on real passages."""
    regex = pytest.importorskip("regex")
    dpr = regex.compile(
        r"([\p{L}\p{N}\p{M}]+)|([^\p{Z}\p{C}])",
        flags=regex.IGNORECASE | regex.UNICODE | regex.MULTILINE,
    )
    texts = [p.text for p in iter_passages(SAMPLES / "dpr" / "psgs_w100.subset.tsv")]
    texts += ["Ǆemal ½ ² ٣ 中文 ﬁ \u200b x\u00a0y \U0001d400\U0001f600 İstanbul ß"]
    for text in texts:
        expected = [m.group().lower() for m in dpr.finditer(unicodedata.normalize("NFD", text))]
        assert tokenize(text) == expected
