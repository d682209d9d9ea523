"""Models from their folders (or hub names), ready for a command: the reader and its tokenizer,
the retriever and its tokenizer."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoTokenizer, T5ForConditionalGeneration

from fid.models.folder_checks import check_retriever
from fid.models.reader import FiDReader
from fid.models.retriever import DualEncoder, RetrieverTokenizer


def load_reader(
    name_or_path: str, encoder_buckets: int, pack_passages: bool, dropout: float | None = None
) -> tuple[FiDReader, object]:
    """A FiD reader and its tokenizer from a hub name or a local folder."""
    overrides = {} if dropout is None else {"dropout_rate": dropout}
    t5 = T5ForConditionalGeneration.from_pretrained(name_or_path, **overrides)
    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    return FiDReader(t5, encoder_buckets, pack_passages), tokenizer


def load_retriever(
    model: Path, question_max_tokens: int, passage_max_tokens: int, device: torch.device
) -> tuple[DualEncoder, RetrieverTokenizer]:
    """A retriever folder (checked first) in eval mode on `device`, and its input encoder."""
    check_retriever(model)
    retriever, tokenizer = DualEncoder.from_pretrained(model)
    retriever.to(device).eval()
    return retriever, RetrieverTokenizer(tokenizer, question_max_tokens, passage_max_tokens)
