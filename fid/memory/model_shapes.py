"""A model's shape (its config.json, never its weights) from a folder, the local hub cache, or
the table of well-known models below, so that a plan needs no network.

The table holds the fields of each model's published config.json that decide its memory (the
rest are transformers' defaults). Hub names are accepted with or without their organisation.
"""

from __future__ import annotations

from pathlib import Path

from transformers import AutoConfig, BertConfig, PretrainedConfig, T5Config

from fid.errors import ConfigError
from fid.text_files import read_json

_T5 = dict(vocab_size=32128, relative_attention_num_buckets=32, decoder_start_token_id=0,
           pad_token_id=0, eos_token_id=1)  # fmt: skip
_T5_V1 = dict(_T5, d_kv=64, feed_forward_proj="relu", tie_word_embeddings=True)
_FLAN = dict(_T5, d_kv=64, feed_forward_proj="gated-gelu", tie_word_embeddings=False)

# name -> (config class, fields): the shapes of the readers and retrievers FiD users start from
KNOWN_MODELS: dict[str, tuple[type[PretrainedConfig], dict]] = {
    "t5-small": (T5Config, dict(_T5_V1, d_model=512, d_ff=2048, num_heads=8, num_layers=6)),
    "t5-base": (T5Config, dict(_T5_V1, d_model=768, d_ff=3072, num_heads=12, num_layers=12)),
    "t5-large": (T5Config, dict(_T5_V1, d_model=1024, d_ff=4096, num_heads=16, num_layers=24)),
    "t5-3b": (T5Config, dict(_T5_V1, d_model=1024, d_ff=16384, d_kv=128, num_heads=32,
                             num_layers=24)),
    "flan-t5-small": (T5Config, dict(_FLAN, d_model=512, d_ff=1024, num_heads=6, num_layers=8)),
    "flan-t5-base": (T5Config, dict(_FLAN, d_model=768, d_ff=2048, num_heads=12, num_layers=12)),
    "flan-t5-large": (T5Config, dict(_FLAN, d_model=1024, d_ff=2816, num_heads=16,
                                     num_layers=24)),
    "flan-t5-xl": (T5Config, dict(_FLAN, d_model=2048, d_ff=5120, num_heads=32, num_layers=24)),
    "bert-base-uncased": (BertConfig, dict(vocab_size=30522, hidden_size=768,
                                           num_hidden_layers=12, num_attention_heads=12,
                                           intermediate_size=3072)),
}  # fmt: skip
_ORGANISATIONS = ("google-t5/", "google/", "google-bert/")


def build_t5(config: PretrainedConfig):
    """The T5 transformers builds for `config`, with the lm_head of its own that T5 v1.1 and
    flan-t5 have (config `tie_word_embeddings: false`). transformers 5 builds every T5 tied
    (the flag survives as `scale_decoder_outputs`) and unties it only when loading a checkpoint
    that holds an lm_head: a plan from the config alone must untie it itself."""
    from transformers import T5ForConditionalGeneration

    from fid.models.loading import untie_lm_head

    t5 = T5ForConditionalGeneration(config)
    if not getattr(config, "scale_decoder_outputs", True):
        untie_lm_head(t5)
    return t5


# The sizes a plan builds tensors from: each must be a positive integer where the config has it.
_SIZES = ("vocab_size", "d_model", "d_ff", "d_kv", "num_layers", "num_decoder_layers",
          "num_heads", "hidden_size", "num_hidden_layers", "num_attention_heads",
          "intermediate_size")  # fmt: skip


def model_config(name_or_path: str, kind: str | None = None) -> PretrainedConfig:
    """The config of a model folder (its config.json), of a hub model in the local cache, or
    of a model in KNOWN_MODELS.

    Args:
        name_or_path: the model.
        kind: "t5" (a reader), "encoder" (a retriever's encoder), or None (either).

    Raises:
        ConfigError: a folder without a readable config.json, sizes that are no positive
            integers, a model of the other kind, or a name that is none of these.
    """
    folder = Path(name_or_path)
    if folder.is_dir():
        config = _folder_config(folder)
        where = str(folder / "config.json")
    elif (known := _known(name_or_path)) is not None:
        config_class, fields = known
        config, where = config_class(**fields), repr(name_or_path)
    else:
        try:  # a hub model downloaded before: its cached config.json, without the network
            config = AutoConfig.from_pretrained(name_or_path, local_files_only=True)
        except (OSError, ValueError):
            raise ConfigError(
                f"{name_or_path!r} is neither a model folder, a model in the local hub cache "
                f"nor a known model: expected a folder with config.json or one of "
                f"{', '.join(KNOWN_MODELS)}"
            ) from None
        where = repr(name_or_path)
    for size in _SIZES:
        value = getattr(config, size, 1)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):  # fmt: skip
            raise ConfigError(f"{where}: {size} = {value!r}: expected a positive integer")
    is_t5 = config.model_type in ("t5", "mt5", "umt5")
    if kind == "t5" and not is_t5:
        raise ConfigError(f"{where}: a {config.model_type!r} model, but this plans a FiD "
                          "reader: expected a T5 (model_type t5)")  # fmt: skip
    if kind == "encoder" and (is_t5 or getattr(config, "is_encoder_decoder", False)):
        raise ConfigError(f"{where}: a {config.model_type!r} encoder-decoder, but this plans a "
                          "retriever: expected an encoder (BERT-like) or a retriever folder")  # fmt: skip
    return config


def _folder_config(folder: Path) -> PretrainedConfig:
    """A folder's config.json, checked before transformers reads it (its own errors name
    neither file nor problem)."""
    path = folder / "config.json"
    if not path.is_file():
        raise ConfigError(f"{folder}: no config.json: expected a model folder")
    fields = read_json(path, "a model config (json)", kind=ConfigError)
    if not isinstance(fields, dict) or not isinstance(fields.get("model_type"), str):
        found = type(fields).__name__ if not isinstance(fields, dict) else "no model_type"
        raise ConfigError(f"{path}: expected a JSON object with a model_type (a transformers "
                          f"config), found {found}")  # fmt: skip
    try:
        return AutoConfig.from_pretrained(folder)
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise ConfigError(f"{path}: transformers cannot read it: {error}") from None


def _known(name: str) -> tuple[type[PretrainedConfig], dict] | None:
    for organisation in _ORGANISATIONS:
        name = name.removeprefix(organisation)
    return KNOWN_MODELS.get(name)
