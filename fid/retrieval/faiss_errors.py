"""faiss's errors as messages name them: a faiss C++ exception reaches Python as a RuntimeError
whose text starts with the C++ signature, file and line; a message to a user keeps the reason.
A module of its own so that the index, its build and the residual codes' training, which all
report faiss's errors, need not import each other for it."""

from __future__ import annotations

import re


def faiss_message(error: Exception) -> str:
    """The readable part of a faiss C++ error ("Error in <signature> at <file>:<line>: <text>")."""
    text = str(error).strip()
    match = re.search(r" at \S+:\d+: (.*)", text, flags=re.DOTALL)
    return match.group(1).strip() if match else text


__all__ = ["faiss_message"]
