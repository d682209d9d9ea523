"""Models from their folders (or hub names), ready for a command: the reader and its tokenizer,
the retriever and its tokenizer."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from transformers import AutoTokenizer, T5ForConditionalGeneration
from transformers.utils import logging as transformers_logging

from fid.models.folder_checks import ModelFolderError, check_retriever
from fid.models.reader import CROSS_ATTENTION_BIAS, FiDReader, add_cross_attention_bias
from fid.models.retriever import DualEncoder, RetrieverTokenizer
from fid.models.settings import READER_SETTINGS_FILE, ReaderSettings, resolve_setting

# Lengths of a model whose folder records none (a plain pretrained encoder, an older fid's).
DEFAULT_QUESTION_MAX_TOKENS = 40
DEFAULT_PASSAGE_MAX_TOKENS = 200


def load_reader(
    name_or_path: str, encoder_buckets: int, pack_passages: bool, dropout: float | None = None
) -> tuple[FiDReader, object]:
    """A FiD reader and its tokenizer from a hub name or a local folder (with the cross-attention
    bias of a released checkpoint when its folder records one: fid.models.settings)."""
    overrides = {} if dropout is None else {"dropout_rate": dropout}
    folder = Path(name_or_path)
    settings = ReaderSettings.load(folder) if folder.is_dir() else ReaderSettings()
    if settings.cross_attention_bias:
        with _quiet_transformers():  # the bias is an "unused" key to transformers: it is ours
            t5 = T5ForConditionalGeneration.from_pretrained(name_or_path, **overrides)
        add_cross_attention_bias(t5, _tensor(folder / "model.safetensors", CROSS_ATTENTION_BIAS))
    else:
        t5 = T5ForConditionalGeneration.from_pretrained(name_or_path, **overrides)
    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    return FiDReader(t5, encoder_buckets, pack_passages), tokenizer


@contextlib.contextmanager
def _quiet_transformers():
    level = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers_logging.set_verbosity(level)


def _tensor(path: Path, key: str) -> torch.Tensor:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        keys = handle.keys()
        if key not in keys:
            raise ModelFolderError(f"{path}: no {key}, but {READER_SETTINGS_FILE} says it has one")
        return handle.get_tensor(key)


def load_retriever(
    model: Path,
    question_max_tokens: int | None,
    passage_max_tokens: int | None,
    device: torch.device,
    *,
    override: bool = False,
) -> tuple[DualEncoder, RetrieverTokenizer]:
    """A retriever folder (checked first) in eval mode on `device`, and its input encoder.

    The input format, prefixes and lengths are the model's own (its DualEncoderSpec); a length
    given here must agree with the recorded one unless `override` (fid.models.settings). A
    plain encoder folder records none: the given lengths, else DEFAULT_*_MAX_TOKENS.

    Raises:
        ModelFolderError: a missing or incomplete folder.
        ModelSettingsError: a length that disagrees with the model's.
    """
    check_retriever(model)
    retriever, tokenizer = DualEncoder.from_pretrained(model)
    spec = retriever.spec
    lengths = {
        name: resolve_setting(
            name, recorded, given, model=model, override=override, default=default
        )
        for name, recorded, given, default in (
            ("question_max_tokens", spec.question_max_tokens, question_max_tokens,
             DEFAULT_QUESTION_MAX_TOKENS),
            ("passage_max_tokens", spec.passage_max_tokens, passage_max_tokens,
             DEFAULT_PASSAGE_MAX_TOKENS),
        )
    }  # fmt: skip
    retriever.to(device).eval()
    encode = RetrieverTokenizer.for_spec(
        tokenizer, spec, lengths["question_max_tokens"], lengths["passage_max_tokens"]
    )
    return retriever, encode
