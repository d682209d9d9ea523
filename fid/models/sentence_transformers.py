"""sentence-transformers model folders: how the model must be pooled, normalised and prompted.

A sentence-transformers folder (all-MiniLM-L6-v2, E5, BGE, ...) is a Hugging Face encoder plus
`modules.json`, which lists the modules its embeddings pass through: the Transformer, a Pooling
module (`1_Pooling/config.json`: mean or CLS), often a Normalize module (unit vectors: the model
is meant for cosine similarity), and `config_sentence_transformers.json`, which may name the
query/passage prompts (E5's "query: "/"passage: "). Used as a plain BERT, such a model is
pooled and scored wrongly: all-MiniLM-L6-v2 searched by raw inner product lets very short
passages with large norms become hubs (one 1-word passage was the top-1 of 186 of 1,585
questions of a real open-domain SQuAD set). `sentence_transformers_spec` reads what the folder
says, so that fid uses the model as it was trained; modules fid cannot reproduce are an error.

Reads the files only: the sentence-transformers package is not needed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fid.models.folder_checks import ModelFolderError
from fid.text_files import read_text

MODULES_FILE = "modules.json"
_TYPE_PREFIX = "sentence_transformers.models."


def _read(path: Path) -> Any:
    try:
        return json.loads(read_text(path, "a sentence-transformers file (json)", ModelFolderError))
    except (OSError, json.JSONDecodeError) as error:
        raise ModelFolderError(f"{path}: unreadable sentence-transformers file ({error})") from None


def _pooling(folder: Path, module: dict) -> str:
    config = _read(folder / module.get("path", "") / "config.json")
    modes = [
        k[len("pooling_mode_") :] for k, v in config.items() if k.startswith("pooling_mode_") and v
    ]
    if modes == ["mean_tokens"]:
        return "mean"
    if modes == ["cls_token"]:
        return "cls"
    raise ModelFolderError(
        f"{folder / module.get('path', '')}: pooling {modes} is not supported: fid pools by the "
        "masked mean or the CLS token"
    )


def sentence_transformers_spec(folder: str | Path) -> dict[str, Any] | None:
    """The DualEncoderSpec fields a sentence-transformers folder prescribes, or None when the
    folder is not one: {"pooling", "normalize", "input_format", "query_prefix",
    "passage_prefix"}.

    Raises:
        ModelFolderError: a module fid does not reproduce (a Dense layer, max pooling, ...).
    """
    folder = Path(folder)
    if not (folder / MODULES_FILE).is_file():
        return None
    modules = _read(folder / MODULES_FILE)
    if not isinstance(modules, list):
        raise ModelFolderError(f"{folder / MODULES_FILE}: expected a list of modules")
    spec: dict[str, Any] = {"pooling": "mean", "normalize": False, "input_format": "plain"}
    for module in modules:
        kind = str(module.get("type", "")).removeprefix(_TYPE_PREFIX)
        if kind == "Transformer":
            if module.get("path", "") not in ("", "."):
                raise ModelFolderError(
                    f"{folder / MODULES_FILE}: the Transformer lives in {module['path']!r}: "
                    "give fid that subfolder"
                )
        elif kind == "Pooling":
            spec["pooling"] = _pooling(folder, module)
        elif kind == "Normalize":
            spec["normalize"] = True
        else:
            raise ModelFolderError(
                f"{folder / MODULES_FILE}: module {module.get('type')!r} is not supported "
                "(fid reproduces Transformer, Pooling and Normalize)"
            )
    extra = folder / "config_sentence_transformers.json"
    prompts = (_read(extra).get("prompts") or {}) if extra.is_file() else {}
    spec["query_prefix"] = prompts.get("query", "")
    spec["passage_prefix"] = prompts.get("passage", prompts.get("document", ""))
    return spec
