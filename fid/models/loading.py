"""Models from their folders (or hub names), ready for a command: the reader and its tokenizer,
the retriever and its tokenizer."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer, T5ForConditionalGeneration
from transformers.utils import logging as transformers_logging

from fid.models.cross_attention_bias import CROSS_ATTENTION_BIAS, add_cross_attention_bias
from fid.models.folder_checks import ModelFolderError, check_retriever
from fid.models.pretrained import load_pretrained
from fid.models.reader import FiDReader
from fid.models.reader_variants import remove_cross_attention, removed_weight_prefixes
from fid.models.retriever import DualEncoder, RetrieverTokenizer
from fid.models.settings import READER_SETTINGS_FILE, ReaderSettings, resolve_setting

# Lengths of a model whose folder records none (a plain pretrained encoder, an older fid's).
DEFAULT_QUESTION_MAX_TOKENS = 40
DEFAULT_PASSAGE_MAX_TOKENS = 200


LM_HEAD = "lm_head.weight"


def load_reader(
    name_or_path: str,
    encoder_buckets: int,
    pack_passages: bool,
    dropout: float | None = None,
    *,
    light_tokens: int | None = None,
    cross_attention_every: int | None = None,
) -> tuple[FiDReader, object]:
    """A FiD reader and its tokenizer from a hub name or a local folder, built as its folder
    records (`load_t5`).

    `light_tokens` is the reader's (the caller resolves it against the folder's record);
    `cross_attention_every` removes more cross-attention layers (None: the folder's layers).
    """
    t5 = load_t5(name_or_path, dropout)
    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    reader = FiDReader(
        t5, encoder_buckets, pack_passages, light_tokens=light_tokens,
        cross_attention_every=cross_attention_every,
    )  # fmt: skip
    return reader, tokenizer


def load_t5(name_or_path: str, dropout: float | None = None) -> T5ForConditionalGeneration:
    """A reader's T5 from a hub name or a local folder, built as its folder records
    (fid.models.settings): with the cross-attention bias of a released checkpoint, or FiDO's
    layer-sparse decoder."""
    overrides = {} if dropout is None else {"dropout_rate": dropout}
    folder = Path(name_or_path)
    settings = ReaderSettings.load(folder) if folder.is_dir() else ReaderSettings()
    if settings.cross_attention_bias:
        with _quiet_transformers():  # the bias is an "unused" key to transformers: it is ours
            t5 = load_pretrained(T5ForConditionalGeneration, name_or_path, **overrides)
        add_cross_attention_bias(
            t5, _tensor(folder / "model.safetensors", CROSS_ATTENTION_BIAS).float()
        )  # fp32 as the rest
        return t5
    if settings.cross_attention_every > 1:
        return _layer_sparse_t5(name_or_path, settings.cross_attention_every, overrides)
    return load_pretrained(T5ForConditionalGeneration, name_or_path, **overrides)


def reader_skeleton(
    name_or_path: str, dropout: float | None = None, **reader_options
) -> tuple[FiDReader, object, Path] | None:
    """The reader `load_reader` builds, with its parameters on the meta device (no memory),
    its tokenizer, and the folder whose safetensors hold its weights; None where the weights
    are in no safetensors file (then only the whole model can be loaded). `reader_options`:
    FiDReader's (encoder_buckets, pack_passages, light_tokens, cross_attention_every).

    For FSDP: the caller shards the skeleton, then each rank reads only its own slices
    (fid.training.sharded_weights), so no rank ever holds the whole model.
    """
    folder = weights_folder(name_or_path)
    if folder is None:
        return None
    overrides = {} if dropout is None else {"dropout_rate": dropout}
    settings = ReaderSettings.load(folder) if Path(name_or_path).is_dir() else ReaderSettings()
    config = AutoConfig.from_pretrained(name_or_path, **overrides)
    with torch.device("meta"):
        t5 = T5ForConditionalGeneration(config)
        if (
            not getattr(config, "scale_decoder_outputs", True)
            and _stored_shape(folder, LM_HEAD) is not None
        ):
            untie_lm_head(t5)  # T5 v1.1 / flan-t5: as from_pretrained loads their own lm_head
        if settings.cross_attention_bias:
            add_cross_attention_bias(t5, torch.empty(_tensor_shape(folder, CROSS_ATTENTION_BIAS)))
        elif settings.cross_attention_every > 1:
            remove_cross_attention(t5, settings.cross_attention_every)
        reader = FiDReader(t5, **reader_options)
    return reader, AutoTokenizer.from_pretrained(name_or_path), folder


def untie_lm_head(t5: T5ForConditionalGeneration) -> None:
    """Gives `t5` an lm_head of its own (uninitialised, on the embedding's device).

    transformers 5 builds every T5 from a config with its lm_head tied to `shared` (config.json's
    `tie_word_embeddings: false`, T5 v1.1's and flan-t5's, survives only as
    `scale_decoder_outputs`) and unties it only when from_pretrained finds a different lm_head in
    the checkpoint. A T5 built from its config alone (the sharded build, the memory plan) must
    untie it itself, and keep `tie_weights()` from tying it back: that recomputes the ties from
    the class's `_tied_weights_keys` (gated by config.tie_word_embeddings, which also ties the
    encoder's and decoder's embeddings to `shared`, so the flag must stay), hence the instance's
    own mapping without the lm_head."""
    t5.lm_head.weight = torch.nn.Parameter(torch.empty_like(t5.shared.weight))
    t5._tied_weights_keys = {k: v for k, v in t5._tied_weights_keys.items() if k != LM_HEAD}
    getattr(t5, "all_tied_weights_keys", {}).pop(LM_HEAD, None)


def weights_folder(name_or_path: str) -> Path | None:
    """The local folder holding a model's safetensors: the folder itself, or a hub model's
    cached snapshot (its safetensors and config only); None where it has none."""
    folder = Path(name_or_path)
    if not folder.is_dir():
        from huggingface_hub import snapshot_download

        folder = Path(snapshot_download(name_or_path, allow_patterns=["*.safetensors", "*.json"]))
    return folder if any(folder.glob("*.safetensors")) else None


def _stored_shape(folder: Path, key: str) -> tuple[int, ...] | None:
    """A tensor's shape from the folder's safetensors headers (nothing else is read); None
    where no file holds it."""
    from safetensors import safe_open

    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            if key in handle.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                return tuple(handle.get_slice(key).get_shape())
    return None


def _tensor_shape(folder: Path, key: str) -> tuple[int, ...]:
    shape = _stored_shape(folder, key)
    if shape is None:
        raise ModelFolderError(f"{folder}: no {key}, but {READER_SETTINGS_FILE} says it has one")
    return shape


def _layer_sparse_t5(name_or_path: str, every: int, overrides: dict) -> T5ForConditionalGeneration:
    """A FiDO folder's T5: the dense model loaded (transformers initialises the cross-attention
    sublayers whose weights the folder lacks), then those sublayers removed again.

    Raises:
        ModelFolderError: the folder lacks other weights, or has unknown ones.
    """
    with _quiet_transformers():  # the removed layers' weights are "missing": by design
        t5, info = load_pretrained(
            T5ForConditionalGeneration, name_or_path, output_loading_info=True, **overrides
        )
    removed = tuple(removed_weight_prefixes(every, len(t5.decoder.block)))
    wrong = sorted(k for k in info["missing_keys"] if not k.startswith(removed))
    wrong += sorted(info["unexpected_keys"]) + sorted(info["mismatched_keys"])
    if wrong:
        raise ModelFolderError(
            f"{name_or_path}: its weights do not fit a decoder with cross-attention in every "
            f"{every}-th layer ({READER_SETTINGS_FILE}): missing or unexpected {wrong[:5]}"
        )
    remove_cross_attention(t5, every)
    return t5


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
