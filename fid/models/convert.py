"""Import of the reader checkpoints released with facebookresearch/FiD.

Their state dicts were saved from a FiD model on transformers 3.0.2, whose encoder wrapped each
T5 block twice: keys read `encoder.encoder.block.{i}.module.layer...` where a modern
T5ForConditionalGeneration expects `encoder.block.{i}.layer...`; decoder, `shared` and `lm_head`
keys are already plain. They also hold
`decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight`: transformers 3 gave the
first decoder block's cross-attention a relative position bias, which modern T5 does not have.
It is dropped. With unidirectional buckets, every encoder token at or after the decoder position
falls in bucket 0, so at the first decoding step the bias added one constant per head to all
logits: it changed no attention probability there and shifts the original's passage scores of a
question by the same constant; at later steps it touched only the first few encoder tokens.
"""

from __future__ import annotations

import json
import logging
import pickle
from pathlib import Path

import torch
from transformers import AutoTokenizer, T5Config, T5ForConditionalGeneration

from fid.errors import CheckpointError
from fid.models.folder_checks import (
    ModelFolderError,
    check_model_folder,
    check_tokenizer_source,
)
from fid.runtime.fileio import atomic_directory

logger = logging.getLogger(__name__)

CROSS_ATTENTION_BIAS = "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"
# Modern T5 ties these to `shared.weight`; a checkpoint need not hold them.
TIED_KEYS = {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"}


def convert_reader_state_dict(
    state_dict: dict[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Maps released FiD reader keys onto T5ForConditionalGeneration keys.

    Returns:
        The converted state dict and the keys that were dropped.
    """
    converted, dropped = {}, []
    for key, value in state_dict.items():
        if key == CROSS_ATTENTION_BIAS:
            dropped.append(key)
            continue
        new_key = key
        if key.startswith("encoder.encoder."):
            new_key = key[len("encoder.") :].replace(".module.", ".")
        elif key.startswith("encoder."):
            raise CheckpointError(
                f"unexpected key {key!r}: released FiD encoder keys start with 'encoder.encoder.'"
            )
        if new_key in converted:
            raise CheckpointError(f"two keys map onto {new_key!r}")
        converted[new_key] = value
    return converted, dropped


def _load_state_dict(weights: Path) -> dict[str, torch.Tensor]:
    """The released state dict (a plain dict of tensors, possibly under "model")."""
    try:
        # weights_only: a plain dict of tensors needs no pickle code execution.
        state_dict = torch.load(weights, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, EOFError, RuntimeError, ValueError) as error:
        # UnpicklingError: not a checkpoint, or one whose unpickling runs code; RuntimeError:
        # torch's zip reader on a truncated or corrupted file.
        detail = str(error).strip().split("\n")[0].split(". ")[0][:200]
        raise CheckpointError(
            f"{weights}: not a readable PyTorch checkpoint of tensors ({type(error).__name__}: "
            f"{detail}). Hint: download it again; it must be the state dict of a released FiD "
            "reader"
        ) from None
    if isinstance(state_dict, dict) and isinstance(state_dict.get("model"), dict):
        state_dict = state_dict["model"]
    if not isinstance(state_dict, dict) or not all(
        isinstance(key, str) and isinstance(value, torch.Tensor)
        for key, value in state_dict.items()
    ):
        raise CheckpointError(
            f"{weights}: expected a state dict (names to tensors), found a "
            f"{type(state_dict).__name__}"
        )
    return state_dict


def convert_reader_checkpoint(
    checkpoint: str | Path, output: str | Path, tokenizer: str | None = None
) -> None:
    """Writes a released FiD reader as a Hugging Face T5 folder (safetensors).

    Args:
        checkpoint: the released folder (config.json + pytorch_model.bin) or the .bin file,
            with config.json beside it.
        output: the model folder to write.
        tokenizer: a tokenizer name or folder to save beside it (the released readers use
            t5-base's or t5-large's); without one, give `fid` a model folder that has it.

    Raises:
        CheckpointError: for an unreadable file, or keys that are missing or left over after
            the mapping.
    """
    checkpoint = Path(checkpoint)
    weights = checkpoint / "pytorch_model.bin" if checkpoint.is_dir() else checkpoint
    config_file = weights.parent / "config.json"
    for path in (weights, config_file):
        if not path.is_file():
            raise FileNotFoundError(f"{path}: not found (a released reader folder holds both)")
    state_dict = _load_state_dict(weights)
    converted, dropped = convert_reader_state_dict(state_dict)
    try:
        config = T5Config.from_json_file(config_file)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{config_file}: not a JSON model config ({error})") from None
    model = T5ForConditionalGeneration(config)
    missing, unexpected = model.load_state_dict(converted, strict=False)
    missing = sorted(set(missing) - TIED_KEYS)
    if missing or unexpected:
        raise CheckpointError(
            f"{weights}: after mapping, missing keys {missing[:5]} and unexpected keys "
            f"{sorted(unexpected)[:5]} (of {len(missing)} and {len(unexpected)})"
        )
    with atomic_directory(output) as tmp:
        model.save_pretrained(tmp)
        if tokenizer is not None:
            AutoTokenizer.from_pretrained(tokenizer).save_pretrained(tmp)
            # The folder must load as a reader: e.g. no tokenizer larger than the vocabulary.
            try:
                check_model_folder(tmp, what="reader", needs_pad_and_eos=True)
            except ModelFolderError as error:
                raise CheckpointError(
                    f"--tokenizer {tokenizer} does not fit the checkpoint: "
                    + str(error).replace(str(tmp), str(output))
                ) from None
    if dropped:
        logger.info("dropped %s (see fid/convert.py for why this is safe)", ", ".join(dropped))
    if tokenizer is None:
        logger.warning("no --tokenizer given: %s holds the model only", output)
    logger.info("converted %d tensors from %s into %s", len(converted), weights, output)


def convert_checkpoint(checkpoint: Path, output: Path, tokenizer: str | None = None) -> None:
    """`fid convert-checkpoint`: a released facebookresearch/FiD reader as a model folder; the
    tokenizer source, when given, is checked before anything is read or written."""
    if tokenizer is not None:
        check_tokenizer_source(tokenizer)
    convert_reader_checkpoint(checkpoint, output, tokenizer=tokenizer)
