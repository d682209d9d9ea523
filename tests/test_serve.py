"""`fid serve` through real HTTP on a tiny finished run (tests/tiny_run.py): the page, the
health and ask routes, answers equal to `fid ask --json`'s with each passage's attention share,
one 4xx JSON error for each bad request (never a traceback), a 500 whose traceback stays in the
log, and a server that listens on 127.0.0.1 only unless told otherwise. The page in a browser:
tests/test_serve_browser.py."""

from __future__ import annotations

import http.client
import io
import json
import logging
import math
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import huggingface_hub.constants
import psutil
import pytest
from tiny_run import N_PASSAGES, load_system, serving, write_tiny_run

from fid.cli import main
from fid.errors import InputError
from fid.serving.requests import MAX_BODY_BYTES
from fid.serving.server import _loopback_host, is_loopback, listen_address, make_server

BUDGET = 48 // 2  # the tiny reader's passage_max_tokens is 48: a question keeps half


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model_dir, toy_world) -> Path:
    return write_tiny_run(tmp_path_factory.mktemp("workflow"), tiny_model_dir, toy_world)


@pytest.fixture(scope="module")
def server(run):
    with serving(load_system(run)) as server:
        yield server


def _call(server, method: str, path: str, body: bytes | None = None, headers=None):
    """(status, headers, body) of one request through http.client."""
    connection = http.client.HTTPConnection(*server.server_address[:2], timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def _ask(server, question) -> tuple[int, dict]:
    body = json.dumps({"question": question}).encode()
    status, _, data = _call(server, "POST", "/api/ask", body,
                            {"Content-Type": "application/json"})  # fmt: skip
    return status, json.loads(data)


def _raw(server, data: bytes) -> tuple[int, dict, bytes]:
    """(status, headers, body) of a request sent as these bytes (what http.client won't send)."""
    with socket.create_connection(server.server_address[:2], timeout=30) as sock:
        sock.sendall(data)
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()


def test_health_and_the_page(server):
    status, headers, body = _call(server, "GET", "/api/health")
    assert status == 200 and headers["content-type"] == "application/json; charset=utf-8"
    health = json.loads(body)
    assert health["status"] == "ok" and health["n_passages"] == N_PASSAGES
    assert health["question_max_tokens"] == BUDGET
    assert health["system"].startswith("round 1's reader (")
    status, headers, body = _call(server, "GET", "/")
    page = body.decode()
    assert status == 200 and headers["content-type"] == "text/html; charset=utf-8"
    assert '<form id="form">' in page and '<table id="passages">' in page
    # one self-contained page: nothing loaded from anywhere, its own inline script only
    assert not any(word in page for word in ("src=", "href=", "http://", "https://", "@import"))
    assert "script-src 'sha256-" in headers["content-security-policy"]
    status, headers, body = _call(server, "HEAD", "/")
    assert status == 200 and body == b"" and int(headers["content-length"]) == len(page.encode())


def test_answers_equal_fid_ask_with_attention(server, run, toy_world, monkeypatch, capsys):
    """The API's record is `fid ask --json`'s for the same question, plus each passage's share
    of the reader's cross-attention (summing to 1) and the seconds spent."""
    questions = [q.question for q in toy_world.splits["dev"][:4]]
    answered = [_ask(server, question) for question in questions]
    assert all(status == 200 for status, _ in answered), answered
    records = [record for _, record in answered]
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(q + "\n" for q in questions)))
    capsys.readouterr()
    assert main(["ask", "--run", str(run), "--json"]) == 0
    asked = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    for record, expected in zip(records, asked, strict=True):
        attention = [p.pop("attention") for p in record["passages"]]
        seconds = record.pop("seconds")
        assert record == expected
        assert len(attention) == N_PASSAGES and all(0 <= a <= 1 for a in attention)
        assert math.isclose(sum(attention), 1, abs_tol=1e-4), attention
        assert 0 < seconds < 5


def test_questions_asked_at_once_get_the_answers_asked_one_by_one(server, toy_world):
    """Request threads, one model: the lock serialises the answers and mixes none up."""
    questions = [q.question for q in toy_world.splits["test"][:6]]
    alone = [_ask(server, q)[1]["answer"] for q in questions]
    together: dict[int, str] = {}

    def ask(i):
        together[i] = _ask(server, questions[i])[1]["answer"]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(questions))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert [together[i] for i in range(len(questions))] == alone


JSON = {"Content-Type": "application/json"}
LONG = " ".join(["who founded the old town of Stolria"] * 10)  # ~70 tokens
# name: (method, path, body, headers, status, what the error says)
BAD_REQUESTS = {
    "empty_question": ("POST", "/api/ask", b'{"question": "  \\t "}', JSON, 400,
                       "question: empty: expected a question"),
    "too_long": ("POST", "/api/ask", json.dumps({"question": LONG}).encode(), JSON, 400,
                 f"reader tokens ({len(LONG)} characters), over the budget of {BUDGET}"),
    "not_utf8": ("POST", "/api/ask", b'{"question": "caf\xe9?"}', JSON, 400,
                 "the body is not UTF-8 (byte 0xe9 at byte offset 17"),
    "lone_surrogate": ("POST", "/api/ask", b'{"question": "who \\ud800?"}', JSON, 400,
                       "question: character 5 is a lone surrogate"),
    "not_json": ("POST", "/api/ask", b'{"question": ', JSON, 400, "the body is not JSON"),
    "nested_deep": ("POST", "/api/ask", b"[" * 10_000, JSON, 400, "nests too deep"),
    "not_an_object": ("POST", "/api/ask", b'["who?"]', JSON, 400,
                      'expected a JSON object {"question": "..."}, got an array'),
    "unknown_key": ("POST", "/api/ask", b'{"question": "who?", "n": 3}', JSON, 400,
                    "unknown key(s) 'n'"),
    "not_a_string": ("POST", "/api/ask", b'{"question": 3}', JSON, 400,
                     "question: a number: expected a string"),
    "text_plain": ("POST", "/api/ask", b'{"question": "who?"}', {"Content-Type": "text/plain"},
                   415, "Content-Type 'text/plain': expected application/json"),
    "form": ("POST", "/api/ask", b"question=who", {
        "Content-Type": "application/x-www-form-urlencoded"}, 415, "expected application/json"),
    "no_content_type": ("POST", "/api/ask", b'{"question": "who?"}', {}, 415, "no Content-Type"),
    "latin1": ("POST", "/api/ask", b'{"question": "who?"}', {
        "Content-Type": "application/json; charset=latin-1"}, 415, "expected application/json"),
    "over_the_cap": ("POST", "/api/ask", b" " * (MAX_BODY_BYTES + 1), JSON, 413,
                     f"a body of {MAX_BODY_BYTES + 1} bytes: expected at most {MAX_BODY_BYTES}"),
    "get_ask": ("GET", "/api/ask", None, {}, 405, "GET /api/ask: expected POST"),
    "post_page": ("POST", "/", b"{}", JSON, 405, "POST /: expected GET or HEAD"),
    "delete_health": ("DELETE", "/api/health", None, {}, 405, "expected GET or HEAD"),
    "options": ("OPTIONS", "/api/ask", None, {}, 405, "expected POST"),
    "unknown_path": ("GET", "/index.html", None, {}, 404, "no such path '/index.html'"),
    "a_file": ("GET", "/../../etc/passwd", None, {}, 404, "no such path"),
    "source_file": ("GET", "/fid/serving/page.py", None, {}, 404, "no such path"),
    "unknown_method": ("BREW", "/", None, {}, 501, "Unsupported method ('BREW')"),
    "rebound_host": ("GET", "/api/health", None, {"Host": "attacker.example:8000"}, 403,
                     "Host 'attacker.example:8000': this server answers requests to loopback"),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD_REQUESTS)
def test_a_bad_request_is_a_4xx_json_error(server, case, caplog):
    method, path, body, headers, status, message = BAD_REQUESTS[case]
    got, response_headers, data = _call(server, method, path, body, headers)
    assert got == status, data
    assert response_headers["content-type"] == "application/json; charset=utf-8"
    error = json.loads(data)
    assert list(error) == ["error"] and message in error["error"], error
    assert b"Traceback" not in data
    assert not any(r.exc_info for r in caplog.records), "a bad request logs no traceback"
    if status == 405:
        assert response_headers["allow"] == ("POST" if path == "/api/ask" else "GET, HEAD")


@pytest.mark.parametrize(
    "request_bytes, status, message",
    [
        (b"POST /api/ask HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\r\n",
         411, "no Content-Length"),
        (b"POST /api/ask HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
         b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 411, "Transfer-Encoding"),
        # said from the header: the gigabyte is never sent, let alone read
        (b"POST /api/ask HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
         b"Content-Length: 1000000000\r\n\r\n", 413, "a body of 1000000000 bytes"),
        (b"POST /api/ask HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
         b"Content-Length: 12abc\r\n\r\n", 400, "Content-Length '12abc': expected one number"),
        (b"POST /api/ask HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
         b"Content-Length: 50\r\n\r\n{\"question\": \"who?\"}", None, None),  # 408: below
        (b"GET / HTTP/1.1\r\nX-Long: " + b"a" * 70_000 + b"\r\n\r\n", 431, "Line too long"),
    ],
    ids=["no_length", "chunked", "huge_declared", "bad_length", "stalled_body", "header_too_long"],
)  # fmt: skip
def test_requests_http_client_would_not_send(server, request_bytes, status, message,
                                             monkeypatch):  # fmt: skip
    """A body without a length, a huge one declared, a stalled one (408 after the server's
    timeout), a header over http.server's limit (its own refusal): each one JSON error."""
    if status is None:
        monkeypatch.setattr(server, "request_timeout_s", 0.5)
        status, message = 408, "the request's body took over 0.5 s to arrive"
    got, headers, data = _raw(server, request_bytes)
    assert got == status and headers["content-type"].startswith("application/json"), data
    assert message in json.loads(data)["error"]


def test_an_error_inside_answering_is_a_500_with_its_traceback_in_the_log(
    server, toy_world, monkeypatch, caplog
):
    def fail(*args, **kwargs):
        raise RuntimeError("the model broke at layer 3")

    monkeypatch.setattr(server.system, "answer", fail)
    status, error = _ask(server, toy_world.splits["dev"][0].question)
    assert status == 500
    assert error == {"error": "answering failed (RuntimeError): the server's log has the details"}
    (logged,) = [r for r in caplog.records if r.exc_info]
    assert logged.levelno == logging.ERROR and "layer 3" in str(logged.exc_info[1])


def test_it_listens_on_127_0_0_1_by_default(run):
    with make_server(load_system(run)) as server:
        assert server.server_address[0] == "127.0.0.1" and server.url.startswith("http://127.")


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_an_address_others_can_reach_is_warned(host, caplog):
    """Checked without listening there (a test binds nothing beyond loopback)."""
    family, address = listen_address(host, 8000)
    assert address[0] == host and family in (socket.AF_INET, socket.AF_INET6)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"--host {host} is not a loopback address" in warning
    caplog.clear()
    listen_address("localhost", 8000)
    assert not caplog.records


def test_loopback_names():
    assert all(map(is_loopback, ["127.0.0.1", "127.1.2.3", "::1", "localhost", "app.localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "192.168.1.4", "example.com", "10.0.0.1"]))
    assert all(map(_loopback_host, ["127.0.0.1:8000", "[::1]:8000", "localhost", "LOCALHOST:1"]))
    assert not any(map(_loopback_host, ["evil.example", "evil.example:8000", "[::]:80"]))


def test_a_port_in_use_or_an_unknown_host_is_one_input_error(server):
    taken = server.server_address[1]
    with pytest.raises(InputError, match=f"127.0.0.1:{taken}: cannot listen there .*--port 0"):
        make_server(server.system, "127.0.0.1", taken)
    with pytest.raises(InputError, match="--host 'no-such-host.invalid': no address"):
        make_server(server.system, "no-such-host.invalid", 0)
    with pytest.raises(SystemExit):
        main(["serve", "--run", "results/demo", "--port", "70000"])


def test_fid_serve_listens_on_loopback_only_and_stops_on_ctrl_c(run):
    """The command: it prints the URL it listens on, every socket it listens on is
    127.0.0.1's, and Ctrl-C (SIGINT) ends it with status 0 and no traceback."""
    process = subprocess.Popen(
        [sys.executable, "-m", "fid", "--threads", "1", "serve", "--run", str(run), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    try:
        line = _line_within(process, 120)
        assert line.startswith("fid serve: listening on http://127.0.0.1:"), line
        url = line.split()[4]
        server = psutil.Process(process.pid)
        # net_connections: psutil >= 6 (pyproject.toml allows 5.9, where it is connections)
        sockets = getattr(server, "net_connections", None) or server.connections
        listening = [c for c in sockets(kind="inet") if c.status == psutil.CONN_LISTEN]
        assert [c.laddr.ip for c in listening] == ["127.0.0.1"], listening
        assert url == f"http://127.0.0.1:{listening[0].laddr.port}/"
        connection = http.client.HTTPConnection("127.0.0.1", listening[0].laddr.port)
        connection.request("GET", "/api/health")
        assert connection.getresponse().status == 200
        connection.close()
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 0, stderr
    assert "stopped (Ctrl-C)" in stderr and "Traceback" not in stderr


def _line_within(process: subprocess.Popen, seconds: float) -> str:
    """The first line of the process's stdout, waiting at most `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], 1.0)
        if ready:
            return process.stdout.readline().strip()
        if process.poll() is not None:
            break
    process.kill()
    raise AssertionError(f"no line from fid serve in {seconds} s: {process.communicate()[1]}")
