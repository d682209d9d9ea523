"""The files of a residual refinement (fid.retrieval.residual_codes) in an index folder:
written with the index (`save_refinement`) and read back whole into RAM (`load_refinement`),
each checked against the index it belongs to.

An index built with `refine_residual` holds, beside `index.faiss`: `refine_codes.npy` (every
passage's codes, (N, code_size) uint8), `refine_layout.json` (the stages' dimensions and rates,
whether the codes are rotated, weighted and scaled), one `refine_pq<i>.faiss` per stage (its
trained product quantizer) and, for a byte budget, `refine_rotation.npy` (the passage map T)
and `refine_query_map.npy` (the query map T^-T). An index built before the weighting and scale
has a rotation alone, which is then its own query map.
"""

from __future__ import annotations

import json
from pathlib import Path

import faiss
import numpy as np

from fid.errors import DataError
from fid.retrieval.residual_codes import ResidualRefinement
from fid.retrieval.residual_layout import SCALE_BYTES
from fid.text_files import read_json

CODES_FILE = "refine_codes.npy"
QUANTIZER_FILE = "refine_pq{stage}.faiss"
LAYOUT_FILE = "refine_layout.json"
ROTATION_FILE = "refine_rotation.npy"  # a budget's passage map T
QUERY_MAP_FILE = "refine_query_map.npy"  # its query map T^-T


def save_refinement(refinement: ResidualRefinement, folder: Path) -> None:
    """Writes `refine_codes.npy`, `refine_layout.json`, one `refine_pq<i>.faiss` per stage
    and, for a budget, `refine_rotation.npy` and `refine_query_map.npy` into `folder`."""
    with open(folder / CODES_FILE, "wb") as handle:
        np.save(handle, refinement.codes, allow_pickle=False)
    for stage, quantizer in enumerate(refinement.quantizers):
        faiss.write_ProductQuantizer(quantizer, str(folder / QUANTIZER_FILE.format(stage=stage)))
    if refinement.rotation is not None:
        for name, array in (
            (ROTATION_FILE, refinement.rotation),
            (QUERY_MAP_FILE, refinement.query_map),
        ):
            with open(folder / name, "wb") as handle:
                np.save(handle, array, allow_pickle=False)
    layout = {
        "rotation": refinement.rotation is not None,
        "weighted": refinement.rotation is not None,
        "scaled": refinement.scaled,
        "stages": refinement.layout,
    }
    (folder / LAYOUT_FILE).write_text(json.dumps(layout) + "\n")


def load_refinement(folder: Path, spec: str | int, count: int, dim: int) -> ResidualRefinement:
    """Reads what `save_refinement` wrote, the codes into RAM (a search reads nothing from
    disk).

    Raises:
        DataError: for a missing or truncated file, or files that disagree with the index.
    """
    hint = "Hint: rebuild the index with `fid build-index`"

    def required(name: str) -> Path:
        path = folder / name
        if not path.is_file():
            raise DataError(f"{path}: missing; the index was built with refine_residual. {hint}")
        return path

    saved = read_json(required(LAYOUT_FILE), "a residual refinement's layout (json)")
    try:
        layout = [tuple(int(v) for v in stage) for stage in saved["stages"]]
        rotated = bool(saved["rotation"])
        # (an index built before the weighting and scale: an orthonormal rotation alone)
        weighted, scaled = bool(saved.get("weighted")), bool(saved.get("scaled"))
        assert all(len(stage) == 4 for stage in layout) and layout
    except (KeyError, TypeError, ValueError, AssertionError):
        raise DataError(
            f"{folder / LAYOUT_FILE}: expected {{'rotation': bool, 'stages': [[lo, hi, M, "
            f"bits], ...]}}. {hint}"
        ) from None
    quantizers = []
    for stage, (lo, hi, m, bits) in enumerate(layout):
        path = required(QUANTIZER_FILE.format(stage=stage))
        try:
            quantizer = faiss.read_ProductQuantizer(str(path))
        except RuntimeError as error:
            raise DataError(f"{path}: cannot read: {error}. {hint}") from None
        if (quantizer.d, quantizer.M, quantizer.nbits) != (hi - lo, m, bits) or hi > dim:
            raise DataError(
                f"{path}: a PQ{quantizer.M}x{quantizer.nbits} of d={quantizer.d}, but "
                f"{LAYOUT_FILE} says stage {stage} is PQ{m}x{bits} over dimensions {lo}-"
                f"{hi - 1} of d={dim}. {hint}"
            )
        quantizers.append(quantizer)
    rotation = query_map = None
    if rotated:
        rotation = _load_array(required(ROTATION_FILE), np.float32, (dim, dim), hint)
        query_map = rotation  # orthonormal: its own inverse transposed
    if weighted:
        query_map = _load_array(required(QUERY_MAP_FILE), np.float32, (dim, dim), hint)
    code_size = sum(quantizer.code_size for quantizer in quantizers) + SCALE_BYTES * scaled
    codes = _load_array(required(CODES_FILE), np.uint8, (count, code_size), hint)
    return ResidualRefinement(spec, rotation, query_map, layout, quantizers, scaled, codes)


def _load_array(path: Path, dtype, shape: tuple[int, int], hint: str) -> np.ndarray:
    """A whole .npy of this dtype and shape, in RAM."""
    try:
        array = np.load(path, allow_pickle=False)
    except ValueError as error:  # not a .npy, or shorter than its header says
        name = np.dtype(dtype).name
        raise DataError(f"{path}: not a complete {name} .npy array: {error}. {hint}") from None
    if array.dtype != dtype or array.shape != shape:
        raise DataError(
            f"{path}: holds {array.dtype} {array.shape}, but the index expects "
            f"{np.dtype(dtype).name} {shape}. {hint}"
        )
    return array


__all__ = ["CODES_FILE", "load_refinement", "save_refinement"]
