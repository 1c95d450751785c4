"""Purpose-built upstreams for the retry / validation / credentials / OAuth 2 tests
(docs/configuration.md: "Retries", "Validation", "HTTP authentication", "OAuth 2").

All listen on 127.0.0.1 only, run in-process on threads (one per connection), and record what
they received with monotonic timestamps, so tests can measure the delays Sluice left between
tries and check that a replayed request body is byte-exact.

  FaultUpstream   behaviour scripted per path: a list of actions consumed one per try, then a
                  fallback action (or a callable deciding per try). Actions:
                    Reply(status, body, headers)   a normal response (X-Try: n is always added)
                    RetryAfterDate(status, ahead)  a response whose Retry-After is an HTTP-date
                    Reset()                        read the request, then RST (SO_LINGER 0) before
                                                   any response byte
                    Close()                        read the request, then close (FIN) silently
                    Stall(seconds)                 read the request, never answer; records when
                                                   the peer gave up
                    Partial(total, send)           a head promising `total` body bytes, `send` of
                                                   them, then RST
                    PartialChunked(chunks)         a chunked head, these chunks, then RST (no last chunk)
                    PartialClose(send)             a close-delimited head, `send` bytes, then RST
                    StallMidBody(framing, send)    a head (Content-Length or chunked) and `send` body
                                                   bytes, then silence; records when the peer gave up
                    Chunked(body)                  a complete chunked response
                    NoReadBody()                   reads the head only, never the request body;
                                                   records when the peer went away (runs before
                                                   the body is read: `reads_body = False`)
  TokenServer     an OAuth 2 token endpoint (POST /token): client_credentials and refresh_token
                  grants, client authentication by HTTP Basic or by body fields, a configurable
                  expires_in and answer delay; can be switched to fail (500) or killed (its port
                  then refuses connections). Counts grants and the most concurrent fetches.
  BearerUpstream  requires `Authorization: Bearer <the token server's current token>`; answers
                  401 otherwise, or for tokens it was told to reject (or for every token).
"""

from __future__ import annotations

import base64
import hashlib
import json
import select
import socket
import struct
import time
import urllib.parse
from dataclasses import dataclass, field
from email.utils import formatdate

from faultservers import HOST, PeerClosed, Reader, ThreadedServer, header
from support import wait_until

# Nothing here may wait forever: each connection thread gives up after this long.
CONN_IDLE_TIMEOUT = 30.0
STALL_MAX = 30.0


def rst_close(conn: socket.socket) -> None:
    """Abort the connection: SO_LINGER {on, 0} makes close() send RST."""
    try:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        conn.close()
    except OSError:
        pass


def response_bytes(status: int, body: bytes, headers: list[tuple[str, str]] | None = None,
                   reason: str | None = None, content_type: str | None = "text/plain") -> bytes:
    reason = reason if reason is not None else REASONS.get(status, "Status")
    head = f"HTTP/1.1 {status} {reason}\r\n"
    names = {k.lower() for k, _ in headers or []}
    if content_type and "content-type" not in names:
        head += f"Content-Type: {content_type}\r\n"
    for k, v in headers or []:
        head += f"{k}: {v}\r\n"
    if "content-length" not in names:
        head += f"Content-Length: {len(body)}\r\n"
    return head.encode("latin-1") + b"\r\n" + body


REASONS = {200: "OK", 201: "Created", 204: "No Content", 400: "Bad Request", 401: "Unauthorized",
           403: "Forbidden", 404: "Not Found", 408: "Request Timeout", 429: "Too Many Requests",
           500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable",
           504: "Gateway Timeout"}


# ------------------------------------------------------------------------------------------
# What a FaultUpstream saw
# ------------------------------------------------------------------------------------------

@dataclass
class Try:
    """One request as the upstream received it."""
    n: int                      # 1-based try number for its path
    seq: int                    # 1-based arrival order over the whole server
    conn: int                   # index of the TCP connection it came on
    method: str
    target: str
    path: str
    headers: list[tuple[str, str]]
    raw_head: bytes
    t_arrival: float            # monotonic: first byte of the request
    t_head: float = 0.0         # monotonic: head complete
    t_body: float = 0.0         # monotonic: body complete
    t_done: float = 0.0         # monotonic: response sent / connection reset / peer gave up
    body: bytes = b""
    body_complete: bool = False
    action: str = ""
    expected_delay: float | None = None   # RetryAfterDate: seconds from sending to the date
    note: str = ""

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.body).hexdigest()

    def header(self, name: str) -> str | None:
        return header(self.headers, name)


# ------------------------------------------------------------------------------------------
# Actions
# ------------------------------------------------------------------------------------------

class Action:
    name = "action"
    keep_alive = False
    # False: run as soon as the head is in, without reading the request body first.
    reads_body = True

    def run(self, srv: "FaultUpstream", conn: socket.socket, reader: Reader, t: Try) -> None:
        raise NotImplementedError


class Reply(Action):
    """A complete response. `body` may be bytes or a callable(try) -> bytes; `X-Try: n` is added."""

    name = "reply"
    keep_alive = True

    def __init__(self, status: int = 200, body=None, headers: list[tuple[str, str]] | None = None,
                 reason: str | None = None, content_type: str | None = "text/plain",
                 close: bool = False):
        self.status = status
        self.body = body
        self.headers = list(headers or [])
        self.reason = reason
        self.content_type = content_type
        self.close = close
        self.keep_alive = not close

    def body_for(self, t: Try) -> bytes:
        if callable(self.body):
            return self.body(t)
        if self.body is None:
            return f"status {self.status} try {t.n} path {t.path}".encode()
        return self.body

    def headers_for(self, t: Try) -> list[tuple[str, str]]:
        hs = [("X-Try", str(t.n))] + self.headers
        if self.close:
            hs.append(("Connection", "close"))
        return hs

    def run(self, srv, conn, reader, t):
        wire = self.wire(t, self.body_for(t), self.headers_for(t))
        # Taken before the bytes leave: a retry cannot start before Sluice reads them, while
        # this thread, descheduled after the send on a loaded machine, would take it late and
        # shorten the measured gap (a 41 ms shortfall failed test_jitter_bounds once).
        t.t_done = time.monotonic()
        t.action = f"reply {self.status}"
        conn.sendall(wire)

    def wire(self, t: Try, body: bytes, headers: list[tuple[str, str]]) -> bytes:
        """The response bytes; for HEAD, the head only (Content-Length still the body's)."""
        if t.method == "HEAD":
            headers = headers + [("Content-Length", str(len(body)))]
            return response_bytes(self.status, b"", headers, self.reason, self.content_type)
        return response_bytes(self.status, body, headers, self.reason, self.content_type)

    def __repr__(self):
        return f"Reply({self.status})"


class RetryAfterDate(Reply):
    """A response with `Retry-After: <HTTP-date>` `ahead` whole seconds after the current second.

    It first waits until just past a second boundary (so a Sluice that works in whole seconds
    and one that works in milliseconds agree within ~0.1 s), then records the exact remaining
    time to that date in `try.expected_delay`. No `Date` header is sent.
    """

    def __init__(self, status: int = 503, ahead: int = 2, **kw):
        super().__init__(status, **kw)
        self.ahead = ahead

    def run(self, srv, conn, reader, t):
        for _ in range(5):  # bounded: at most ~1 s of waiting in all
            frac = time.time() % 1.0
            if 0.02 <= frac <= 0.08:
                break
            time.sleep((1.03 - frac) % 1.0)  # time passing: the wall clock must reach the next second
        now = time.time()
        when = int(now) + self.ahead
        date = formatdate(when, usegmt=True)
        hs = self.headers_for(t) + [("Retry-After", date)]
        # Recorded before the send: a client that reads the reply may look at the try at once.
        t.expected_delay = when - time.time()
        t.action = f"reply {self.status} retry-after {date}"
        wire = self.wire(t, self.body_for(t), hs)
        t.t_done = time.monotonic()  # before the send, as in Reply.run
        conn.sendall(wire)


class Reset(Action):
    """Read the whole request, then abort with RST before any response byte."""

    name = "reset"

    def run(self, srv, conn, reader, t):
        t.t_done = time.monotonic()
        t.action = "reset"
        rst_close(conn)


class Close(Action):
    """Read the whole request, then close gracefully without a response."""

    name = "close"

    def run(self, srv, conn, reader, t):
        t.t_done = time.monotonic()
        t.action = "close"
        try:
            conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        conn.close()


class Stall(Action):
    """Never answer. `t_done` becomes the moment the peer closed (or reset) the connection."""

    name = "stall"

    def __init__(self, seconds: float = STALL_MAX):
        self.seconds = min(seconds, STALL_MAX)

    def run(self, srv, conn, reader, t):
        t.action = "stall"
        conn.settimeout(0.02)
        end = time.monotonic() + self.seconds
        while not srv.stopping.is_set() and time.monotonic() < end:
            try:
                d = conn.recv(65536)
            except socket.timeout:
                continue
            except OSError as e:
                t.note = f"peer reset: {e}"
                break
            if not d:
                t.note = "peer closed"
                break
        t.t_done = time.monotonic()


class Partial(Action):
    """200 with Content-Length `total`, then `send` bytes of 'P', then RST."""

    name = "partial"

    def __init__(self, total: int = 100_000, send: int = 1000, pause: float = 0.2):
        self.total, self.send, self.pause = total, send, pause

    def run(self, srv, conn, reader, t):
        conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nX-Try: {t.n}\r\n"
                     f"Content-Length: {self.total}\r\n\r\n".encode() + b"P" * self.send)
        time.sleep(self.pause)  # server behaviour: the bytes go out, a pause, then the RST
        t.t_done = time.monotonic()
        t.action = "partial"
        rst_close(conn)


def wait_peer_gone(srv: "FaultUpstream", conn: socket.socket, t: Try, seconds: float, read: bool = True) -> None:
    """Until the peer closes or resets (or `seconds` pass): `t.t_done` is that moment and
    `t.note` says how. With read=False nothing is read: the peer's FIN or RST is seen by
    poll (POLLRDHUP / POLLHUP / POLLERR) behind whatever bytes it sent and we left unread."""
    end = time.monotonic() + min(seconds, STALL_MAX)
    if read:
        conn.settimeout(0.02)
        while not srv.stopping.is_set() and time.monotonic() < end:
            try:
                d = conn.recv(65536)
            except socket.timeout:
                continue
            except OSError as e:
                t.note = f"peer reset: {e}"
                break
            if not d:
                t.note = "peer closed"
                break
    else:
        p = select.poll()
        p.register(conn, select.POLLRDHUP | select.POLLHUP | select.POLLERR)
        while not srv.stopping.is_set() and time.monotonic() < end:
            ev = p.poll(20)
            if ev:
                flags = ev[0][1]
                t.note = "peer reset" if flags & select.POLLERR else "peer closed"
                break
    t.t_done = time.monotonic()


class PartialChunked(Action):
    """A chunked 200, these chunks (each sent as one chunk), a pause, then RST: the last
    chunk never comes."""

    name = "partial-chunked"

    def __init__(self, chunks: list[bytes], pause: float = 0.2):
        self.chunks, self.pause = chunks, pause

    def run(self, srv, conn, reader, t):
        out = (f"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nX-Try: {t.n}\r\n"
               f"Transfer-Encoding: chunked\r\n\r\n").encode()
        for c in self.chunks:
            out += f"{len(c):x}\r\n".encode() + c + b"\r\n"
        conn.sendall(out)
        time.sleep(self.pause)  # server behaviour: the chunks go out, a pause, then the RST
        t.t_done = time.monotonic()
        t.action = "partial-chunked"
        rst_close(conn)


class PartialClose(Action):
    """A close-delimited 200 (no Content-Length, no Transfer-Encoding), `send` bytes of 'Q',
    a pause, then RST: only a FIN would have ended this body."""

    name = "partial-close"

    def __init__(self, send: int = 1000, pause: float = 0.2):
        self.send, self.pause = send, pause

    def run(self, srv, conn, reader, t):
        conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nX-Try: {t.n}\r\n"
                     f"Connection: close\r\n\r\n".encode() + b"Q" * self.send)
        time.sleep(self.pause)  # server behaviour: the bytes go out, a pause, then the RST
        t.t_done = time.monotonic()
        t.action = "partial-close"
        rst_close(conn)


class StallMidBody(Action):
    """A 200 head (`framing` "length": Content-Length `total`; "chunked"), `send` body bytes of
    'S' (one chunk when chunked), then nothing more. `t_done` is when the peer gave up."""

    name = "stall-mid-body"

    def __init__(self, framing: str = "length", total: int = 100_000, send: int = 1000,
                 seconds: float = STALL_MAX):
        self.framing, self.total, self.send, self.seconds = framing, total, send, seconds

    def run(self, srv, conn, reader, t):
        t.action = f"stall-mid-body {self.framing}"
        head = f"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nX-Try: {t.n}\r\n"
        if self.framing == "chunked":
            out = (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + f"{self.send:x}\r\n".encode() \
                + b"S" * self.send + b"\r\n"
        else:
            out = (head + f"Content-Length: {self.total}\r\n\r\n").encode() + b"S" * self.send
        conn.sendall(out)
        wait_peer_gone(srv, conn, t, self.seconds)


class Chunked(Reply):
    """A complete chunked 200 whose body (bytes or callable(try)) goes in `chunk`-byte chunks."""

    def __init__(self, body=None, chunk: int = 4096, headers: list[tuple[str, str]] | None = None):
        super().__init__(200, body=body, headers=headers)
        self.chunk = chunk

    def run(self, srv, conn, reader, t):
        body = self.body_for(t)
        head = f"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nX-Try: {t.n}\r\n"
        for k, v in self.headers:
            head += f"{k}: {v}\r\n"
        out = bytearray((head + "Transfer-Encoding: chunked\r\n\r\n").encode())
        if t.method != "HEAD":
            for i in range(0, len(body), self.chunk):
                part = body[i:i + self.chunk]
                out += f"{len(part):x}\r\n".encode() + part + b"\r\n"
            out += b"0\r\n\r\n"
        conn.sendall(bytes(out))
        t.t_done = time.monotonic()
        t.action = "reply chunked"

    def __repr__(self):
        return "Chunked()"


class NoReadBody(Action):
    """Reads the request head and never the body (no answer either): the sender's upload
    stalls against full buffers. `t_done` is when the peer closed or reset the connection."""

    name = "no-read-body"
    reads_body = False

    def __init__(self, seconds: float = STALL_MAX):
        self.seconds = seconds

    def run(self, srv, conn, reader, t):
        t.action = "no-read-body"
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        wait_peer_gone(srv, conn, t, self.seconds, read=False)


# ------------------------------------------------------------------------------------------
# FaultUpstream
# ------------------------------------------------------------------------------------------

class _Script:
    def __init__(self, steps, then):
        self.steps = list(steps)
        self.then = then

    def step(self, t: Try):
        """The step for this try as scripted (a callable is not called)."""
        return self.steps[t.n - 1] if t.n <= len(self.steps) else self.then

    def action(self, t: Try) -> Action:
        a = self.step(t)
        if callable(a) and not isinstance(a, Action):
            a = a(t)
        return a


class FaultUpstream(ThreadedServer):
    """Scripted per path. `script(path, steps, then)`: try n of that path gets steps[n-1], later
    tries get `then`; a step (or `then`) may be a callable(try) -> Action. Unscripted paths get
    `self.default`. Records every request (`tries(path)`)."""

    name = "fault-upstream"
    backlog = 1024

    def __init__(self, default: Action | None = None):
        self.default = default or Reply(200)
        self.scripts: dict[str, _Script] = {}
        self._tries: list[Try] = []
        self._counts: dict[str, int] = {}
        self._conn_seq = 0
        super().__init__()

    # -- scripting -----------------------------------------------------------------------
    def script(self, path: str, steps=(), then: Action | None = None) -> str:
        with self.lock:
            self.scripts[path] = _Script(steps, then or Reply(200))
        return self.url + path

    def fail_then_ok(self, path: str, n: int, status: int = 503, ok: Action | None = None,
                     headers: list[tuple[str, str]] | None = None) -> str:
        return self.script(path, [Reply(status, headers=headers) for _ in range(n)], ok or Reply(200))

    def always(self, path: str, action: Action) -> str:
        return self.script(path, [], action)

    # -- records ------------------------------------------------------------------------
    def tries(self, path: str | None = None) -> list[Try]:
        with self.lock:
            return [t for t in self._tries if path is None or t.path == path]

    def count(self, path: str | None = None) -> int:
        return len(self.tries(path))

    def wait_tries(self, path: str, n: int, timeout: float = 5.0) -> list[Try]:
        """The tries of path, once n of them arrived and were answered (or after timeout)."""
        def done() -> bool:
            ts = self.tries(path)
            return len(ts) >= n and all(t.t_done for t in ts[:n])

        wait_until(done, timeout, interval=0.02)
        return self.tries(path)

    # -- serving ------------------------------------------------------------------------
    def handle(self, conn, rec):
        with self.lock:
            self._conn_seq += 1
            conn_no = self._conn_seq
        r = Reader(conn, record=None, timeout=CONN_IDLE_TIMEOUT)
        while not self.stopping.is_set():
            if not r.buf:
                try:
                    r.fill()
                except (PeerClosed, socket.timeout):
                    return
            t_arrival = time.monotonic()
            raw, method, target, headers = r.read_head()
            t_head = time.monotonic()
            path = urllib.parse.urlsplit(target).path if "://" in target else target.split("?", 1)[0]
            with self.lock:
                n = self._counts.get(path, 0) + 1
                self._counts[path] = n
                t = Try(n=n, seq=len(self._tries) + 1, conn=conn_no, method=method, target=target,
                        path=path, headers=headers, raw_head=raw, t_arrival=t_arrival, t_head=t_head)
                self._tries.append(t)
                script = self.scripts.get(path)
            early = script.step(t) if script else self.default
            if isinstance(early, Action) and not early.reads_body:
                early.run(self, conn, r, t)
                if not early.keep_alive:
                    return
                continue
            if (header(headers, "expect") or "").lower() == "100-continue":
                conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            body = bytearray()
            try:
                r.read_body(headers, body.extend)
                t.body_complete = True
            finally:
                t.body = bytes(body)
                t.t_body = time.monotonic()
            action = script.action(t) if script else self.default
            if callable(action) and not isinstance(action, Action):
                action = action(t)
            action.run(self, conn, r, t)
            if not action.keep_alive:
                return


class NotTLSServer(ThreadedServer):
    """For `https://` URLs: answers a TLS ClientHello with a plain HTTP error and closes, so the
    client's handshake fails (libcurl 35, SSL_CONNECT_ERROR). One connection = one try."""

    name = "not-tls"

    def handle(self, conn, rec):
        conn.settimeout(5)
        rec.data += conn.recv(4096)
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        rec.closed_at = time.monotonic()


# ------------------------------------------------------------------------------------------
# OAuth 2
# ------------------------------------------------------------------------------------------

def whole_requests(server: ThreadedServer, conn):
    """The requests a keep-alive connection carries, as (method, target, headers, body),
    until the peer closes, stays idle for CONN_IDLE_TIMEOUT, or the server stops."""
    r = Reader(conn, timeout=CONN_IDLE_TIMEOUT)
    while not server.stopping.is_set():
        try:
            _, method, target, headers = r.read_head()
        except (PeerClosed, socket.timeout):
            return
        body = bytearray()
        r.read_body(headers, body.extend)
        yield method, target, headers, bytes(body)


@dataclass
class TokenRequest:
    t: float
    method: str
    path: str
    headers: list[tuple[str, str]]
    form: dict[str, str]
    raw_body: bytes
    auth_mode: str              # "basic", "body", "both" or "none"
    basic_id: str | None = None
    basic_secret: str | None = None
    status: int = 0
    token: str | None = None


class TokenServer(ThreadedServer):
    """POST /token (application/x-www-form-urlencoded). Accepts the configured client via HTTP
    Basic or body fields (`require_auth` may insist on one), grant_type client_credentials, or
    refresh_token with `refresh_token` equal to `self.refresh_token`. Issues tok-<n>-<tag>.

    mode: "ok" | "fail" (500 with a JSON error) | "bad" (200 with a body that is not a token)."""

    name = "token-server"
    backlog = 1024

    def __init__(self, client_id: str = "sluice", client_secret: str = "cs", expires_in: int | None = 3600,
                 delay: float = 0.0, refresh_token: str | None = None, issue_refresh_token: bool = False,
                 require_auth: str | None = None, rotate_refresh_token: bool = False):
        import secrets as pysecrets
        self.tag = pysecrets.token_hex(6)
        self.client_id = client_id
        self.client_secret = client_secret
        self.expires_in = expires_in
        self.delay = delay
        self.refresh_token = refresh_token
        self.issue_refresh_token = issue_refresh_token
        self.require_auth = require_auth
        self.rotate_refresh_token = rotate_refresh_token   # each grant issues a new refresh token, the old dies
        self.refresh_tokens: list[str] = [refresh_token] if refresh_token else []
        self.mode = "ok"
        self.requests: list[TokenRequest] = []
        self.issued: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.dead = False
        super().__init__()

    @property
    def token_url(self) -> str:
        # `localhost` (127.0.0.1 in /etc/hosts) keeps the token endpoint's host apart from the
        # 127.0.0.1 upstreams, so the oauth2 adapter never applies to its own token fetch.
        return f"http://localhost:{self.port}/token"

    def token(self, n: int) -> str:
        return f"tok-{n}-{self.tag}"

    @property
    def current(self) -> str | None:
        with self.lock:
            return self.issued[-1] if self.issued else None

    def grants(self) -> int:
        with self.lock:
            return len(self.issued)

    def all_requests(self) -> list[TokenRequest]:
        with self.lock:
            return list(self.requests)

    def kill(self) -> None:
        """Make the endpoint dead: the port refuses connections, open connections are reset."""
        self.dead = True
        self.stop()

    def handle(self, conn, rec):
        for method, target, headers, body in whole_requests(self, conn):
            with self.lock:
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                resp = self._answer(method, target, headers, body)
            finally:
                with self.lock:
                    self.in_flight -= 1
            conn.sendall(resp)

    def _answer(self, method, target, headers, body) -> bytes:
        form = {k: v[0] for k, v in urllib.parse.parse_qs(body.decode("latin-1"), keep_blank_values=True).items()}
        auth = header(headers, "authorization") or ""
        basic_id = basic_secret = None
        if auth.lower().startswith("basic "):
            try:
                dec = base64.b64decode(auth.split(None, 1)[1]).decode()
                basic_id, _, basic_secret = dec.partition(":")
                basic_id, basic_secret = urllib.parse.unquote(basic_id), urllib.parse.unquote(basic_secret)
            except ValueError:
                basic_id = basic_secret = None
        in_body = "client_secret" in form
        mode = "both" if (basic_id is not None and in_body) else "basic" if basic_id is not None \
            else "body" if in_body else "none"
        req = TokenRequest(t=time.monotonic(), method=method, path=target, headers=headers, form=form,
                           raw_body=body, auth_mode=mode, basic_id=basic_id, basic_secret=basic_secret)
        with self.lock:
            self.requests.append(req)
        if self.delay:
            time.sleep(self.delay)  # server behaviour: a slow token endpoint

        def js(status, obj):
            req.status = status
            return response_bytes(status, json.dumps(obj).encode(), [("Cache-Control", "no-store")],
                                  content_type="application/json")

        if self.mode == "fail":
            return js(500, {"error": "server_error", "error_description": "token endpoint switched to fail"})
        if method != "POST" or urllib.parse.urlsplit(target).path.rsplit("/", 1)[-1] != "token":
            return js(404 if method == "POST" else 405, {"error": "invalid_request"})
        ok_basic = basic_id == self.client_id and basic_secret == self.client_secret
        ok_body = form.get("client_id") == self.client_id and form.get("client_secret") == self.client_secret
        if self.require_auth == "basic":
            ok = ok_basic
        elif self.require_auth == "body":
            ok = ok_body
        else:
            ok = ok_basic or ok_body
        if not ok:
            return js(401, {"error": "invalid_client"})
        gt = form.get("grant_type")
        if gt == "refresh_token":
            if self.refresh_token is None or form.get("refresh_token") != self.refresh_token:
                return js(400, {"error": "invalid_grant"})
        elif gt != "client_credentials":
            return js(400, {"error": "unsupported_grant_type"})
        if self.mode == "bad":
            return js(200, {"nothing": "here"})
        with self.lock:
            tok = self.token(len(self.issued) + 1)
            self.issued.append(tok)
        req.token = tok
        out = {"access_token": tok, "token_type": "Bearer"}
        if self.expires_in is not None:
            out["expires_in"] = self.expires_in
        if self.rotate_refresh_token:
            with self.lock:
                self.refresh_token = f"rt-{len(self.issued)}-{self.tag}"
                self.refresh_tokens.append(self.refresh_token)
            out["refresh_token"] = self.refresh_token
        elif self.issue_refresh_token and self.refresh_token:
            out["refresh_token"] = self.refresh_token
        return js(200, out)


@dataclass
class BearerSeen:
    t: float
    method: str
    path: str
    token: str | None
    accepted: bool
    headers: list[tuple[str, str]] = field(default_factory=list)
    body_sha256: str = ""


class BearerUpstream(ThreadedServer):
    """Accepts `Authorization: Bearer <token>` only for the token server's current token (or,
    with strict=False, any token it issued); tokens in `reject` (or every token, with
    reject_all) get 401 too. 200 answers are JSON {"ok": true, "token": ..., "path": ...}."""

    name = "bearer-upstream"
    backlog = 1024

    def __init__(self, tokens: TokenServer, strict: bool = True, delay: float = 0.0):
        self.tokens = tokens
        self.strict = strict
        self.delay = delay
        self.reject: set[str] = set()
        self.reject_all = False
        self.seen: list[BearerSeen] = []
        super().__init__()

    def requests(self) -> list[BearerSeen]:
        with self.lock:
            return list(self.seen)

    def handle(self, conn, rec):
        for method, target, headers, body in whole_requests(self, conn):
            auth = header(headers, "authorization") or ""
            tok = auth.split(None, 1)[1].strip() if auth.lower().startswith("bearer ") and " " in auth else None
            with self.tokens.lock:
                issued = list(self.tokens.issued)
            valid = tok is not None and (tok == (issued[-1] if issued else None) if self.strict else tok in issued)
            accepted = valid and not self.reject_all and tok not in self.reject
            path = target.split("://", 1)[-1]
            path = "/" + path.split("/", 1)[1] if "/" in path else "/"
            with self.lock:
                self.seen.append(BearerSeen(time.monotonic(), method, path.split("?", 1)[0], tok, accepted,
                                            headers, hashlib.sha256(body).hexdigest()))
            if self.delay:
                time.sleep(self.delay)  # server behaviour: a slow resource server
            if accepted:
                b = json.dumps({"ok": True, "token": tok, "path": path}).encode()
                conn.sendall(response_bytes(200, b, content_type="application/json"))
            else:
                b = b'{"error": "invalid_token"}'
                conn.sendall(response_bytes(401, b, [("WWW-Authenticate", 'Bearer error="invalid_token"')],
                                            content_type="application/json"))


__all__ = ["HOST", "FaultUpstream", "Reply", "RetryAfterDate", "Reset", "Close", "Stall", "Partial",
           "PartialChunked", "PartialClose", "StallMidBody", "Chunked", "NoReadBody", "wait_peer_gone",
           "Try", "NotTLSServer", "TokenServer", "BearerUpstream", "TokenRequest", "BearerSeen", "response_bytes", "rst_close"]
