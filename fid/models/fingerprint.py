"""What identifies a model: the sha256 of its weight files, so that what was computed with one
model (an index of passage embeddings) is never used with another of the same shape.

A folder's fingerprint hashes every weight file below it (safetensors, PyTorch pickles), by
relative name and content: a DualEncoder folder's question and passage encoders and head, an
exported reader's weights. Paths do not enter it (a copied folder keeps its fingerprint); a
model given by hub name is identified by that name.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth")
_CHUNK = 1 << 24


def model_fingerprint(name_or_path: str | Path) -> dict:
    """{"weights_sha256", "weight_files", "bytes"} of a model folder; {"name"} of a hub name.

    Reads every weight file once (about a second per GB).
    """
    folder = Path(name_or_path)
    if not folder.is_dir():
        return {"name": str(name_or_path)}
    files = sorted({file for pattern in WEIGHT_PATTERNS for file in folder.rglob(pattern)
                    if file.is_file()})  # fmt: skip
    digest = hashlib.sha256()
    total = 0
    for file in files:
        digest.update(file.relative_to(folder).as_posix().encode() + b"\0")
        with open(file, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
                total += len(chunk)
        digest.update(b"\0")
    return {"weights_sha256": digest.hexdigest(), "weight_files": len(files), "bytes": total}
