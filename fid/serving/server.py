"""`fid serve`: the system a run built (fid.evaluation.run_system), loaded once, answering over
HTTP: GET / a page with a question box (fid.serving.page), POST /api/ask the JSON API, GET
/api/health what is loaded.

POST /api/ask takes {"question": "..."} and answers with `fid ask --json`'s record
(fid.evaluation.ask `Reply.record`) plus what the page shows beside it:
{question, answer, passages: [{rank, id, title, score (the retrieval score), text,
attention (the reader's cross-attention share)}], seconds}.

The standard library's http.server rather than a web framework: no new dependency for three
fixed routes, and a surface small enough to read whole. Each request is a thread (a slow client
holds up no other), but the model answers one question at a time, under one lock: inference
on one torch model is serialised (concurrent passes would compete for the same CPU threads or
GPU, and the tokenizers and modules are not meant for concurrent calls).

The server is for the browser of a person on this machine. It listens on 127.0.0.1 unless
--host names another address (then with a warning: it has no authentication), and, so bound,
answers only requests addressed to a loopback name (the Host header), so that a web page of
another site cannot reach it through DNS rebinding. A bad request gets a 4xx JSON
{"error": "..."} (fid.serving.requests lists the checks; 404 an unknown path, 405 with Allow a
method the path does not take, 403 a Host that is not loopback, 408 a client that stalls, and
http.server's own refusals, a malformed request line or an unknown method, in the same JSON);
a question over the reader's budget (`AskSystem.question_budget`: the tokens `fid ask` would
keep) is a 400, not cut. An error inside answering is a 500 with a short message; its traceback
goes to the server's log only. Nothing from a request reaches the file system: the routes are
a fixed table and the page a string.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
import socketserver
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TextIO
from urllib.parse import urlsplit

from fid.errors import InputError
from fid.evaluation.ask import AskSystem
from fid.serving.page import PAGE, csp
from fid.serving.requests import RequestError, body_length, read_question

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
# A client gets this long for each read of its request (request line, headers, body).
REQUEST_TIMEOUT_S = 30.0
# After refusing a body unread (413, 415, ...), up to this much of it is read and dropped, for
# up to LINGER_S, so that the client reads the refusal instead of a connection reset (a
# socket closed with unread input sends RST, which can discard the response in flight).
LINGER_BYTES = 1 << 20
LINGER_S = 2.0
JSON_TYPE = "application/json; charset=utf-8"
# path -> (method, handler method): the whole of what the server serves.
ROUTES = {"/": ("GET", "_page"), "/api/health": ("GET", "_health"), "/api/ask": ("POST", "_ask")}


class AskServer(ThreadingHTTPServer):
    """An HTTP server answering with one loaded `AskSystem` (`make_server` builds it)."""

    daemon_threads = True  # a client that keeps its connection open does not keep fid running
    request_timeout_s = REQUEST_TIMEOUT_S

    def __init__(self, address: tuple, family: int, system: AskSystem):
        self.address_family = family
        self.system = system
        self.lock = threading.Lock()
        self.loopback = is_loopback(address[0])
        super().__init__(address, AskHandler)

    def server_bind(self) -> None:
        # HTTPServer's own looks up the host's fully qualified name (a DNS query that can take
        # seconds), for a name nothing here uses.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/"

    def health(self) -> dict:
        system = self.system
        return {
            "status": "ok",
            "system": system.description,
            "n_passages": system.cfg.n_passages,
            "question_max_tokens": system.question_budget,
        }

    def ask(self, question: str) -> dict:
        """`fid ask --json`'s record of `question`, with each passage's attention share and the
        seconds spent answering (the wait for the lock not counted)."""
        with self.lock:
            tokens, budget = self.system.question_tokens(question), self.system.question_budget
            if tokens > budget:
                raise RequestError(
                    HTTPStatus.BAD_REQUEST,
                    f"question: {tokens} reader tokens ({len(question)} characters), over the "
                    f"budget of {budget} (half of each passage input the reader reads): "
                    "expected a shorter question",
                )
            reply = self.system.answer(question, attention=True)
        return {**reply.record(), "seconds": reply.seconds}

    def handle_error(self, request, client_address) -> None:
        """A connection that failed outside a handler's answer: a client gone is one line, any
        other error its traceback, in the log (never to the client)."""
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError)):
            logger.info("%s: connection ended: %s", client_address[0], error)
        else:
            logger.error("%s: request failed", client_address[0], exc_info=error)


class AskHandler(BaseHTTPRequestHandler):
    """One request: routed by `ROUTES`, answered in JSON (the page in HTML)."""

    server: AskServer
    server_version = "fid-serve"
    sys_version = ""  # the Python version is no client's business

    def version_string(self) -> str:
        return self.server_version

    def setup(self) -> None:
        self.timeout = self.server.request_timeout_s  # the socket's, for every read
        self.unread = 0  # body bytes left unread by a refusal (`_linger`)
        super().setup()

    def _dispatch(self) -> None:
        path = urlsplit(self.path).path
        headers: dict[str, str] = {}
        self.body_read = False
        try:
            status, content_type, body, headers = self._route(path)
        except RequestError as error:
            status, content_type = error.status, JSON_TYPE
            body, headers = _json({"error": error.message}), error.headers
            if not self.body_read:
                self.unread = self._declared_length()
        except TimeoutError:
            status, content_type = HTTPStatus.REQUEST_TIMEOUT, JSON_TYPE
            body = _json({"error": f"the request's body took over {self.timeout:g} s to arrive"})
        except Exception as error:  # a failure inside answering: its traceback to the log only
            logger.error("%s %s failed", self.command, path, exc_info=error)
            status, content_type = HTTPStatus.INTERNAL_SERVER_ERROR, JSON_TYPE
            body = _json(
                {
                    "error": f"answering failed ({type(error).__name__}): the server's "
                    "log has the details"
                }
            )
        self._send(status, content_type, body, headers)

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _dispatch

    def _route(self, path: str) -> tuple[int, str, bytes, dict[str, str]]:
        host = self.headers.get("Host")
        if self.server.loopback and host is not None and not _loopback_host(host):
            raise RequestError(
                HTTPStatus.FORBIDDEN,
                f"Host {host[:60]!r}: this server answers requests to loopback "
                "names only (127.0.0.1, localhost, [::1])",
            )
        if path not in ROUTES:
            raise RequestError(
                HTTPStatus.NOT_FOUND,
                f"no such path {path[:60]!r}: expected GET /, GET /api/health or POST /api/ask",
            )
        method, handler = ROUTES[path]
        allowed = [method, "HEAD"] if method == "GET" else [method]
        if self.command not in allowed:
            raise RequestError(
                HTTPStatus.METHOD_NOT_ALLOWED,
                f"{self.command} {path}: expected {' or '.join(allowed)}",
                {"Allow": ", ".join(allowed)},
            )
        return getattr(self, handler)()

    def _page(self):
        return (
            HTTPStatus.OK,
            "text/html; charset=utf-8",
            PAGE.encode(),
            {"Content-Security-Policy": csp()},
        )

    def _health(self):
        return HTTPStatus.OK, JSON_TYPE, _json(self.server.health()), {}

    def _ask(self):
        length = body_length(self.headers)  # 4xx before any byte is read
        self.body_read = True
        question = read_question(self.rfile, length)
        return HTTPStatus.OK, JSON_TYPE, _json(self.server.ask(question)), {}

    def _declared_length(self) -> int:
        """The bytes of body a request says it sends (a chunked one: up to LINGER_BYTES)."""
        declared = (self.headers.get("Content-Length") or "").strip()
        if declared.isascii() and declared.isdigit():
            return int(declared)
        return LINGER_BYTES if "Transfer-Encoding" in self.headers else 0

    def send_error(self, code: int, message: str | None = None, explain: str | None = None):
        """http.server's own refusals (a malformed request line, an unknown method, a URI or
        headers too long) in this server's JSON, not its HTML page."""
        self.close_connection = True
        body = _json({"error": message or HTTPStatus(code).phrase})
        self._send(code, JSON_TYPE, body, {"Connection": "close"})

    def _send(self, status: int, content_type: str, body: bytes, headers: dict[str, str]):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if getattr(self, "command", None) != "HEAD":
            self.wfile.write(body)
        if self.unread:
            self._linger()

    def _linger(self) -> None:
        """Sends the response and the end of output, then reads and drops what the client
        still sends of a body refused unread (up to LINGER_BYTES for up to LINGER_S)."""
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_WR)
        deadline, left = time.monotonic() + LINGER_S, min(self.unread, LINGER_BYTES)
        self.unread = 0
        try:
            while left > 0 and (wait := deadline - time.monotonic()) > 0:
                self.connection.settimeout(wait)
                chunk = self.connection.recv(min(left, 65536))
                if not chunk:
                    break
                left -= len(chunk)
        except OSError:  # timed out or reset: the client has had its answer
            pass

    def log_message(self, format: str, *args) -> None:
        logger.info("%s %s", self.address_string(), format % args)


def make_server(system: AskSystem, host: str = LOOPBACK, port: int = 0) -> AskServer:
    """An `AskServer` listening on `host`:`port` (port 0: a free one; `server.url` says which).

    Raises:
        InputError: a host that is no address of this machine, or a port it cannot take.
    """
    family, address = listen_address(host, port)
    try:
        return AskServer(address, family, system)
    except OSError as error:
        raise InputError(
            f"{host}:{port}: cannot listen there ({error.strerror}). Hint: --port 0 "
            "takes a free port; ports below 1024 need root"
        ) from None


def listen_address(host: str, port: int) -> tuple[int, tuple]:
    """(address family, socket address) to listen on, with a warning for an address other
    machines can reach.

    Raises:
        InputError: a host name that does not resolve.
    """
    try:
        family, _, _, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as error:
        raise InputError(
            f"--host {host!r}: no address to listen on ({error.strerror}): expected "
            "127.0.0.1 (the default), localhost or an address of this machine"
        ) from None
    if not is_loopback(address[0]):
        logger.warning(
            "--host %s is not a loopback address: anyone who can reach this machine on port %s "
            "can ask questions (the server has no authentication)",
            host,
            port or "(free)",
        )
    return family, address


def serve(system: AskSystem, host: str, port: int, out: TextIO) -> None:
    """`fid serve`: answers until Ctrl-C; the line "fid serve: listening on <url>" goes to
    `out` once the server listens."""
    with make_server(system, host, port) as server:
        print(f"fid serve: listening on {server.url} (Ctrl-C stops)", file=out, flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            logger.info("stopped (Ctrl-C)")


def is_loopback(host: str) -> bool:
    """Whether a host name or address is this machine's loopback (127.0.0.0/8, ::1,
    localhost and *.localhost, RFC 6761)."""
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        host = host.lower().rstrip(".")
        return host == "localhost" or host.endswith(".localhost")


def _loopback_host(header: str) -> bool:
    """Whether a Host header ("127.0.0.1:8000", "[::1]:8000", "localhost") names loopback."""
    header = header.strip()
    if header.startswith("["):
        name = header[1 : header.find("]")]
    else:
        name = header.rsplit(":", 1)[0] if ":" in header else header
    return is_loopback(name)


def _json(record: dict) -> bytes:
    return json.dumps(record, ensure_ascii=False).encode("utf-8")
