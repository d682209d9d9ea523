"""The questions `fid ask` is given, decoded as UTF-8: its command-line words, or stdin's lines.

Standard library only: the CLI checks them before torch is imported (fid.cli.commands
`prepare_ask`), so that a bad input is said at once rather than after seconds of imports.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

from fid.errors import InputError
from fid.text_files import decode_line


def argument_question(words: Sequence[str]) -> str:
    """The question given as command-line words, checked to be UTF-8 text.

    Raises:
        InputError: naming the word, and the byte, that is not UTF-8.
    """
    for number, word in enumerate(words, 1):
        raw = os.fsencode(word)  # the bytes given (Python keeps undecodable ones as surrogates)
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise InputError(
                f"fid ask: word {number} of the question ({raw!r}): not UTF-8 (byte "
                f"0x{raw[error.start]:02x} at byte offset {error.start}: {error.reason}): "
                "expected a question in UTF-8"
            ) from None
    return " ".join(words)


class StdinQuestions:
    """The lines of a stream (stdin), each decoded as UTF-8 on its own, as read (a terminal's
    input as typed).

    Iterating raises InputError at the first line holding a byte that is not UTF-8, naming its
    line and byte offset, after yielding the lines before it.
    """

    def __init__(self, stream):
        self.stream = stream

    def isatty(self) -> bool:
        return self.stream.isatty()

    def __iter__(self) -> Iterator[str]:
        binary = getattr(self.stream, "buffer", None)
        # A text stream (tests, an embedding program) is encoded back as it was decoded: the
        # bytes that were not UTF-8 return from Python's surrogate escapes.
        lines = binary if binary is not None else (
            line.encode("utf-8", "surrogateescape") for line in self.stream
        )  # fmt: skip
        offset = 0
        for number, raw in enumerate(lines, 1):
            yield decode_line(raw, "stdin", "questions, one a line,", number, offset, InputError)
            offset += len(raw)
