"""Downloads that survive interruptions, the record that pins what was downloaded, and
extraction of one file from an archive.

`download` fetches a URL into `OUTPUT.part` beside the output (fid/data/fetch.py: resumed
when it is the same resource, retried while the transfer progresses, refused at once when the
host cannot be reached or a page comes instead of the file), verifies the whole file (its size
against the published one, an expected md5 or sha256) and only then renames it to OUTPUT, with
a record of its size and digests beside it. A file that fails a check is deleted (resuming it
could never succeed) and the error names both values.

`check_existing_download` compares a finished download's record with the config (rules/
common.smk calls it when the DAG is built), so that pinning a checksum after the first download
verifies the file without running anything again.

`extract` writes one member of a tar / tar.gz archive, or the content of a .gz file, to a
path atomically (DPR's passages come as psgs_w100.tsv.gz; FiD's split indexes and TriviaQA
as tar.gz archives).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import tarfile
import zlib
from pathlib import Path

from fid.config import ConfigError, DownloadConfig
from fid.data.fetch import DownloadError, discard, fetch, looks_like_html, sidecar
from fid.errors import DataError
from fid.runtime.fileio import atomic_path, atomic_paths, atomic_write_json
from fid.runtime.progress import progress

__all__ = ["DownloadError", "check_existing_download", "download", "extract", "parse_checksum"]

logger = logging.getLogger(__name__)

ALGORITHMS = ("md5", "sha256")
_HASH_CHUNK = 1 << 20


def parse_checksum(checksum: str | None) -> tuple[str, str] | None:
    """`"sha256:<hex>"` or `"md5:<hex>"` as (algorithm, lowercase hex); None stays None.

    Raises:
        ConfigError: an unknown algorithm or a digest of the wrong length.
    """
    if checksum is None or checksum == "":
        return None
    algorithm, _, digest = checksum.partition(":")
    algorithm, digest = algorithm.strip().lower(), digest.strip().lower()
    if algorithm not in ALGORITHMS:
        raise ConfigError(
            f"checksum {checksum!r}: expected 'sha256:<64 hex digits>' or 'md5:<32 hex digits>'"
        )
    length = hashlib.new(algorithm).digest_size * 2
    if len(digest) != length or any(c not in "0123456789abcdef" for c in digest):
        raise ConfigError(f"checksum {checksum!r}: a {algorithm} digest is {length} hex digits")
    return algorithm, digest


def file_digests(path: str | Path) -> dict[str, str]:
    """The md5 and sha256 hex digests of a file, read once (progress logged: ~1 min for
    psgs_w100's 13 GB)."""
    hashes = {name: hashlib.new(name) for name in ALGORITHMS}
    size = Path(path).stat().st_size
    with open(path, "rb") as handle, progress(
        desc=f"checksum {Path(path).name}", unit="B", total=size, log=logger
    ) as bar:  # fmt: skip
        while chunk := handle.read(_HASH_CHUNK):
            for h in hashes.values():
                h.update(chunk)
            bar.update(len(chunk))
    return {name: h.hexdigest() for name, h in hashes.items()}


def download(
    url: str,
    output: str | Path,
    checksum: str | None,
    cfg: DownloadConfig | None = None,
    record_path: str | Path | None = None,
    size: int | None = None,
) -> dict[str, str | int]:
    """Downloads `url` to `output` (resumable, verified, atomic).

    Args:
        url: an http(s) or file URL.
        output: the final path; `output.part` holds the bytes received so far.
        checksum: `"sha256:<hex>"`, `"md5:<hex>"` or None (then the digests are not checked,
            and the returned ones are the record to pin).
        cfg: retry and timeout knobs.
        record_path: a json file to write with the returned record and the expected checksum;
            it appears together with `output` or not at all.
        size: the published size in bytes, or None: a resource of another size is refused
            before it is downloaded (when the server says its size) and after.

    Returns:
        {"url", "bytes", "md5", "sha256"} of the downloaded file.

    Raises:
        DownloadError: an unreachable host, an HTTP error, a connection that keeps failing,
            an HTML page or a file of another size, or a checksum mismatch (the partial file
            is then deleted).
    """
    cfg = cfg or DownloadConfig()
    expected = parse_checksum(checksum)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    part = output.with_name(output.name + ".part")
    fetch(url, part, cfg, size)
    with open(part, "rb") as handle:
        head = handle.read(512)
    if looks_like_html(url, "", head):
        discard(part)
        raise DownloadError(
            f"{url}: an HTML page came instead of the file (it starts {head[:60]!r}); it was "
            "deleted. Hint: open the URL in a browser from this machine (a proxy's page?)"
        )
    received = part.stat().st_size
    if size is not None and received != size:
        discard(part)
        raise DownloadError(
            f"{url}: received {received} bytes, but the file expected is {size} bytes (data."
            "downloads bytes); it was deleted. Hint: check the URL and the published size"
        )
    digests = file_digests(part)
    if expected is not None and digests[expected[0]] != expected[1]:
        discard(part)
        raise DownloadError(
            f"{url}: checksum mismatch: expected {expected[0]} {expected[1]}, got "
            f"{digests[expected[0]]} ({received} bytes). The file was deleted. Hint: the server's "
            "file changed or the transfer was corrupted; run again, or check the checksum."
        )
    record = {"url": url, "bytes": received, **digests}
    outputs = [output] if record_path is None else [output, Path(record_path)]
    with atomic_paths(*outputs) as tmps:
        if record_path is not None:
            atomic_write_json(tmps[1], {**record, "expected": checksum})
        part.replace(tmps[0])  # last: a failure before it keeps the bytes in `part`
    sidecar(part).unlink(missing_ok=True)
    verdict = f"verified {expected[0]}" if expected else "NOT verified (no checksum given)"
    logger.info("downloaded %s (%d bytes, sha256 %s, %s) to %s",
                url, received, digests["sha256"], verdict, output)  # fmt: skip
    return record


def check_existing_download(
    path: str | Path, record_path: str | Path, url: str, checksum: str | None, size: int | None
) -> None:
    """Checks a finished download against the config without reading it again.

    The record holds the size and digests computed from the file's bytes when it was
    written (together with the file); the file must still have that size, and the record
    must agree with the pinned checksum and published size. Nothing to check when the file or
    its record is missing, or the record is of another URL: the download runs again then.

    Raises:
        DownloadError: naming the file, its record and both values that disagree.
    """
    path, record_path = Path(path), Path(record_path)
    if not path.is_file() or not record_path.is_file():
        return
    try:
        record = json.loads(record_path.read_text())
        recorded_url, recorded_size = record["url"], record["bytes"]
    except (ValueError, KeyError, TypeError):
        raise DownloadError(
            f"{record_path}: not the record of a download (json with url, bytes, md5, sha256). "
            f"Hint: delete it and {path} to download the file again"
        ) from None
    if recorded_url != url:
        return
    again = f"Hint: delete {path} to download it again"
    if path.stat().st_size != recorded_size:
        raise DownloadError(
            f"{path} is {path.stat().st_size} bytes, but {recorded_size} when it was downloaded "
            f"and hashed ({record_path}): it changed since. {again}"
        )
    if size is not None and recorded_size != size:
        raise DownloadError(
            f"{path} is {recorded_size} bytes ({record_path}), but the file expected is {size} "
            f"bytes (data.downloads bytes). {again}, or correct the size"
        )
    expected = parse_checksum(checksum)
    if expected is not None and record.get(expected[0]) != expected[1]:
        raise DownloadError(
            f"{path}: the pinned checksum is {expected[0]} {expected[1]}, but the file has "
            f"{expected[0]} {record.get(expected[0])} ({record_path}, computed when it was "
            f"downloaded). {again}, or pin the digest of its record if that is the file meant"
        )


def _find_member(archive: tarfile.TarFile, member: str, path: Path) -> tarfile.TarInfo:
    """The member named exactly (a leading "./" ignored), else the one with that file name."""
    wanted = member.removeprefix("./")
    members = [m for m in archive.getmembers() if m.isfile()]
    exact = [m for m in members if m.name.removeprefix("./") == wanted]
    if exact:
        return exact[0]
    by_name = [m for m in members if Path(m.name).name == Path(wanted).name]
    if len(by_name) == 1:
        return by_name[0]
    names = ", ".join(m.name for m in members[:20])
    found = "several members of that name" if by_name else "no such member"
    raise DataError(f"{path}: {found} {member!r}; the archive holds: {names}")


_TRUNCATED_HINT = "Hint: download it again (with a checksum, so that the copy is verified)"


def _copy(source, out, total: int, archive: Path, position=None) -> None:
    """Copies `source` to `out` in chunks, its progress logged: bytes written, or `position()`
    (the archive's bytes read) against `total`."""
    with progress(desc=f"extract {archive.name}", unit="B", total=total, log=logger) as bar:
        while chunk := source.read(_HASH_CHUNK):
            out.write(chunk)
            bar.update((position() - bar.n) if position is not None else len(chunk))


def extract(archive: str | Path, output: str | Path, member: str | None = None) -> None:
    """Writes one member of a tar(.gz) archive, or the content of a .gz file, to `output`.

    Args:
        archive: a tar, tar.gz or gzip file.
        output: the file to write (atomically).
        member: the member's path in a tar archive (or its file name when unique); None for a
            plain .gz file.

    Raises:
        DataError: a missing archive or member, or an archive of the wrong kind.
    """
    archive = Path(archive)
    if not archive.is_file():
        raise DataError(f"{archive}: file not found")
    with atomic_path(output) as tmp:
        if member is None:
            if tarfile.is_tarfile(archive):
                raise DataError(f"{archive}: a tar archive: name the member to extract")
            try:
                with open(archive, "rb") as raw, gzip.open(raw, "rb") as source, open(
                    tmp, "wb"
                ) as out:  # fmt: skip
                    # progress in the archive's bytes read (a .gz does not say its size)
                    _copy(source, out, archive.stat().st_size, archive, lambda: raw.tell())
            except gzip.BadGzipFile as error:
                raise DataError(f"{archive}: not a gzip file ({error})") from None
            except (EOFError, zlib.error) as error:
                raise DataError(
                    f"{archive}: the archive ends early or is corrupted ({error}). {_TRUNCATED_HINT}"
                ) from None
        else:
            if not tarfile.is_tarfile(archive):
                raise DataError(f"{archive}: not a tar archive, so it has no member {member!r}")
            try:
                with tarfile.open(archive) as tar:
                    info = _find_member(tar, member, archive)
                    with tar.extractfile(info) as source, open(tmp, "wb") as out:
                        _copy(source, out, info.size, archive)
            except (tarfile.TarError, EOFError, zlib.error) as error:
                raise DataError(
                    f"{archive}: the archive ends early or is corrupted ({error}). {_TRUNCATED_HINT}"
                ) from None
    logger.info("extracted %s%s to %s", archive, f" [{member}]" if member else "", output)
