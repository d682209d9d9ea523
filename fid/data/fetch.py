"""The bytes of one URL into a `.part` file: resumed when it is the same resource, retried
while the network lets it progress, refused at once when no retry can help.

A `.part` belongs to one resource: `NAME.part.json` beside it holds the URL, the resource's
full size and the server's ETag / Last-Modified. A resume asks for the rest only if the
resource is unchanged (a range request with `If-Range`, RFC 9110 13.1.5) and checks the size
and ETag the server answers with; a `.part` of another URL, size or version, or one without its
sidecar, is started again from the first byte, with a log line that says why.

Failures: a host this machine cannot reach (the name does not resolve, the connection is
refused, no route, TLS fails) and HTTP errors other than 429 and 5xx end the fetch at once;
timeouts, dropped connections, 429 and 5xx are retried after a pause that doubles up to
`max_retry_wait_s`, and an attempt that received bytes starts the count of failures afresh.
A response that is an HTML page, or a resource of another size than the published one, is
refused before its bytes are kept.
"""

from __future__ import annotations

import errno
import http.client
import json
import logging
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from fid.config import DownloadConfig
from fid.runtime.console import CONSOLE
from fid.runtime.fileio import atomic_write_json
from fid.runtime.progress import progress

logger = logging.getLogger(__name__)

# errnos of a connection that no retry will make: the network or host has no route from here
_NO_ROUTE = (errno.ENETUNREACH, errno.EHOSTUNREACH)
_SNIFF_BYTES = 512


class DownloadError(RuntimeError):
    """A download failed for good (unreachable host, HTTP error, retries exhausted, a page or
    a file of another size instead of the resource, checksum mismatch)."""


class _Changed(Exception):
    """The resource behind a `.part` changed: start again at once (no retry is used up)."""


@dataclass
class _Attempt:
    received: int = 0  # bytes this attempt wrote, counted even when it fails


def sidecar(part: Path) -> Path:
    """`NAME.part.json`: what the bytes of `NAME.part` belong to."""
    return part.with_name(part.name + ".json")


def discard(part: Path) -> None:
    """Deletes a `.part` and its sidecar."""
    part.unlink(missing_ok=True)
    sidecar(part).unlink(missing_ok=True)


def looks_like_html(url: str, content_type: str, head: bytes) -> bool:
    """A page (a proxy's, a login's, an error's) where a data file was expected."""
    if urllib.parse.urlsplit(url).path.lower().endswith((".html", ".htm")):
        return False
    start = head.lstrip()[:15].lower()
    return "text/html" in content_type.lower() or start.startswith((b"<!doctype html", b"<html"))


def _resumable(url: str, part: Path) -> dict | None:
    """The sidecar of a `.part` that may be resumed for `url`; any other `.part` is deleted."""
    if not part.exists():
        sidecar(part).unlink(missing_ok=True)
        return None
    try:
        resource = json.loads(sidecar(part).read_text())
    except (OSError, ValueError):
        resource = None
    if not isinstance(resource, dict) or resource.get("url") != url:
        whose = (
            f"was for {resource.get('url')}" if isinstance(resource, dict) else "of no known URL"
        )
        logger.warning("%s: %s %s; downloading from the first byte", url, part, whose)
        discard(part)
        return None
    return resource


def _open(url: str, part: Path, resource: dict | None, cfg: DownloadConfig):
    """(response, offset): the rest of a resumable `.part`, or the whole resource."""
    offset = part.stat().st_size if resource is not None else 0
    request = urllib.request.Request(url, headers={"User-Agent": "fid-download"})
    if offset:
        size = resource.get("size")
        done = f"{100 * offset / size:.0f}% of {size:,} bytes" if size else "size unknown"
        logger.info("resuming %s from byte %d (%s)", url, offset, done, extra=CONSOLE)
        request.add_header("Range", f"bytes={offset}-")
        validator = resource.get("etag") or resource.get("last_modified")
        if validator and not validator.startswith("W/"):  # If-Range takes strong ETags only
            request.add_header("If-Range", validator)
    return urllib.request.urlopen(request, timeout=cfg.timeout_s), offset


def _total_size(response) -> int | None:
    """The full size of the resource a response is (part of); None when the server hides it."""
    if response.status == 206:
        total = (response.headers.get("Content-Range") or "").rpartition("/")[2]
    else:
        total = response.headers.get("Content-Length") or ""
    return int(total) if total.isdigit() else None


def _start(url: str, part: Path, response, total: int | None, cfg: DownloadConfig) -> bytes:
    """A fresh `.part`: records what it belongs to; returns the response's first bytes.

    Raises:
        DownloadError: the response is an HTML page.
    """
    head = response.read(min(cfg.chunk_bytes, _SNIFF_BYTES))
    content_type = response.headers.get("Content-Type") or ""
    if looks_like_html(url, content_type, head):
        discard(part)
        raise DownloadError(
            f"{url}: the server sent an HTML page, not the file (Content-Type {content_type!r}, "
            f"starting {head[:60]!r}): a proxy's, login or error page. Hint: open the URL in a "
            "browser from this machine, and check any proxy settings (https_proxy)"
        )
    resource = {"url": url, "size": total, "etag": response.headers.get("ETag"),
                "last_modified": response.headers.get("Last-Modified")}  # fmt: skip
    atomic_write_json(sidecar(part), resource)
    return head


def _fetch(url: str, part: Path, cfg: DownloadConfig, size: int | None, attempt: _Attempt) -> None:
    """One attempt: appends to `part` from its current size to the end of the resource."""
    resource = _resumable(url, part)
    try:
        response, offset = _open(url, part, resource, cfg)
    except urllib.error.HTTPError as error:
        if error.code != 416 or resource is None:
            raise
        # Range not satisfiable: the part holds the whole resource (a job killed before the
        # rename), or more than it
        if resource.get("size") == part.stat().st_size:
            logger.info(
                "%s: the partial file is already complete (%d bytes)", url, resource["size"]
            )
            return
        raise _Changed(f"{url}: {part} is longer than the resource") from None
    with response:
        total = _total_size(response)
        if offset and response.status != 206:
            logger.warning("%s: the server sent the whole file (it ignores ranges, or the file "
                           "changed since %s was started); starting again", url, part)  # fmt: skip
            offset = 0
        elif offset and (
            resource.get("size") not in (None, total)
            or resource.get("etag") not in (None, response.headers.get("ETag"))
        ):
            raise _Changed(f"{url}: the resource changed since {part} was started")
        if total is not None and size is not None and total != size:
            discard(part)
            raise DownloadError(
                f"{url}: the server offers {total} bytes, but the file expected is {size} bytes "
                "(data.downloads bytes): another file, or a page of a proxy. Hint: check the URL "
                "and whether this machine reaches the internet through a proxy"
            )
        chunk = b"" if offset else _start(url, part, response, total, cfg)
        written = offset
        name = Path(urllib.parse.urlsplit(url).path).name or url
        bar = progress(desc=f"download {name}", unit="B", total=total, initial=offset, log=logger)
        with open(part, "ab" if offset else "wb") as out, bar:
            while chunk or (chunk := response.read(cfg.chunk_bytes)):
                out.write(chunk)
                written += len(chunk)
                attempt.received += len(chunk)
                bar.update(len(chunk))
                chunk = b""
    if total is not None and written < total:
        raise http.client.IncompleteRead(b"", total - written)


# A write of the part file that failed: a full disk or quota, a read-only or forbidden folder.
_LOCAL_WRITE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


def _unreachable(url: str, error: urllib.error.URLError) -> DownloadError | None:
    """The error for a host this machine cannot reach (no retry helps), or None."""
    reason = error.reason
    if urllib.parse.urlsplit(url).scheme == "file":
        return DownloadError(f"{url}: {reason}")
    if isinstance(reason, ssl.SSLError):
        what = f"the TLS connection failed ({reason})"
    elif isinstance(reason, socket.gaierror):
        what = f"its name does not resolve ({reason})"
    elif isinstance(reason, ConnectionRefusedError):
        what = "the connection was refused"
    elif isinstance(reason, OSError) and reason.errno in _NO_ROUTE:
        what = f"there is no route to it ({reason.strerror})"
    else:
        return None
    host = urllib.parse.urlsplit(url).hostname
    return DownloadError(
        f"{url}: {host} cannot be reached from this machine ({socket.gethostname()}): {what}. "
        "Downloads run on the machine that runs Snakemake (rules download and extract are "
        "local rules) unless data.download_on_compute_nodes is true, and the compute nodes of "
        "most clusters have no internet. Hint: run Snakemake (or this command) where the "
        "internet is, e.g. on a login node, and check the URL and any proxy (https_proxy)"
    )


def fetch(url: str, part: Path, cfg: DownloadConfig, size: int | None = None) -> None:
    """Fetches `url` into `part` (resuming it when it is the same resource).

    Args:
        url: an http(s) or file URL.
        part: the file that holds the bytes received so far (and `sidecar(part)` what they
            belong to).
        cfg: timeout, retries and pauses.
        size: the published size in bytes, or None: a resource of another size is refused.

    Raises:
        DownloadError: an unreachable host, an HTTP error that no retry changes, too many
            failures in a row (the bytes so far are kept for a later resume), an HTML page or
            a resource of another size (deleted).
    """
    failures, wait = 0, cfg.retry_wait_s
    while True:
        attempt = _Attempt()
        try:
            _fetch(url, part, cfg, size, attempt)
            return
        except _Changed as changed:
            logger.warning("%s; downloading from the first byte", changed)
            discard(part)
            continue
        except urllib.error.HTTPError as error:
            if error.code < 500 and error.code != 429:
                raise DownloadError(f"{url}: HTTP {error.code} {error.reason}") from None
            problem = f"HTTP {error.code}"
        except urllib.error.URLError as error:
            if (fatal := _unreachable(url, error)) is not None:
                raise fatal from None
            problem = f"{type(error.reason).__name__}: {error.reason}"
        except (http.client.HTTPException, OSError) as error:
            if isinstance(error, OSError) and error.errno in _LOCAL_WRITE_ERRORS:
                raise  # this machine's disk, not the network: no retry helps (fid.cli says)
            problem = f"{type(error).__name__}: {error}"
        if attempt.received:  # progress: a slow, often dropped transfer goes on
            failures, wait = 0, cfg.retry_wait_s
        failures += 1
        if failures > cfg.retries:
            raise DownloadError(
                f"{url}: gave up after {failures} failed attempts in a row without progress "
                f"({problem}); the {part.stat().st_size if part.exists() else 0} bytes received "
                f"so far are kept in {part}. Hint: run the same command again to resume."
            )
        logger.warning("%s: %s; retrying in %.0f s (failure %d of at most %d in a row)",
                       url, problem, wait, failures, cfg.retries + 1)  # fmt: skip
        time.sleep(wait)
        wait = min(2 * wait, cfg.max_retry_wait_s)
