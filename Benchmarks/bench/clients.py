"""Small HTTP/1.1 clients of the benchmark, all bounded in time: kept-alive idle clients, and
sequential requests on one connection (the callgrind client)."""

from __future__ import annotations

import selectors
import socket
import time
from dataclasses import dataclass, field


def request_bytes(url: str, host: str, headers: dict[str, str] | None = None) -> bytes:
    """A GET with the given request target (absolute-form through a proxy), Host and any other
    header fields (the scenario's `headers`)."""
    fields = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    return f"GET {url} HTTP/1.1\r\nHost: {host}\r\n{fields}\r\n".encode()


class Connection:
    """One kept-alive HTTP/1.1 connection; responses are read by Content-Length or chunks."""

    def __init__(self, port: int, timeout: float):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def _fill(self):
        data = self.sock.recv(65536)
        if not data:
            raise EOFError("connection closed by the server")
        self.buf += data

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            self._fill()
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def response(self) -> tuple[int, int]:
        """Reads one response; returns (status, body length)."""
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        length, chunked = None, False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        if chunked:
            body = 0
            while (size := int(self._line().split(b";")[0], 16)) != 0:
                body += len(self._take(size))
                self._take(2)
            while self._line() != b"":
                pass
            return status, body
        if length is None:
            raise ValueError("response without a length: not kept alive")
        return status, len(self._take(length))

    def close(self):
        self.sock.close()


def sequential(port: int, count: int, url: str, host: str, body: int, max_seconds: float,
               headers: dict[str, str] | None = None) -> str | None:
    """`count` GETs (with `headers`) one after the other on one kept-alive connection, each checked
    for a 200 with a `body`-byte body. None on success, else what went wrong."""
    deadline = time.monotonic() + max_seconds
    req = request_bytes(url, host, headers)
    conn = Connection(port, 60)   # under valgrind one response can take a while
    try:
        for i in range(count):
            if time.monotonic() > deadline:
                return f"out of time after {i} requests"
            conn.sock.sendall(req)
            status, got = conn.response()
            if status != 200 or got != body:
                return f"request {i + 1}: HTTP {status}, {got} bytes"
    except (OSError, ValueError, EOFError) as e:
        return f"request failed: {e}"
    finally:
        conn.close()
    return None


@dataclass
class IdleClients:
    """`count` kept-alive connections, each of which sent one GET and read its response, now idle.
    They are opened in batches of `batch` (connect and send all of a batch, then read all of its
    responses): a batch as large as `count` puts that many requests in flight at once. `sources`
    127.0.0.x addresses are used in turn, so that 10,000 clients do not run out of ephemeral ports."""

    port: int
    count: int
    url: str
    host: str
    batch: int
    sources: int = 1
    max_seconds: float = 120
    held: list[socket.socket] = field(default_factory=list)
    failed: int = 0
    first_error: str = ""

    def open(self):
        deadline = time.monotonic() + self.max_seconds
        req = request_bytes(self.url, self.host)
        for start in range(0, self.count, self.batch):
            batch = []
            for i in range(start, min(self.count, start + self.batch)):
                if time.monotonic() > deadline:
                    self._fail("out of time")
                    continue
                s = None
                try:
                    s = socket.socket()
                    s.bind((f"127.0.0.{1 + i % self.sources}", 0))
                    s.settimeout(10)
                    s.connect(("127.0.0.1", self.port))
                    s.sendall(req)
                    s.setblocking(False)
                    batch.append(s)
                except OSError as e:
                    if s is not None:
                        s.close()
                    self._fail(f"connect/send: {e}")
            self._read_responses(batch, deadline)

    def _fail(self, why: str):
        self.failed += 1
        self.first_error = self.first_error or why

    def _read_responses(self, batch: list[socket.socket], deadline: float):
        sel = selectors.DefaultSelector()
        bufs = {s: b"" for s in batch}
        for s in batch:
            sel.register(s, selectors.EVENT_READ)
        pending = set(batch)
        while pending and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=1):
                s = key.fileobj
                try:
                    data = s.recv(65536)
                except OSError as e:
                    data, why = b"", f"read: {e}"
                else:
                    why = "closed before the response"
                if not data:
                    self._fail(why)
                    pending.discard(s)
                    sel.unregister(s)
                    s.close()
                    continue
                bufs[s] += data
                head, sep, body = bufs[s].partition(b"\r\n\r\n")
                if not sep or len(body) < _content_length(head):
                    continue
                pending.discard(s)
                sel.unregister(s)
                status = int(head.split()[1])
                if status == 200:
                    self.held.append(s)
                else:
                    self._fail(f"HTTP {status}")
                    s.close()
        for s in pending:
            self._fail("no response in time")
            sel.unregister(s)
            s.close()
        sel.close()

    def still_open(self) -> tuple[int, int]:
        """(open, sampled): about 100 of the held connections peeked at; a closed one reads EOF."""
        sample = self.held[:: max(1, len(self.held) // 100)]
        alive = 0
        for s in sample:
            try:
                alive += 1 if s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b"" else 0
            except BlockingIOError:
                alive += 1
            except OSError:
                pass
        return alive, len(sample)

    def close(self):
        for s in self.held:
            s.close()
        self.held = []


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0
