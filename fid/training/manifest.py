"""Checkpoint manifests: what a checkpoint folder holds, file by file, so that a damaged one is
found before it is resumed.

`manifest.json` is the last file written into a checkpoint folder: {"format", "checksum",
"files": {path: {"bytes", <checksum>: hex}}} for every other file. `verify_checkpoint` checks
the listing (names and sizes, reading nothing) and then every checksum.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fid.errors import CheckpointError
from fid.runtime import distributed
from fid.runtime.fileio import atomic_write_json
from fid.text_files import read_text

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
# Reading the files costs more than the checksum: a t5-base checkpoint with its AdamW state
# (2.7 GB) verified in 2.2 s from the page cache and 4.4 s cold with sha256 (OpenSSL, SHA-NI),
# 2.0 / 4.2 s with crc32, 6.4 / 9.2 s with blake2b, against 14 s to write it
# (benchmarks/memory/checkpoint_verify.py, 2 CPU cores). sha256 then, which no corruption slips past.
CHECKSUM = "sha256"


def _crc32(path: Path) -> str:
    value = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 24):
            value = zlib.crc32(chunk, value)
    return f"{value:08x}"


def _hashlib_digest(name: str) -> Callable[[Path], str]:
    def digest(path: Path) -> str:
        with open(path, "rb") as handle:
            return hashlib.file_digest(handle, name).hexdigest()

    return digest


# Manifests name their checksum: one written with another stays verifiable.
CHECKSUMS: dict[str, Callable[[Path], str]] = {
    "sha256": _hashlib_digest("sha256"),
    "blake2b": _hashlib_digest("blake2b"),
    "crc32": _crc32,
}


def checkpoint_files(folder: Path) -> list[str]:
    """Every file of a checkpoint folder but its manifest: relative POSIX paths, sorted."""
    files = (path for path in folder.rglob("*") if path.is_file())
    return sorted(
        name for path in files if (name := path.relative_to(folder).as_posix()) != MANIFEST
    )


def describe_files(folder: Path, names: list[str], checksum: str = CHECKSUM) -> dict[str, dict]:
    """The manifest records of some files of `folder`: {name: {"bytes", checksum}}."""
    digest = CHECKSUMS[checksum]
    return {
        name: {"bytes": (folder / name).stat().st_size, checksum: digest(folder / name)}
        for name in names
    }


def write_manifest(folder: Path, files: dict[str, dict], checksum: str = CHECKSUM) -> None:
    """Writes `manifest.json`: the last file of a checkpoint, once every other is complete."""
    manifest = {
        "format": MANIFEST_FORMAT,
        "checksum": checksum,
        "files": dict(sorted(files.items())),
    }
    atomic_write_json(folder / MANIFEST, manifest)


def seal_checkpoint(folder: Path) -> None:
    """Lists every file of a checkpoint folder, with its size and checksum, in its manifest."""
    write_manifest(folder, describe_files(folder, checkpoint_files(folder)))


def seal_shared_checkpoint(folder: Path) -> None:
    """`seal_checkpoint` for a folder that every rank wrote into (sharded checkpoints): each
    rank checksums its share of the files, rank 0 writes the manifest. Every rank calls it."""
    rank, world_size = distributed.world()
    # Rank 0's listing: every rank splits the same list.
    names = distributed.all_gather_objects(checkpoint_files(folder) if rank == 0 else None)[0]
    shares = distributed.all_gather_objects(describe_files(folder, names[rank::world_size]))
    if rank == 0:
        write_manifest(folder, {name: record for share in shares for name, record in share.items()})


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The manifest of a checkpoint folder, or None when it has none.

    Raises:
        CheckpointError: a manifest that does not parse or lacks what it must hold.
    """
    path = folder / MANIFEST
    try:
        manifest = json.loads(read_text(path, "a checkpoint manifest (json)", CheckpointError))
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path}: unreadable ({error})") from None
    checksum = manifest.get("checksum") if isinstance(manifest, dict) else None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if (
        checksum not in CHECKSUMS
        or not isinstance(files, dict)
        or not all(isinstance(r, dict) and {"bytes", checksum} <= r.keys() for r in files.values())
    ):
        raise CheckpointError(
            f"{path}: expected {{'format': {MANIFEST_FORMAT}, 'checksum': one of "
            f"{sorted(CHECKSUMS)}, 'files': {{path: {{'bytes': size, checksum: hex}}}}}}"
        )
    return manifest


def check_listing(folder: Path, manifest: dict[str, Any]) -> None:
    """Checks that `folder` holds exactly the manifest's files at their sizes (reads none).

    Raises:
        CheckpointError: a file missing, unlisted, or of another size.
    """
    files = manifest["files"]
    present = set(checkpoint_files(folder))
    missing, unlisted = sorted(files.keys() - present), sorted(present - files.keys())
    if missing:
        raise CheckpointError(f"{folder}: {', '.join(missing)} missing (listed in {MANIFEST})")
    if unlisted:
        raise CheckpointError(f"{folder}: {', '.join(unlisted)} not listed in {MANIFEST}")
    for name, record in files.items():
        size = (folder / name).stat().st_size
        if size != record["bytes"]:
            raise CheckpointError(
                f"{folder}: {name} has {size} bytes, {MANIFEST} says {record['bytes']} "
                "(truncated or overwritten)"
            )


def check_checksums(folder: Path, manifest: dict[str, Any], names: list[str]) -> None:
    """Checks the checksums of some of the manifest's files.

    Raises:
        CheckpointError: a file whose bytes changed after it was written.
    """
    checksum = manifest["checksum"]
    digest = CHECKSUMS[checksum]
    for name in names:
        if digest(folder / name) != manifest["files"][name][checksum]:
            raise CheckpointError(
                f"{folder}: {name} does not match its {checksum} checksum in {MANIFEST} "
                "(its bytes changed after it was written)"
            )


def verify_checkpoint(folder: str | Path) -> None:
    """Checks that a checkpoint folder holds exactly what its manifest lists, byte for byte.

    Raises:
        CheckpointError: no manifest, or a file missing, unlisted, resized or changed.
    """
    folder = Path(folder)
    manifest = read_manifest(folder)
    if manifest is None:
        raise CheckpointError(f"{folder}: no {MANIFEST}")
    check_listing(folder, manifest)
    check_checksums(folder, manifest, sorted(manifest["files"]))
