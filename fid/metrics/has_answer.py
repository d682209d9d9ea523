"""DPR's has-answer rule: does a passage contain one of a question's gold answers?

Retrieval accuracy (top-k) in DPR, FiD and FiD-KD counts a passage as a hit when it contains an
answer under this rule (facebookresearch/DPR, `dpr/data/qa_validation.py::has_answer`):

- string mode: the passage text and each answer are NFD-normalized and split by DPR's
  `SimpleTokenizer` into runs of letters/digits/marks (`[\\p{L}\\p{N}\\p{M}]+`) and single other
  non-space characters (`[^\\p{Z}\\p{C}]`); tokens are lowercased; an answer matches when its
  token sequence occurs contiguously in the passage's token sequence.
- regex mode (CuratedTREC, whose answers are patterns): `re.search(pattern, NFD(text))` with
  IGNORECASE, UNICODE and MULTILINE.

Only the passage text is searched, never its title, as in DPR.

How the tokenizer is reproduced: DPR uses the third-party `regex` module for the `\\p{..}`
classes, which the stdlib `re` lacks. Here the classes are spelled out as explicit code-point
ranges built from `unicodedata` categories, once, on first use (~0.5 s): L*, N* and M* for the
runs; P* and S* for the single characters (the same thing as "not Z* or C*" once the runs have
taken L/N/M). `\\w` would be wrong: it admits `_` and leaves out combining marks. Checked over
every code point against DPR's `regex` pattern: the only differences are characters that this
Python's Unicode database (14.0 for Python 3.11) does not assign yet.

Two consequences of the rule that surprise people, kept on purpose because published numbers
depend on them:

- NFD keeps accents as separate combining marks, and marks belong to the token, so "Beyoncé"
  tokenizes to "beyonce" + U+0301 and does NOT match an answer written "Beyonce" (nor the reverse).
- Punctuation tokens count: the answer "U.S." is the tokens u . s . and matches "the U.S. Army"
  but not "the US Army".

One deliberate difference: DPR lets an answer with no tokens (an empty string) match every
passage; here such an answer matches nothing.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata
from collections.abc import Sequence
from typing import Literal

from fid.errors import InputError

MatchMode = Literal["string", "regex"]
_MODES = ("string", "regex")


def _class_body(codes: list[int]) -> str:
    """A character-class body (`\\Uxxxxxxxx-\\Uyyyyyyyy...`) matching exactly `codes` (sorted)."""
    parts = []
    run_start = previous = None
    for code in [*codes, None]:
        if code is not None and previous is not None and code == previous + 1:
            previous = code
            continue
        if run_start is not None:
            parts.append(
                f"\\U{run_start:08x}"
                if run_start == previous
                else f"\\U{run_start:08x}-\\U{previous:08x}"
            )
        run_start = previous = code
    return "".join(parts)


@functools.cache
def _token_pattern() -> re.Pattern[str]:
    """DPR SimpleTokenizer's `([\\p{L}\\p{N}\\p{M}]+)|([^\\p{Z}\\p{C}])`, spelled for `re`.

    Two rewrites keep it fast and exact. (1) The second alternative only ever sees characters
    outside L/N/M (the first would have taken them), so "not Z or C" is the same as "P or S".
    (2) `re` tests a class's characters above U+FFFF as a list of ranges after its BMP bitmap,
    so every non-matching character (each space) would walk that list; each class is split into
    its BMP part and an astral part guarded by a one-range lookahead.
    """
    classes: dict[tuple[str, bool], list[int]] = {}
    for code in range(sys.maxunicode + 1):
        major = unicodedata.category(chr(code))[0]
        kind = "word" if major in "LNM" else "symbol" if major in "PS" else None
        if kind is not None:
            classes.setdefault((kind, code > 0xFFFF), []).append(code)
    astral = "(?=[\\U00010000-\\U0010ffff])"
    word_bmp, word_astral, symbol_bmp, symbol_astral = (
        _class_body(classes.get(key, []))
        for key in [("word", False), ("word", True), ("symbol", False), ("symbol", True)]
    )
    return re.compile(
        f"(?:[{word_bmp}]|{astral}[{word_astral}])+|[{symbol_bmp}]|{astral}[{symbol_astral}]"
    )


def _normalize(text: str) -> str:
    return unicodedata.normalize("NFD", text)


def tokenize(text: str) -> list[str]:
    """DPR's uncased tokens of `text` (NFD-normalized first, as DPR's has-answer does).

    Args:
        text: any text.

    Returns:
        Lowercased tokens: alphanumeric runs (with their combining marks) and single
        punctuation/symbol characters, in order.
    """
    # Lowercase each token after splitting (DPR's `words(uncased=True)`), not the text before:
    # a few characters change length when lowercased.
    return [match.group().lower() for match in _token_pattern().finditer(_normalize(text))]


def _contains(haystack: list[str], needle: list[str]) -> bool:
    """Whether `needle` (non-empty) occurs as a contiguous run in `haystack`."""
    n = len(needle)
    first = needle[0]
    return any(
        haystack[i] == first and haystack[i : i + n] == needle for i in range(len(haystack) - n + 1)
    )


class AnswerMatcher:
    """The has-answer rule for one question, with its answers prepared once.

    Checking a question's 100 retrieved passages tokenizes (or compiles) each answer once rather
    than once per passage.

    Args:
        answers: the question's gold answers (strings in string mode, patterns in regex mode).
        mode: "string" (token match, the default) or "regex".

    Raises:
        ValueError: an unknown mode, or (regex mode) an answer that is not a valid pattern.
    """

    def __init__(self, answers: Sequence[str], mode: MatchMode = "string"):
        if mode not in _MODES:
            raise ValueError(f"has-answer mode must be one of {_MODES}, got {mode!r}")
        if isinstance(answers, str):
            raise TypeError("answers must be a sequence of strings, not a single string")
        self.mode = mode
        self._token_answers: list[list[str]] = []
        self._patterns: list[re.Pattern[str]] = []
        if mode == "string":
            # An answer without tokens would match everywhere (DPR's quirk): leave it out.
            self._token_answers = [tokens for tokens in map(tokenize, answers) if tokens]
        else:
            self._patterns = [_compile(answer) for answer in answers]

    def matches(self, text: str) -> bool:
        """Whether the passage `text` contains one of the answers."""
        if self.mode == "regex":
            normalized = _normalize(text)
            return any(pattern.search(normalized) for pattern in self._patterns)
        if not self._token_answers:
            return False
        return self.matches_tokens(tokenize(text))

    def matches_tokens(self, tokens: list[str]) -> bool:
        """String mode, for a passage already split by `tokenize` (to share it among questions).

        Raises:
            ValueError: in regex mode, which matches raw text.
        """
        if self.mode != "string":
            raise ValueError("matches_tokens needs string mode; regex answers match raw text")
        return any(_contains(tokens, answer) for answer in self._token_answers)


def _compile(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(_normalize(pattern), re.IGNORECASE | re.UNICODE | re.MULTILINE)
    except re.error as error:
        raise InputError(f"invalid answer regex {pattern!r}: {error}") from None


def has_answer(answers: Sequence[str], text: str, mode: MatchMode = "string") -> bool:
    """Whether the passage `text` contains one of `answers` under DPR's rule.

    Args:
        answers: gold answers (regex mode: patterns); an empty list never matches.
        text: the passage text (without its title, as in DPR).
        mode: "string" or "regex".

    Returns:
        True when some answer matches.

    Raises:
        ValueError: an unknown mode or an invalid pattern in regex mode.
    """
    return AnswerMatcher(answers, mode).matches(text)
