"""`fid download` / `fid extract` against a small HTTP server on 127.0.0.1 serving fixtures:
a good file is accepted, a corrupted one rejected by its checksum, an interrupted one resumed
only when the partial file belongs to the same resource, a page or a file of another size
refused, an unreachable host refused at once, and transient failures retried with a bounded,
progress-aware back-off."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import logging
import socket
import tarfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fid.cli import main
from fid.config import ConfigError, DownloadConfig
from fid.data import fetch
from fid.data.download import (
    DownloadError,
    check_existing_download,
    download,
    extract,
    parse_checksum,
)
from fid.errors import DataError

PAYLOAD = bytes(range(256)) * 4096  # 1 MiB, every byte value
SHA256 = "sha256:" + hashlib.sha256(PAYLOAD).hexdigest()
MD5 = "md5:" + hashlib.md5(PAYLOAD).hexdigest()
FAST = DownloadConfig(retries=3, retry_wait_s=0.0, timeout_s=10, chunk_bytes=64 * 1024)


class _Handler(BaseHTTPRequestHandler):
    """Serves `server.files` (with `server.etags[path]` as ETag and `server.types[path]` as
    Content-Type), honours `Range: bytes=N-` (unless `server.ranges` is False) and `If-Range`,
    answers `server.status[path]` (a list, one status per request) instead when set, and cuts
    the next response of a path after `server.cut[path]` bytes (a dropped connection)."""

    def do_GET(self):  # noqa: N802 (the http.server API)
        server = self.server
        data = server.files.get(self.path)
        server.requests.append((self.path, self.headers.get("Range")))
        statuses = server.status.get(self.path)
        if statuses and (code := statuses.pop(0)) is not None:
            self.send_error(code)
            return
        if data is None:
            self.send_error(404)
            return
        start, wanted = 0, self.headers.get("Range")
        if_range, etag = self.headers.get("If-Range"), server.etags.get(self.path)
        if wanted and server.ranges and (if_range is None or if_range == etag):
            start = int(wanted.removeprefix("bytes=").split("-")[0])
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Type", server.types.get(self.path, "application/octet-stream"))
        if etag:
            self.send_header("ETag", etag)
        self.end_headers()
        cut = server.cut.pop(self.path, None)
        self.wfile.write(body if cut is None else body[:cut])
        if cut is not None:
            self.close_connection = True

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.files, httpd.cut, httpd.requests, httpd.ranges = {}, {}, [], True
    httpd.etags, httpd.types, httpd.status = {}, {}, {}
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("checksum", [SHA256, MD5, SHA256.upper().replace("SHA256", "sha256")])
def test_good_file_is_accepted(server, tmp_path, checksum):
    server.files["/good.bin"] = PAYLOAD
    out = tmp_path / "sub" / "good.bin"
    record = download(f"{server.url}/good.bin", out, checksum, FAST)
    assert out.read_bytes() == PAYLOAD
    assert record["sha256"] == SHA256[7:] and record["md5"] == MD5[4:]
    assert record["bytes"] == len(PAYLOAD)
    assert not (tmp_path / "sub" / "good.bin.part").exists()


def test_corrupted_file_is_rejected_by_its_checksum(server, tmp_path):
    corrupted = bytearray(PAYLOAD)
    corrupted[1000] ^= 0xFF
    server.files["/bad.bin"] = bytes(corrupted)
    out = tmp_path / "bad.bin"
    with pytest.raises(DownloadError, match="checksum mismatch") as error:
        download(f"{server.url}/bad.bin", out, SHA256, FAST)
    assert SHA256[7:] in str(error.value)
    assert hashlib.sha256(corrupted).hexdigest() in str(error.value)
    assert not out.exists() and not (tmp_path / "bad.bin.part").exists()


def test_interrupted_download_is_resumed(server, tmp_path):
    server.files["/big.bin"] = PAYLOAD
    server.cut["/big.bin"] = 300_000  # the first response drops after 300 kB
    out = tmp_path / "big.bin"
    download(f"{server.url}/big.bin", out, SHA256, FAST)
    assert out.read_bytes() == PAYLOAD
    assert server.requests == [("/big.bin", None), ("/big.bin", "bytes=300000-")]


def _started(tmp_path, name, data, url, size=None, etag=None):
    """A `.part` as a killed `fid download` of `url` leaves it: bytes and their sidecar."""
    (tmp_path / f"{name}.part").write_bytes(data)
    sidecar = {"url": url, "size": size, "etag": etag, "last_modified": None}
    (tmp_path / f"{name}.part.json").write_text(json.dumps(sidecar))


def test_partial_file_of_a_killed_run_is_resumed(server, tmp_path, caplog):
    server.files["/big.bin"] = PAYLOAD
    server.etags["/big.bin"] = '"v1"'
    out = tmp_path / "big.bin"
    _started(tmp_path, "big.bin", PAYLOAD[:500_000], f"{server.url}/big.bin", len(PAYLOAD), '"v1"')
    with caplog.at_level(logging.INFO):
        download(f"{server.url}/big.bin", out, SHA256, FAST)
    # said on a workflow job's console too (the record carries CONSOLE), with how far it was
    (resumed,) = [r for r in caplog.records if r.getMessage().startswith("resuming")]
    assert getattr(resumed, "console", False)
    assert f"from byte 500000 ({100 * 500_000 / len(PAYLOAD):.0f}% of {len(PAYLOAD):,} bytes)" in (
        resumed.getMessage()
    )
    assert out.read_bytes() == PAYLOAD
    assert server.requests == [("/big.bin", "bytes=500000-")]
    assert (
        not (tmp_path / "big.bin.part").exists() and not (tmp_path / "big.bin.part.json").exists()
    )


def test_complete_partial_file_is_verified_without_refetching(server, tmp_path):
    server.files["/big.bin"] = PAYLOAD
    _started(tmp_path, "big.bin", PAYLOAD, f"{server.url}/big.bin", len(PAYLOAD))
    download(f"{server.url}/big.bin", tmp_path / "big.bin", MD5, FAST)
    assert (tmp_path / "big.bin").read_bytes() == PAYLOAD


def test_server_without_ranges_restarts_from_the_first_byte(server, tmp_path):
    server.files["/big.bin"] = PAYLOAD
    server.ranges = False
    _started(tmp_path, "big.bin", b"stale bytes of an older file", f"{server.url}/big.bin")
    download(f"{server.url}/big.bin", tmp_path / "big.bin", SHA256, FAST)
    assert (tmp_path / "big.bin").read_bytes() == PAYLOAD


@pytest.mark.parametrize(
    "case, why",
    [
        ("no sidecar", "of no known URL"),  # a .part of an older fid, or put there by hand
        ("other url", "was for http://elsewhere.example/big.bin"),
        ("other etag", "the server sent the whole file"),  # If-Range: the resource changed
        ("other size", "the resource changed since"),  # a server without ETags
    ],
)
def test_partial_file_of_another_resource_starts_again(server, tmp_path, caplog, case, why):
    """Issue 31: a .part is resumed only for the resource it holds the start of."""
    server.files["/big.bin"] = PAYLOAD
    url = f"{server.url}/big.bin"
    stale = b"<html>a proxy's page</html>" + PAYLOAD[:1000]
    if case == "no sidecar":
        (tmp_path / "big.bin.part").write_bytes(stale)
    elif case == "other url":
        _started(tmp_path, "big.bin", stale, "http://elsewhere.example/big.bin")
    elif case == "other etag":
        server.etags["/big.bin"] = '"v2"'
        _started(tmp_path, "big.bin", stale, url, len(PAYLOAD), '"v1"')
    else:
        _started(tmp_path, "big.bin", stale, url, len(PAYLOAD) + 7)
    download(url, tmp_path / "big.bin", SHA256, FAST)
    assert (tmp_path / "big.bin").read_bytes() == PAYLOAD
    assert why in caplog.text
    if case == "other etag":  # one request: the server answered If-Range with the whole file
        assert server.requests == [("/big.bin", f"bytes={len(stale)}-")]
    else:  # the last request asked for the whole file
        assert server.requests[-1] == ("/big.bin", None)


def test_missing_file_fails_without_retrying(server, tmp_path):
    with pytest.raises(DownloadError, match="HTTP 404"):
        download(f"{server.url}/nothing", tmp_path / "x", None, FAST)
    assert len(server.requests) == 1


@pytest.mark.parametrize("content_type", ["text/html; charset=utf-8", "application/octet-stream"])
def test_an_html_page_is_refused(server, tmp_path, content_type):
    """A proxy's or login page served for an archive without a published checksum must not
    become the file (nor its digest the record offered for pinning)."""
    server.files["/dataindex.tar.gz"] = b"\n  <!DOCTYPE html><html><body>Sign in</body></html>"
    server.types["/dataindex.tar.gz"] = content_type
    record = tmp_path / "checksums" / "dataindex.tar.gz.json"
    with pytest.raises(DownloadError, match="HTML page"):
        download(f"{server.url}/dataindex.tar.gz", tmp_path / "dataindex.tar.gz", None, FAST,
                 record)  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    assert len(server.requests) == 1


def test_a_file_of_another_size_is_refused_before_it_is_downloaded(server, tmp_path):
    server.files["/big.bin"] = PAYLOAD
    with pytest.raises(
        DownloadError, match=f"offers {len(PAYLOAD)} bytes.* {len(PAYLOAD) + 1} bytes"
    ):
        download(f"{server.url}/big.bin", tmp_path / "big.bin", None, FAST, size=len(PAYLOAD) + 1)
    assert list(tmp_path.iterdir()) == [] and len(server.requests) == 1
    download(f"{server.url}/big.bin", tmp_path / "big.bin", None, FAST, size=len(PAYLOAD))
    assert (tmp_path / "big.bin").read_bytes() == PAYLOAD


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # nobody listens once the probe is closed


@pytest.mark.parametrize("where", ["closed port", "unresolvable name"])
def test_an_unreachable_host_fails_at_once_with_one_message(tmp_path, caplog, monkeypatch, where):
    """A compute node without internet: no back-off (issue 31 measured ~34 min per job), one
    line that says where downloads run, exit status 1."""
    url = {
        "closed port": f"http://127.0.0.1:{_closed_port()}/psgs_w100.tsv.gz",
        "unresolvable name": "http://dl.fid-test.invalid/psgs_w100.tsv.gz",  # RFC 2606
    }[where]
    monkeypatch.setattr(fetch.time, "sleep", lambda s: pytest.fail(f"retried after {s} s"))
    started = time.monotonic()
    code = main(["download", "--settings", "{retries: 10, retry_wait_s: 30}", "--url", url,
                 "--output", str(tmp_path / "psgs_w100.tsv.gz")])  # fmt: skip
    assert code == 1 and time.monotonic() - started < 30
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1, errors
    assert "cannot be reached from this machine" in errors[0]
    assert "machine that runs Snakemake" in errors[0] and "download_on_compute_nodes" in errors[0]
    assert list(tmp_path.iterdir()) == []


def test_back_off_doubles_up_to_its_ceiling(server, tmp_path, monkeypatch):
    server.files["/f.bin"] = PAYLOAD
    server.status["/f.bin"] = [503] * 6
    waits = []
    monkeypatch.setattr(fetch.time, "sleep", waits.append)
    cfg = DownloadConfig(retries=6, retry_wait_s=1.0, max_retry_wait_s=4.0)
    download(f"{server.url}/f.bin", tmp_path / "f.bin", SHA256, cfg)
    assert waits == [1.0, 2.0, 4.0, 4.0, 4.0, 4.0]
    assert (tmp_path / "f.bin").read_bytes() == PAYLOAD


class _AlwaysCut(dict):
    """Every response of /big.bin drops after 100 kB."""

    def pop(self, key, default=None):
        return 100_000 if key == "/big.bin" else default


def test_attempts_that_progress_start_the_retry_count_afresh(server, tmp_path, monkeypatch):
    """A slow, often dropped transfer of a large file goes on while each attempt receives bytes:
    11 attempts of 100 kB each, with 1 retry allowed after failures in a row."""
    monkeypatch.setattr(fetch.time, "sleep", lambda s: None)
    server.files["/big.bin"] = PAYLOAD
    server.cut = _AlwaysCut()
    cfg = DownloadConfig(retries=1, retry_wait_s=5.0)
    download(f"{server.url}/big.bin", tmp_path / "big.bin", SHA256, cfg)
    assert (tmp_path / "big.bin").read_bytes() == PAYLOAD
    assert len(server.requests) == -(-len(PAYLOAD) // 100_000)


def test_giving_up_keeps_the_partial_file_for_a_later_resume(server, tmp_path, monkeypatch):
    monkeypatch.setattr(fetch.time, "sleep", lambda s: None)
    server.files["/big.bin"] = PAYLOAD
    cfg = DownloadConfig(retries=1, retry_wait_s=0.0, timeout_s=10)
    server.cut["/big.bin"] = 100_000  # the first response drops after 100 kB ...
    server.status["/big.bin"] = [None, 503, 503]  # ... then the server fails twice in a row
    with pytest.raises(DownloadError, match="gave up after 2 failed attempts in a row"):
        download(f"{server.url}/big.bin", tmp_path / "big.bin", SHA256, cfg)
    assert (tmp_path / "big.bin.part").stat().st_size == 100_000
    download(f"{server.url}/big.bin", tmp_path / "big.bin", SHA256, cfg)
    assert (tmp_path / "big.bin").read_bytes() == PAYLOAD
    assert server.requests[-1] == ("/big.bin", "bytes=100000-")


def test_a_finished_download_is_checked_against_its_pinned_checksum(server, tmp_path):
    """What rules/common.smk runs when the DAG is built: the record, not the file, is read."""
    server.files["/f.bin"] = PAYLOAD
    url, out, record = f"{server.url}/f.bin", tmp_path / "f.bin", tmp_path / "f.json"
    download(url, out, None, FAST, record)
    check_existing_download(out, record, url, SHA256, len(PAYLOAD))  # the recorded digest
    check_existing_download(out, record, url, MD5, None)
    check_existing_download(tmp_path / "absent", record, url, SHA256, None)  # nothing yet
    check_existing_download(out, record, "http://moved.example/f.bin", "md5:" + "0" * 32, None)
    with pytest.raises(DownloadError, match=f"pinned checksum is sha256 {'0' * 64}.*{SHA256[7:]}"):
        check_existing_download(out, record, url, "sha256:" + "0" * 64, None)
    with pytest.raises(DownloadError, match=f"{len(PAYLOAD)} bytes .* expected is 5 bytes"):
        check_existing_download(out, record, url, SHA256, 5)
    out.write_bytes(PAYLOAD[:10])
    with pytest.raises(DownloadError, match="changed since"):
        check_existing_download(out, record, url, SHA256, None)


def test_no_checksum_records_the_digests(server, tmp_path):
    server.files["/f.bin"] = PAYLOAD
    record_path = tmp_path / "f.json"
    code = main(["download", "--url", f"{server.url}/f.bin", "--output", str(tmp_path / "f.bin"),
                 "--record", str(record_path)])  # fmt: skip
    assert code == 0
    record = json.loads(record_path.read_text())
    assert record["sha256"] == SHA256[7:] and record["expected"] is None


def test_cli_exit_status_and_message_on_mismatch(server, tmp_path, caplog):
    server.files["/f.bin"] = PAYLOAD + b"x"
    config = tmp_path / "download.yaml"
    config.write_text("retries: 0\nretry_wait_s: 0.0\n")
    code = main(["download", "--config", str(config), "--url", f"{server.url}/f.bin",
                 "--checksum", SHA256, "--output", str(tmp_path / "f.bin")])  # fmt: skip
    assert code == 1
    assert "checksum mismatch" in caplog.text and not (tmp_path / "f.bin").exists()


@pytest.mark.parametrize(
    "bad", ["sha1:" + "0" * 40, "sha256:abc", "md5:" + "g" * 32, "sha256" + "0" * 64]
)
def test_bad_checksum_strings(bad):
    with pytest.raises(ConfigError, match="checksum"):
        parse_checksum(bad)


def _tar(path, members: dict[str, bytes]):
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_extract_gzip_and_tar_members(tmp_path):
    (tmp_path / "p.tsv.gz").write_bytes(gzip.compress(b"id\ttext\ttitle\n1\ta\tb\n"))
    extract(tmp_path / "p.tsv.gz", tmp_path / "p.tsv")
    assert (tmp_path / "p.tsv").read_text() == "id\ttext\ttitle\n1\ta\tb\n"

    _tar(
        tmp_path / "index.tar.gz",
        {"./NQ.train.idx.json": b"[2, 0]", "data/TQA.dev.idx.json": b"[1]"},
    )
    extract(tmp_path / "index.tar.gz", tmp_path / "a.json", "NQ.train.idx.json")
    extract(tmp_path / "index.tar.gz", tmp_path / "b.json", "TQA.dev.idx.json")  # by name
    assert (tmp_path / "a.json").read_text() == "[2, 0]"
    assert (tmp_path / "b.json").read_text() == "[1]"

    with pytest.raises(DataError, match="no such member 'NQ.dev.idx.json'.*NQ.train.idx.json"):
        extract(tmp_path / "index.tar.gz", tmp_path / "c.json", "NQ.dev.idx.json")
    with pytest.raises(DataError, match="name the member"):
        extract(tmp_path / "index.tar.gz", tmp_path / "c.json")
    with pytest.raises(DataError, match="not a tar archive"):
        extract(tmp_path / "p.tsv.gz", tmp_path / "c.json", "x")
    assert not (tmp_path / "c.json").exists()
