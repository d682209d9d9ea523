"""Checks of the model folders `fid` loads, before loading them.

transformers loads an incomplete folder without a word, or fails far from the cause: without
tokenizer files a T5 folder gets an empty 104-token tokenizer (and an EM of 0.00), without
`config.json` the error names neither folder nor file, a truncated `model.safetensors` ends in
a `SafetensorError`, and a tokenizer larger than the model's vocabulary in an `IndexError` in
the first forward pass. Each check here names the folder and the file that is missing or wrong.

A name that is not a local folder goes to transformers as a hub name (e.g. `t5-base`), as before;
only its resolution is checked (a name transformers cannot find is an input error).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from fid.errors import InputError
from fid.models.retriever_spec import CONFIG_FILE, HEAD_FILE, DualEncoderSpec
from fid.text_files import read_json

logger = logging.getLogger(__name__)

# transformers' weight files, single-file or sharded (the index lists the shards).
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
# A fast tokenizer's tokenizer.json, or a slow one's vocabulary (T5: spiece.model, BERT: vocab.txt).
TOKENIZER_FILES = ("tokenizer.json", "spiece.model", "vocab.txt", "vocab.json")
READER_MODEL_TYPES = ("t5", "mt5")
# Names of the input embedding matrix (vocabulary rows) in T5 and in BERT-like encoders.
_EMBEDDING_KEYS = ("shared.weight", "word_embeddings.weight", "embed_tokens.weight")


class ModelFolderError(InputError):
    """A model folder lacks a file the model needs, or its files do not fit together."""


def _looks_like_path(name: str) -> bool:
    """Hub names are `name` or `org/name`; anything else that is not a folder meant one."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or name.endswith("/")


def _read_json(path: Path, what: str, transformers_reads: bool = True) -> Any:
    """A json file of a model folder; one that transformers reads too (config.json, a shard
    index) must come without a byte-order mark, which transformers cannot read."""
    refused = "transformers cannot read" if transformers_reads else None
    return read_json(path, what, kind=ModelFolderError, bom_refused=refused)


def _safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """The tensor shapes a safetensors file holds (reads its header only)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            return {key: handle.get_slice(key).get_shape() for key in handle.keys()}  # noqa: SIM118
    except SafetensorError as error:
        raise ModelFolderError(
            f"{path}: not a readable safetensors file ({error}): truncated or corrupted. "
            "Hint: copy or download it again, or re-export the model"
        ) from None


def _weights_shapes(folder: Path) -> dict[str, list[int]] | None:
    """Shapes of the folder's safetensors weights (every shard checked); None for .bin files."""
    present = [name for name in WEIGHT_FILES if (folder / name).is_file()]
    if not present:
        raise ModelFolderError(
            f"{folder}: no model weights: expected one of {', '.join(WEIGHT_FILES)}. "
            "Hint: is this the folder that `fid` (or save_pretrained) wrote?"
        )
    name = present[0]
    if name == "model.safetensors":
        return _safetensors_shapes(folder / name)
    if name == "model.safetensors.index.json":
        index = _read_json(folder / name, "a safetensors shard index")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict):
            raise ModelFolderError(f"{folder / name}: expected an object with a 'weight_map'")
        shapes: dict[str, list[int]] = {}
        for shard in sorted(set(weight_map.values())):
            if not (folder / shard).is_file():
                raise ModelFolderError(
                    f"{folder / shard}: weight shard not found (listed in {name})"
                )
            shapes.update(_safetensors_shapes(folder / shard))
        return shapes
    return None  # a pickled .bin: transformers checks it when it loads it


def _embedding_rows(shapes: dict[str, list[int]] | None) -> int | None:
    if shapes is None:
        return None
    for key, shape in shapes.items():
        if key.endswith(_EMBEDDING_KEYS) and len(shape) == 2:
            return shape[0]
    return None


def _check_tokenizer(folder: Path, n_rows: int | None, needs_pad_and_eos: bool) -> None:
    """Loads the folder's tokenizer and checks that every token id has an embedding row."""
    from transformers import AutoTokenizer

    present = [name for name in TOKENIZER_FILES if (folder / name).is_file()]
    if not present:
        raise ModelFolderError(
            f"{folder}: no tokenizer files: expected one of {', '.join(TOKENIZER_FILES)} "
            "(without them transformers builds an empty tokenizer). Hint: save the tokenizer "
            "beside the model (`fid convert-checkpoint --tokenizer`, or tokenizer.save_pretrained)"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except Exception as error:  # tokenizers raises plain Exception for a bad tokenizer.json
        raise ModelFolderError(
            f"{folder / present[0]}: cannot load the tokenizer: {type(error).__name__}: {error}"
        ) from None
    if n_rows is not None and len(tokenizer) > n_rows:
        raise ModelFolderError(
            f"{folder}: the tokenizer has {len(tokenizer)} tokens but the model's vocabulary "
            f"(its embedding) has {n_rows} rows: ids >= {n_rows} would fail. Hint: save the "
            "tokenizer the model was trained with, or resize the model's embeddings"
        )
    if needs_pad_and_eos and (tokenizer.pad_token_id is None or tokenizer.eos_token_id is None):
        raise ModelFolderError(
            f"{folder / present[0]}: the reader's tokenizer needs a pad token and an EOS token"
        )


def check_model_folder(
    folder: Path,
    *,
    what: str,
    tokenizer: bool = True,
    model_types: tuple[str, ...] | None = None,
    needs_pad_and_eos: bool = False,
    encoder_only: bool = False,
) -> None:
    """Checks one Hugging Face model folder: config.json, weights, tokenizer and their sizes.

    Args:
        folder: the folder.
        what: what the folder is meant to hold, for messages ("reader", ...).
        tokenizer: whether the folder must hold the model's tokenizer.
        model_types: the config's `model_type`s the command can load (None: any).
        needs_pad_and_eos: the tokenizer must define pad and EOS tokens (the reader's).
        encoder_only: the model must be an encoder (a retriever's), not an encoder-decoder.

    Raises:
        ModelFolderError: naming the folder and the missing or inconsistent file.
    """
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ModelFolderError(
            f"{folder}: no config.json: expected a {what} model folder (config.json, weights, "
            "tokenizer files), as `fid` or save_pretrained writes it"
        )
    config = _read_json(config_file, "a transformers model config")
    if not isinstance(config, dict):
        raise ModelFolderError(f"{config_file}: expected a JSON object (a model config)")
    model_type = config.get("model_type")
    if model_types is not None and model_type not in model_types:
        raise ModelFolderError(
            f"{config_file}: model_type {model_type!r}, but a {what} must be one of "
            f"{', '.join(model_types)}. Hint: is this the right folder?"
        )
    if encoder_only and config.get("is_encoder_decoder"):
        raise ModelFolderError(
            f"{config_file}: an encoder-decoder ({model_type}), but a {what} is an encoder "
            "(BERT, MiniLM, ...). Hint: is this the reader's folder?"
        )
    n_rows = _embedding_rows(_weights_shapes(folder))
    vocab_size = config.get("vocab_size")
    if n_rows is not None and isinstance(vocab_size, int) and vocab_size != n_rows:
        raise ModelFolderError(
            f"{config_file}: vocab_size {vocab_size}, but the weights' embedding has {n_rows} "
            "rows: config.json and the weights come from different models"
        )
    if n_rows is None and isinstance(vocab_size, int):
        n_rows = vocab_size  # .bin weights: the config says how many rows they hold
    if tokenizer:
        _check_tokenizer(folder, n_rows, needs_pad_and_eos)


def _check_hub_name(name: str, what: str) -> None:
    """A name that is no local folder must be one transformers can resolve (hub or cache)."""
    from transformers import AutoConfig

    if Path(name).expanduser().exists():
        raise ModelFolderError(f"{name}: not a folder: expected a {what} model folder")
    if _looks_like_path(name):
        raise ModelFolderError(f"{name}: {what} model folder not found")
    try:
        AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise ModelFolderError(
            f"{name}: no such {what} model folder, and transformers cannot load it as a hub "
            f"name: {first_line}"
        ) from None


def check_reader(name_or_path: str | Path) -> None:
    """Checks a reader (a T5 folder with its tokenizer) before `fid` loads it.

    Raises:
        ModelFolderError: a missing folder, file or token, or sizes that do not fit.
    """
    folder = Path(name_or_path).expanduser()
    if not folder.is_dir():
        _check_hub_name(str(name_or_path), "reader")
        return
    check_model_folder(
        folder, what="reader", model_types=READER_MODEL_TYPES, needs_pad_and_eos=True
    )


def check_retriever(name_or_path: str | Path) -> None:
    """Checks a retriever before `fid` loads it: a DualEncoder folder (dual_encoder.json,
    question_encoder/ with the tokenizer, passage_encoder/ when not shared, head.safetensors
    when projected) or a plain encoder folder (or hub name) to start one from.

    Raises:
        ModelFolderError: a missing folder or file, or files that do not fit together.
    """
    folder = Path(name_or_path).expanduser()
    if not folder.is_dir():
        _check_hub_name(str(name_or_path), "retriever")
        return
    spec_file = folder / CONFIG_FILE
    if not spec_file.is_file():
        check_model_folder(folder, what="retriever encoder", encoder_only=True)
        return
    spec = _read_json(spec_file, "the dual encoder's spec", transformers_reads=False)
    known = {field.name for field in dataclasses.fields(DualEncoderSpec)}
    if not isinstance(spec, dict) or not spec.keys() <= known:
        found = f"keys {sorted(spec)}" if isinstance(spec, dict) else f"a {type(spec).__name__}"
        raise ModelFolderError(
            f"{spec_file}: expected an object with keys among {sorted(known)}, found {found}"
        )
    check_model_folder(
        folder / "question_encoder", what="retriever's question encoder", encoder_only=True
    )
    if spec.get("shared", True) is False:
        check_model_folder(
            folder / "passage_encoder",
            what="retriever's passage encoder",
            tokenizer=False,
            encoder_only=True,
        )
    if spec.get("projection_dim") is not None:
        if not (folder / HEAD_FILE).is_file():
            raise ModelFolderError(
                f"{folder}: no {HEAD_FILE}, but {CONFIG_FILE} says projection_dim "
                f"{spec['projection_dim']}"
            )
        _safetensors_shapes(folder / HEAD_FILE)


def check_tokenizer_source(name_or_path: str) -> None:
    """Checks a tokenizer name or folder (`fid convert-checkpoint --tokenizer`).

    Raises:
        ModelFolderError: a folder without tokenizer files, or a name transformers cannot find.
    """
    folder = Path(name_or_path).expanduser()
    if not folder.is_dir():
        _check_hub_name(name_or_path, "tokenizer")
    elif not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ModelFolderError(
            f"{folder}: no tokenizer files: expected one of {', '.join(TOKENIZER_FILES)}"
        )
