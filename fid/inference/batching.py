"""What generation and scoring share: a reader loaded for inference, and question batches of
similar total length (sorted by their passage tokens), so little padding is wasted."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from fid.data.examples import Example
from fid.data.reader_batches import ReaderCollator
from fid.models.folder_checks import check_reader
from fid.models.loading import load_reader
from fid.models.settings import READER_PASSAGE_MAX_TOKENS, ReaderSettings, resolve_setting
from fid.runtime.progress import progress

DEFAULT_PASSAGE_MAX_TOKENS = READER_PASSAGE_MAX_TOKENS  # fid.models.settings says why


def reader_and_collator(cfg, model_path: Path, device: torch.device):
    """The reader of a folder in eval mode on `device`, its tokenizer and a collator of `cfg`'s
    reader inputs (`cfg`: an EvalReaderConfig or ScorePassagesConfig).

    The passage length and FiD-Light's `light_tokens` are the model's own (`fid_reader.json`,
    written by training); a config value that differs is refused unless
    `cfg.override_model_settings` (fid.models.settings). A FiDO model's decoder is rebuilt as
    recorded. A plain model read with `light_tokens` is FiD-Light without fine-tuning.
    """
    check_reader(model_path)
    settings = ReaderSettings.load(model_path) if Path(model_path).is_dir() else ReaderSettings()
    passage_max_tokens = resolve_setting(
        "passage_max_tokens",
        settings.passage_max_tokens,
        cfg.passage_max_tokens,
        model=model_path,
        override=cfg.override_model_settings,
        default=DEFAULT_PASSAGE_MAX_TOKENS,
    )
    light_tokens = resolve_setting(
        "light_tokens",
        settings.light_tokens,
        cfg.light_tokens,
        model=model_path,
        override=cfg.override_model_settings,
    )
    reader, tokenizer = load_reader(
        str(model_path), cfg.encoder_buckets, cfg.pack_passages, light_tokens=light_tokens
    )
    reader.to(device).eval()
    reader.set_attention(cfg.attention, device)
    collator = ReaderCollator(
        tokenizer, cfg.n_passages, passage_max_tokens, pad_to_max_length=cfg.pad_to_max_length
    )
    return reader, tokenizer, collator


def length_sorted_batches(
    collator: ReaderCollator, examples: Sequence[Example], batch_size: int
) -> list[list[int]]:
    """Batches of example indices, longest questions first (a too-large batch fails early)."""
    counts = collator.question_token_counts(examples)
    order = sorted(range(len(examples)), key=lambda i: -counts[i])
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def counted(batches: list[list[int]], desc: str, log: logging.Logger) -> Iterator[list[int]]:
    """The batches, with their questions counted in the progress log (lines go to `log`)."""
    with progress(desc=desc, unit="questions", total=sum(map(len, batches)), log=log) as bar:
        for batch in batches:
            yield batch
            bar.update(len(batch))
