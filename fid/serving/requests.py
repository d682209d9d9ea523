"""The question of a POST /api/ask request, checked from its headers and body (fid.serving.server
routes requests): a `RequestError` (a 4xx status and one message) for anything else.

Checked in this order, each before any byte of the body is read but the last:
- Content-Type: application/json (charset utf-8 or none), else 415. It also keeps another web
  site's plain form or fetch from posting here: a browser sends a cross-site JSON request only
  after a CORS preflight, which this server never grants.
- Transfer-Encoding (a chunked body): 411, as no Content-Length: the length is what is checked.
- Content-Length: digits, at most MAX_BODY_BYTES, else 400 or 413 (the body not read at all).
- the body: all of it within the server's request timeout (else 408 from the server), UTF-8
  (the first byte that is not is named), JSON, exactly {"question": "<text>"}, the text valid
  Unicode (no lone surrogates from \\ud800 escapes) and not blank.
The question's length in reader tokens is the server's check (it needs the tokenizer).

Standard library only.
"""

from __future__ import annotations

import json
import re
from email.message import Message
from http import HTTPStatus
from typing import BinaryIO

# A question within the reader's budget is well under 1 KiB of UTF-8 (the demo's: 48 tokens);
# 16 KiB leaves room for JSON escapes (\uXXXX: 6 bytes a character) and refuses anything that
# is no question before it is read.
MAX_BODY_BYTES = 16 * 1024
JSON_TYPES = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "true or false",
    type(None): "null",
}


class RequestError(Exception):
    """A request this server refuses: its HTTP status, its message (the JSON {"error": ...}
    sent back) and any headers the status calls for (405's Allow)."""

    def __init__(self, status: HTTPStatus, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def body_length(headers: Message) -> int:
    """The body's length in bytes from the headers, checked before the body is read.

    Raises:
        RequestError: 415 not JSON, 411 no Content-Length (or a chunked body), 400 a
            Content-Length that is not one number, 413 over MAX_BODY_BYTES.
    """
    if "Content-Type" not in headers:
        raise RequestError(
            HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "no Content-Type: expected application/json"
        )
    media, charset = headers.get_content_type(), headers.get_content_charset()
    if media != "application/json" or charset not in (None, "utf-8", "utf8"):
        raise RequestError(
            HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
            f"Content-Type {_short(headers['Content-Type'])}: expected application/json (in UTF-8)",
        )
    if "Transfer-Encoding" in headers:
        raise RequestError(
            HTTPStatus.LENGTH_REQUIRED,
            "a body without Content-Length (Transfer-Encoding "
            f"{_short(headers['Transfer-Encoding'])}) is not read: expected "
            "Content-Length",
        )
    lengths = headers.get_all("Content-Length") or []
    if not lengths:
        raise RequestError(
            HTTPStatus.LENGTH_REQUIRED,
            "no Content-Length: expected the JSON body's length in bytes",
        )
    if len(set(lengths)) > 1 or not re.fullmatch(r"[0-9]{1,20}", lengths[0].strip()):
        raise RequestError(
            HTTPStatus.BAD_REQUEST,
            f"Content-Length {_short(', '.join(lengths))}: expected one number of bytes",
        )
    length = int(lengths[0])
    if length > MAX_BODY_BYTES:
        raise RequestError(
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            f"a body of {length} bytes: expected at most {MAX_BODY_BYTES} "
            '(a JSON {"question": "..."})',
        )
    return length


def read_question(stream: BinaryIO, length: int) -> str:
    """The question of a body `length` bytes long read from `stream`, stripped.

    Raises:
        RequestError: 400 for a body that ends early, is not UTF-8, not JSON, not
            {"question": "<text>"}, or holds a blank question or lone surrogates.
        TimeoutError: the client sent the body slower than the socket's timeout.
    """
    raw = stream.read(length)
    if len(raw) < length:
        raise RequestError(
            HTTPStatus.BAD_REQUEST,
            f"the body ended after {len(raw)} of its {length} bytes (Content-Length)",
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestError(
            HTTPStatus.BAD_REQUEST,
            f"the body is not UTF-8 (byte 0x{raw[error.start]:02x} at byte offset "
            f"{error.start}: {error.reason}): expected JSON in UTF-8",
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise RequestError(
            HTTPStatus.BAD_REQUEST,
            f"the body is not JSON ({error.msg} at line {error.lineno} column "
            f'{error.colno}): expected {{"question": "..."}}',
        ) from None
    except RecursionError:  # arrays nested thousands deep
        raise RequestError(
            HTTPStatus.BAD_REQUEST, 'the body nests too deep: expected {"question": "..."}'
        ) from None
    return _question(data)


def _question(data: object) -> str:
    """The question of a parsed body, checked."""
    if not isinstance(data, dict) or "question" not in data:
        got = "an object without it" if isinstance(data, dict) else _json_type(data)
        raise RequestError(
            HTTPStatus.BAD_REQUEST, f'expected a JSON object {{"question": "..."}}, got {got}'
        )
    unknown = sorted(set(data) - {"question"})
    if unknown:
        raise RequestError(
            HTTPStatus.BAD_REQUEST,
            f'unknown key(s) {", ".join(map(_short, unknown))}: expected only "question"',
        )
    question = data["question"]
    if not isinstance(question, str):
        raise RequestError(
            HTTPStatus.BAD_REQUEST, f"question: {_json_type(question)}: expected a string"
        )
    try:
        question.encode("utf-8")
    except UnicodeEncodeError as error:
        raise RequestError(
            HTTPStatus.BAD_REQUEST,
            f"question: character {error.start + 1} is a lone surrogate "
            f"({question[error.start]!r}): expected Unicode text",
        ) from None
    question = question.lstrip("\ufeff").strip()  # as fid ask reads a line
    if not question:
        raise RequestError(HTTPStatus.BAD_REQUEST, "question: empty: expected a question")
    return question


def _json_type(value: object) -> str:
    return JSON_TYPES.get(type(value), type(value).__name__)


def _short(text: str, limit: int = 60) -> str:
    """`text` quoted, cut to `limit` characters (a header or key echoed back)."""
    return repr(text if len(text) <= limit else text[:limit] + "...")
