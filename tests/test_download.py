"""`fid download` / `fid extract` against a small HTTP server on 127.0.0.1 serving fixtures:
a good file is accepted, a corrupted one rejected by its checksum, an interrupted one resumed."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fid.cli import main
from fid.config import ConfigError, DownloadConfig
from fid.data.download import DownloadError, download, extract, parse_checksum
from fid.errors import DataError

PAYLOAD = bytes(range(256)) * 4096  # 1 MiB, every byte value
SHA256 = "sha256:" + hashlib.sha256(PAYLOAD).hexdigest()
MD5 = "md5:" + hashlib.md5(PAYLOAD).hexdigest()
FAST = DownloadConfig(retries=3, retry_wait_s=0.0, timeout_s=10, chunk_bytes=64 * 1024)


class _Handler(BaseHTTPRequestHandler):
    """Serves `server.files`, honours `Range: bytes=N-` (unless `server.ranges` is False) and
    cuts the next response of a path after `server.cut[path]` bytes (a dropped connection)."""

    def do_GET(self):  # noqa: N802 (the http.server API)
        server = self.server
        data = server.files.get(self.path)
        server.requests.append((self.path, self.headers.get("Range")))
        if data is None:
            self.send_error(404)
            return
        start, wanted = 0, self.headers.get("Range")
        if wanted and server.ranges:
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


def test_partial_file_of_a_killed_run_is_resumed(server, tmp_path):
    server.files["/big.bin"] = PAYLOAD
    out = tmp_path / "big.bin"
    (tmp_path / "big.bin.part").write_bytes(PAYLOAD[:500_000])
    download(f"{server.url}/big.bin", out, SHA256, FAST)
    assert out.read_bytes() == PAYLOAD
    assert server.requests == [("/big.bin", "bytes=500000-")]


def test_complete_partial_file_is_verified_without_refetching(server, tmp_path):
    server.files["/big.bin"] = PAYLOAD
    (tmp_path / "big.bin.part").write_bytes(PAYLOAD)
    download(f"{server.url}/big.bin", tmp_path / "big.bin", MD5, FAST)
    assert (tmp_path / "big.bin").read_bytes() == PAYLOAD


def test_server_without_ranges_restarts_from_the_first_byte(server, tmp_path):
    server.files["/big.bin"] = PAYLOAD
    server.ranges = False
    (tmp_path / "big.bin.part").write_bytes(b"stale bytes of an older file")
    download(f"{server.url}/big.bin", tmp_path / "big.bin", SHA256, FAST)
    assert (tmp_path / "big.bin").read_bytes() == PAYLOAD


def test_missing_file_fails_without_retrying(server, tmp_path):
    with pytest.raises(DownloadError, match="HTTP 404"):
        download(f"{server.url}/nothing", tmp_path / "x", None, FAST)
    assert len(server.requests) == 1


def test_giving_up_keeps_the_partial_file_for_a_later_resume(server, tmp_path):
    server.files["/big.bin"] = PAYLOAD
    cfg = DownloadConfig(retries=1, retry_wait_s=0.0, timeout_s=10)
    server.cut["/big.bin"] = 100_000

    class AlwaysCut(dict):  # every response of the path drops after 100 kB
        def pop(self, key, default=None):
            return 100_000 if key == "/big.bin" else default

    server.cut = AlwaysCut()
    with pytest.raises(DownloadError, match="gave up after 2 attempts"):
        download(f"{server.url}/big.bin", tmp_path / "big.bin", SHA256, cfg)
    assert (tmp_path / "big.bin.part").stat().st_size == 200_000
    server.cut = {}
    download(f"{server.url}/big.bin", tmp_path / "big.bin", SHA256, cfg)
    assert (tmp_path / "big.bin").read_bytes() == PAYLOAD


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
