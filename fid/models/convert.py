"""Import of the reader and retriever checkpoints released with facebookresearch/FiD.

Retrievers: `config.json` is the original's `RetrieverConfig` (a BertConfig plus
`indexing_dimension`, `projection`, `extract_cls`, the masks and the maximum lengths) and the
state dict holds `model.<BertModel keys>` (its pooler unused), `proj.*` and `norm.*`. The result
is a DualEncoder folder that records the original's input format (`question: Q`,
`title: T context: C`), its lengths and its per-token projection (fid.models.retriever).

Readers: their state dicts were saved from a FiD model on transformers 3.0.2, whose encoder wrapped each
T5 block twice: keys read `encoder.encoder.block.{i}.module.layer...` where a modern
T5ForConditionalGeneration expects `encoder.block.{i}.layer...`; decoder, `shared` and `lm_head`
keys are already plain. They also hold
`decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight`: transformers 3 gave the
first decoder block's cross-attention a relative position bias, which modern T5 does not have.
By default it is dropped. With unidirectional buckets, every encoder token at or after the
decoder position falls in bucket 0, so at the first decoding step the bias added one constant
per head to all logits: it changed no attention probability there and shifts the original's
passage scores by one model-wide constant (its mean over heads); at step t it touched only
keys 0..t-1, the first tokens of passage 0, so later logits move a little (up to 0.05 on the
golden fixtures, tests/golden), greedy answers there not at all. `keep_cross_attention_bias`
keeps it instead (fid.models.cross_attention_bias.add_cross_attention_bias): the original's
logits and scores to 1e-5, with the encoder tokens at the original's positions (no packing).
"""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import torch
from transformers import AutoTokenizer, BertConfig, BertModel, T5Config, T5ForConditionalGeneration

from fid.errors import CheckpointError, InputError
from fid.models.cross_attention_bias import CROSS_ATTENTION_BIAS, add_cross_attention_bias
from fid.models.folder_checks import (
    ModelFolderError,
    check_model_folder,
    check_tokenizer_source,
)
from fid.models.retriever import DualEncoder, DualEncoderSpec, load_released_retriever
from fid.models.settings import ReaderSettings
from fid.runtime.fileio import atomic_directory
from fid.text_files import read_json

logger = logging.getLogger(__name__)

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
    checkpoint: str | Path,
    output: str | Path,
    tokenizer: str | None = None,
    keep_cross_attention_bias: bool = False,
) -> None:
    """Writes a released FiD reader as a Hugging Face T5 folder (safetensors).

    Args:
        checkpoint: the released folder (config.json + pytorch_model.bin) or the .bin file,
            with config.json beside it.
        output: the model folder to write.
        tokenizer: a tokenizer name or folder to save beside it (the released readers use
            t5-base's or t5-large's); without one, give `fid` a model folder that has it.
        keep_cross_attention_bias: keep the first decoder block's cross-attention bias (see the
            module docstring): the model then gives the original's logits exactly, at the cost
            of the packed decoder layout (fid.models.fused_encoding).

    Raises:
        CheckpointError: for an unreadable file, or keys that are missing or left over after
            the mapping.
    """
    weights, config_file = _checkpoint_files(Path(checkpoint), "reader")
    state_dict = _load_state_dict(weights)
    converted, dropped = convert_reader_state_dict(state_dict)
    bias = state_dict.get(CROSS_ATTENTION_BIAS) if keep_cross_attention_bias else None
    if keep_cross_attention_bias and bias is None:
        raise CheckpointError(f"{weights}: no {CROSS_ATTENTION_BIAS} to keep")
    if bias is not None:
        dropped.remove(CROSS_ATTENTION_BIAS)
    config = T5Config.from_dict(_read_config(config_file))
    model = T5ForConditionalGeneration(config)
    missing, unexpected = model.load_state_dict(converted, strict=False)
    missing = sorted(set(missing) - TIED_KEYS)
    if missing or unexpected:
        raise CheckpointError(
            f"{weights}: after mapping, missing keys {missing[:5]} and unexpected keys "
            f"{sorted(unexpected)[:5]} (of {len(missing)} and {len(unexpected)})"
        )
    if bias is not None:
        add_cross_attention_bias(model, bias)
    with atomic_directory(output) as tmp:
        model.save_pretrained(tmp)
        # the original's input format; its length is the recipe's (250), not in the checkpoint
        ReaderSettings(cross_attention_bias=bias is not None).save(tmp)
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
        logger.info(
            "dropped %s (fid/models/convert.py says why this is safe; "
            "--keep-cross-attention-bias keeps it)", ", ".join(dropped),
        )  # fmt: skip
    if tokenizer is None:
        logger.warning("no --tokenizer given: %s holds the model only", output)
    logger.info("converted %d tensors from %s into %s", len(converted), weights, output)


# RetrieverConfig's own keys (src/model.py); the rest of its config.json is a BertConfig.
_RETRIEVER_KEYS = (
    "indexing_dimension", "apply_question_mask", "apply_passage_mask", "extract_cls",
    "passage_maxlength", "question_maxlength", "projection",
)  # fmt: skip


def _read_config(config_file: Path) -> dict:
    """A released checkpoint's config.json (a CheckpointError when it is not a JSON object)."""
    config = read_json(config_file, "a JSON model config", kind=CheckpointError)
    if not isinstance(config, dict):
        raise CheckpointError(f"{config_file}: expected a JSON object (a model config)")
    return config


def _checkpoint_files(checkpoint: Path, what: str) -> tuple[Path, Path]:
    weights = checkpoint / "pytorch_model.bin" if checkpoint.is_dir() else checkpoint
    config_file = weights.parent / "config.json"
    for path in (weights, config_file):
        if not path.is_file():
            raise FileNotFoundError(f"{path}: not found (a released {what} folder holds both)")
    return weights, config_file


def released_retriever_spec(config: dict, source: str) -> DualEncoderSpec:
    """The DualEncoderSpec of a released retriever's RetrieverConfig.

    Raises:
        CheckpointError: a config without the retriever's keys, or one whose unmasked BERT
            inputs fid does not reproduce.
    """
    if "indexing_dimension" not in config:
        raise CheckpointError(
            f"{source}: no indexing_dimension: expected a facebookresearch/FiD RetrieverConfig"
        )
    if not (config.get("apply_question_mask", True) and config.get("apply_passage_mask", True)):
        raise CheckpointError(
            f"{source}: a retriever trained without attention masks is not supported"
        )
    return DualEncoderSpec(
        pooling="cls" if config.get("extract_cls") else "mean",
        projection_dim=config["indexing_dimension"] if config.get("projection", True) else None,
        shared=True,
        base_model=source,
        input_format="fid",
        question_max_tokens=config.get("question_maxlength"),
        passage_max_tokens=config.get("passage_maxlength"),
        project_tokens=True,
    )


def released_retriever(state_dict: dict[str, torch.Tensor], config: dict, source: str):
    """A DualEncoder holding a released retriever's weights (the original's key layout)."""
    spec = released_retriever_spec(config, source)
    bert = {k: v for k, v in config.items() if k not in _RETRIEVER_KEYS}
    encoder = BertModel(BertConfig.from_dict(bert), add_pooling_layer=False)
    model = DualEncoder(encoder, None, spec)
    try:
        load_released_retriever(state_dict, model)
    except (InputError, RuntimeError) as error:  # RuntimeError: a tensor of another shape
        raise CheckpointError(f"{source}: {str(error).splitlines()[0]}") from None
    return model


def convert_retriever_checkpoint(
    checkpoint: str | Path, output: str | Path, tokenizer: str | None = None
) -> None:
    """Writes a released FiD retriever as a DualEncoder folder (the BERT tokenizer beside it:
    the released retrievers use bert-base-uncased's)."""
    weights, config_file = _checkpoint_files(Path(checkpoint), "retriever")
    config = _read_config(config_file)
    model = released_retriever(_load_state_dict(weights), config, str(checkpoint))
    loaded = AutoTokenizer.from_pretrained(tokenizer) if tokenizer is not None else None
    with atomic_directory(output) as tmp:
        model.save_pretrained(tmp, tokenizer=loaded)
    if tokenizer is None:
        logger.warning("no --tokenizer given: %s holds the model only", output)
    logger.info("converted the retriever %s (%s) into %s", weights, model.spec, output)


def convert_checkpoint(
    checkpoint: Path,
    output: Path,
    tokenizer: str | None = None,
    kind: str = "reader",
    keep_cross_attention_bias: bool = False,
) -> None:
    """`fid convert-checkpoint`: a released facebookresearch/FiD reader or retriever as a model
    folder; the tokenizer source, when given, is checked before anything is read or written."""
    if tokenizer is not None:
        check_tokenizer_source(tokenizer)
    if kind == "retriever":
        convert_retriever_checkpoint(checkpoint, output, tokenizer=tokenizer)
    else:
        convert_reader_checkpoint(checkpoint, output, tokenizer, keep_cross_attention_bias)
