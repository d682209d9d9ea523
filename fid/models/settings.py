"""Self-describing model folders: how a model must be fed, recorded beside its weights.

A model is only as good as its inputs look like those it was trained on. Settings that must
agree between training and use (the input format, truncation lengths) are therefore recorded
in the model folder when it is saved, and read back by every command that uses it:

- a reader folder holds `fid_reader.json` (`ReaderSettings`): input format, passage length,
  and the variant it was fine-tuned as (FiD-Light, FiDO: fid.models.reader_variants);
- a retriever folder holds them in `dual_encoder.json` (`fid.models.retriever.DualEncoderSpec`):
  input format, prefixes, question and passage lengths, pooling, projection, normalisation.

A command's config may still name a setting: equal to the model's, it is accepted; different, it
is an error naming both values, unless the config sets `override_model_settings: true` (then
the config's value is used, with a warning). A folder that records nothing (a pretrained model
from the hub, a folder of an older fid) uses the config's value, else the default.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal, TypeVar

from fid.errors import InputError
from fid.text_files import read_json

logger = logging.getLogger(__name__)

READER_SETTINGS_FILE = "fid_reader.json"
# The passage length of a reader whose folder records none (t5-base, a converted release):
# the original's text_maxlength. (Here, not in fid.inference: the memory plan reads it too.)
READER_PASSAGE_MAX_TOKENS = 250
# ReaderSettings keys of the fine-tuned variants, with the value of a plain reader.
VARIANT_DEFAULTS = {"light_tokens": None, "cross_attention_every": 1}
T = TypeVar("T")


class ModelSettingsError(InputError):
    """A command's config disagrees with what its model was trained with."""


@dataclass(frozen=True)
class ReaderSettings:
    """How a reader reads (recorded by `fid train-reader`).

    Attributes:
        input_format: "fid": each passage is `question: Q title: T context: P`, tokenized
            without EOS (facebookresearch/FiD's format).
        passage_max_tokens: tokens kept of each passage input.
        n_passages: passages per question it was trained on (a record; eval may read more).
        target_max_tokens: its training targets' fixed length, if any (a record).
        cross_attention_bias: the first decoder block's cross-attention keeps the position
            bias of a released FiD checkpoint (its weight is in model.safetensors).
        light_tokens: FiD-Light: the decoder reads the first this-many encoder vectors of each
            passage (None: all). A use of the model applies it; a config that names another
            value is refused unless it overrides (`resolve_setting`).
        cross_attention_every: FiDO: cross-attention in every K-th decoder layer only; the
            others' weights are not in model.safetensors, and loading removes those layers
            again (fid.models.loading). Structure, not a choice: never overridden.
    """

    input_format: Literal["fid"] = "fid"
    passage_max_tokens: int | None = None
    n_passages: int | None = None
    target_max_tokens: int | None = None
    cross_attention_bias: bool = False
    light_tokens: int | None = None
    cross_attention_every: int = 1

    def save(self, folder: str | Path) -> None:
        """Writes the settings into a model folder (beside config.json)."""
        data = asdict(self)
        # The variant keys only when set: a plain reader's file stays what older fids read,
        # and an older fid refuses a variant's (an unknown key) instead of misreading it.
        for name, plain in VARIANT_DEFAULTS.items():
            if data[name] == plain:
                del data[name]
        text = json.dumps({"format": 1, **data}, indent=2) + "\n"
        (Path(folder) / READER_SETTINGS_FILE).write_text(text)

    @classmethod
    def load(cls, folder: str | Path) -> ReaderSettings:
        """The settings a folder records; all None (unknown) when it records none."""
        path = Path(folder) / READER_SETTINGS_FILE
        if not path.is_file():
            return cls(input_format="fid")
        return settings_from_json(cls, path)


def settings_from_json(cls: type[T], path: Path, ignore: tuple[str, ...] = ("format",)) -> T:
    """A settings dataclass from a model folder's json file (unknown keys are an error)."""
    data = read_json(path, "a model folder's settings (json)", kind=ModelSettingsError)
    known = {f.name for f in fields(cls)}
    if not isinstance(data, dict) or not (data.keys() - set(ignore)) <= known:
        found = f"keys {sorted(data)}" if isinstance(data, dict) else f"a {type(data).__name__}"
        raise ModelSettingsError(
            f"{path}: expected an object with keys among {sorted(known)}, found {found}"
        )
    try:
        return cls(**{k: v for k, v in data.items() if k in known})
    except (TypeError, ValueError) as error:
        raise ModelSettingsError(f"{path}: {error}") from None


def resolve_setting(
    name: str,
    recorded: Any,
    configured: Any,
    *,
    model: str | Path,
    override: bool,
    default: Any = None,
) -> Any:
    """The value a command uses for one model setting.

    Args:
        name: the setting (and config key).
        recorded: what the model folder records (None: nothing).
        configured: what the command's config says (None: not set).
        model: the model folder, for messages.
        override: the config's `override_model_settings`.
        default: the value when neither says anything.

    Raises:
        ModelSettingsError: the config disagrees with the model and does not override it.
    """
    if recorded is None:
        return default if configured is None else configured
    if configured is None or configured == recorded:
        return recorded
    if override:
        logger.warning(
            "%s = %r overrides the model's %r (%s): its inputs differ from its training's",
            name, configured, recorded, model,
        )  # fmt: skip
        return configured
    raise ModelSettingsError(
        f"{name} = {configured!r} in the config, but the model {model} was trained with "
        f"{name} = {recorded!r}. Hint: drop {name} from the config (the model's own value is "
        "used), or set override_model_settings: true to feed the model differently"
    )
