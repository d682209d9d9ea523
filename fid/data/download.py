"""Downloads that survive interruptions, and extraction of one file from an archive.

`download` fetches a URL into `OUTPUT.part` beside the output, resuming an existing
`.part` with an HTTP range request (after a dropped connection within the same call, or when
a killed job is run again), verifies the whole file against an expected md5 or sha256, and
only then renames it to OUTPUT. A file that fails its checksum is deleted (resuming it could
never succeed) and the error names both digests. A server that ignores range requests (200
instead of 206) makes the download start again from the first byte.

`extract` writes one member of a tar / tar.gz archive, or the content of a .gz file, to a
path atomically (DPR's passages come as psgs_w100.tsv.gz; FiD's split indexes and TriviaQA
as tar.gz archives).
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import logging
import shutil
import tarfile
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path

from fid.config import ConfigError, DownloadConfig
from fid.errors import DataError
from fid.runtime.fileio import atomic_path, atomic_paths, atomic_write_json

logger = logging.getLogger(__name__)

ALGORITHMS = ("md5", "sha256")
_HASH_CHUNK = 1 << 20


class DownloadError(RuntimeError):
    """A download failed for good (HTTP error, retries exhausted, checksum mismatch)."""


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
    """The md5 and sha256 hex digests of a file, read once."""
    hashes = {name: hashlib.new(name) for name in ALGORITHMS}
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            for h in hashes.values():
                h.update(chunk)
    return {name: h.hexdigest() for name, h in hashes.items()}


def _fetch(url: str, part: Path, cfg: DownloadConfig) -> None:
    """One attempt: appends to `part` from its current size to the end of the resource."""
    offset = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"User-Agent": "fid-download"})
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    try:
        response = urllib.request.urlopen(request, timeout=cfg.timeout_s)
    except urllib.error.HTTPError as error:
        if error.code == 416 and offset:
            # Range not satisfiable: the part already holds the whole resource.
            logger.info("%s: the partial file is already complete (%d bytes)", url, offset)
            return
        raise
    with response:
        if offset and response.status != 206:
            logger.warning("%s: the server ignored the range request; starting again", url)
            offset = 0
        length = response.headers.get("Content-Length")
        expected_end = offset + int(length) if length is not None else None
        written, next_log = offset, offset + cfg.log_every_bytes
        with open(part, "ab" if offset else "wb") as out:
            while chunk := response.read(cfg.chunk_bytes):
                out.write(chunk)
                written += len(chunk)
                if written >= next_log:
                    logger.info("%s: %.2f GB", url, written / 1e9)
                    next_log += cfg.log_every_bytes
    if expected_end is not None and written < expected_end:
        raise http.client.IncompleteRead(b"", expected_end - written)


def download(
    url: str,
    output: str | Path,
    checksum: str | None,
    cfg: DownloadConfig | None = None,
    record_path: str | Path | None = None,
) -> dict[str, str | int]:
    """Downloads `url` to `output` (resumable, verified, atomic).

    Args:
        url: an http(s) or file URL.
        output: the final path; `output.part` holds the bytes received so far.
        checksum: `"sha256:<hex>"`, `"md5:<hex>"` or None (then nothing is verified, and the
            returned digests are the record to pin).
        cfg: retry and timeout knobs.
        record_path: a json file to write with the returned record and the expected checksum;
            it appears together with `output` or not at all.

    Returns:
        {"url", "bytes", "md5", "sha256"} of the downloaded file.

    Raises:
        DownloadError: an HTTP error, a connection that keeps failing, or a checksum mismatch
            (the partial file is then deleted).
    """
    cfg = cfg or DownloadConfig()
    expected = parse_checksum(checksum)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    part = output.with_name(output.name + ".part")
    if part.exists():
        logger.info("resuming %s from byte %d", url, part.stat().st_size)
    wait = cfg.retry_wait_s
    for attempt in range(cfg.retries + 1):
        try:
            _fetch(url, part, cfg)
            break
        except urllib.error.HTTPError as error:
            if error.code < 500 and error.code != 429:
                raise DownloadError(f"{url}: HTTP {error.code} {error.reason}") from None
            problem = f"HTTP {error.code}"
        except (urllib.error.URLError, http.client.HTTPException, OSError) as error:
            problem = f"{type(error).__name__}: {error}"
        if attempt == cfg.retries:
            raise DownloadError(
                f"{url}: gave up after {cfg.retries + 1} attempts ({problem}); the "
                f"{part.stat().st_size if part.exists() else 0} bytes received so far are kept "
                f"in {part}. Hint: run the same command again to resume."
            )
        logger.warning("%s: %s; retrying in %.0f s (attempt %d of %d)",
                       url, problem, wait, attempt + 2, cfg.retries + 1)  # fmt: skip
        time.sleep(wait)
        wait *= 2
    digests = file_digests(part)
    if expected is not None and digests[expected[0]] != expected[1]:
        size = part.stat().st_size
        part.unlink()
        raise DownloadError(
            f"{url}: checksum mismatch: expected {expected[0]} {expected[1]}, got "
            f"{digests[expected[0]]} ({size} bytes). The file was deleted. Hint: the server's "
            "file changed or the transfer was corrupted; run again, or check the checksum."
        )
    size = part.stat().st_size
    record = {"url": url, "bytes": size, **digests}
    outputs = [output] if record_path is None else [output, Path(record_path)]
    with atomic_paths(*outputs) as tmps:
        if record_path is not None:
            atomic_write_json(tmps[1], {**record, "expected": checksum})
        part.replace(tmps[0])  # last: a failure before it keeps the bytes in `part`
    verdict = f"verified {expected[0]}" if expected else "NOT verified (no checksum given)"
    logger.info("downloaded %s (%d bytes, sha256 %s, %s) to %s",
                url, size, digests["sha256"], verdict, output)  # fmt: skip
    return record


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
                with gzip.open(archive, "rb") as source, open(tmp, "wb") as out:
                    shutil.copyfileobj(source, out, _HASH_CHUNK)
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
                        shutil.copyfileobj(source, out, _HASH_CHUNK)
            except (tarfile.TarError, EOFError, zlib.error) as error:
                raise DataError(
                    f"{archive}: the archive ends early or is corrupted ({error}). {_TRUNCATED_HINT}"
                ) from None
    logger.info("extracted %s%s to %s", archive, f" [{member}]" if member else "", output)
