"""Purpose-built upstream servers for the end-to-end tests, all on 127.0.0.1.

In-process (threads), because tests read what they observed:
  RecordingServer   records every byte it receives; answers each request with a canned response
  StallServer       accepts and reads, never answers
  CloseServer       reads the request head, closes without answering
  GarbageServer     reads the request head, answers with bytes that are not HTTP
  ResetServer       answers Content-Length: 1000000, sends 1000 bytes, then resets (RST)
  SlowForeverServer streams a "1 GiB" body slowly, records when its connection went away
  SlowSinkServer    reads request bodies at ~1 MB/s, never answers
  Blackhole         a listener whose accept queue is full, so connects to it hang

As subprocesses (`python3 faultservers.py KIND PORT`), for throughput or isolation:
  upload-sink       reads a request body (Content-Length or chunked) streaming, answers with
                    {"sha256": ..., "bytes": ...}; never holds the body in memory
  httpbin           httpbin on gunicorn (gthread workers) so /stream and /drip really stream
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import select
import socket
import struct
import sys
import threading
import time

from rawhttp import take_through

HOST = "127.0.0.1"


def _port_range() -> tuple[int, int]:
    """20000-30000, or this pytest-xdist worker's own slice of it: a port one worker picked
    (and handed to a server that binds it later) is never picked by another."""
    low, high = 20000, 30000
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not worker.startswith("gw") or count <= 1:
        return low, high
    index = int(worker[2:])
    size = (high - low) // count
    return low + index * size, low + (index + 1) * size - 1


PORT_RANGE = _port_range()
_used_ports: set[int] = set()
_port_lock = threading.Lock()


def port_is_free(port: int) -> bool:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((HOST, port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def pick_port() -> int:
    """A port in PORT_RANGE not bound now and not handed out before in this process."""
    rnd = random.Random()
    with _port_lock:
        for _ in range(500):
            p = rnd.randint(*PORT_RANGE)
            if p in _used_ports:
                continue
            _used_ports.add(p)
            if port_is_free(p):
                return p
    raise RuntimeError(f"no free port found in {PORT_RANGE[0]}-{PORT_RANGE[1]}")


def bind_listener(backlog: int = 128) -> tuple[socket.socket, int]:
    for _ in range(50):
        port = pick_port()
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            s.close()
            continue
        s.listen(backlog)
        return s, port
    raise RuntimeError("could not bind a listener")


# ------------------------------------------------------------------------------------------
# Server-side HTTP reading
# ------------------------------------------------------------------------------------------

class PeerClosed(Exception):
    pass


class Reader:
    """Buffered reads from an accepted socket; optionally records every byte."""

    def __init__(self, sock: socket.socket, record: bytearray | None = None, timeout: float = 30.0):
        self.sock = sock
        self.buf = bytearray()
        self.record = record
        sock.settimeout(timeout)

    def fill(self, n: int = 65536) -> None:
        data = self.sock.recv(n)
        if not data:
            raise PeerClosed()
        if self.record is not None:
            self.record += data
        self.buf += data

    def read_until(self, marker: bytes, limit: int = 1 << 20) -> bytes:
        while True:
            out = take_through(self.buf, marker)
            if out is not None:
                return out
            if len(self.buf) > limit:
                raise ValueError("head too large")
            self.fill()

    def read_head(self) -> tuple[bytes, str, str, list[tuple[str, str]]]:
        raw = self.read_until(b"\r\n\r\n")
        lines = raw[:-4].split(b"\r\n")
        parts = lines[0].decode("latin-1").split(" ")
        method, target = (parts + ["", ""])[:2]
        headers = []
        for line in lines[1:]:
            k, _, v = line.decode("latin-1").partition(":")
            headers.append((k.strip(), v.strip()))
        return raw, method, target, headers

    def _forward(self, size: int, sink) -> int:
        """Pass exactly `size` body bytes to `sink` as they arrive (never all in memory)."""
        left = size
        while left:
            if not self.buf:
                self.fill(min(max(left, 65536), 1 << 20))
            take = min(left, len(self.buf))
            sink(bytes(self.buf[:take]))
            del self.buf[:take]
            left -= take
        return size

    def read_body(self, headers: list[tuple[str, str]], sink) -> tuple[int, bool]:
        """Stream the body into sink(bytes). Returns (bytes, was_chunked)."""
        te = ",".join(v for k, v in headers if k.lower() == "transfer-encoding").lower()
        cls = [v for k, v in headers if k.lower() == "content-length"]
        total = 0
        if "chunked" in te:
            while True:
                line = self.read_until(b"\r\n", limit=4096)
                size = int(line[:-2].split(b";", 1)[0].strip(), 16)
                if size == 0:
                    while self.read_until(b"\r\n", limit=65536) != b"\r\n":
                        pass
                    return total, True
                total += self._forward(size, sink)
                while len(self.buf) < 2:
                    self.fill()
                if self.buf[:2] != b"\r\n":
                    raise ValueError("chunk data not followed by CRLF")
                del self.buf[:2]
        if cls:
            total += self._forward(int(cls[0]), sink)
        return total, False


def header(headers: list[tuple[str, str]], name: str) -> str | None:
    for k, v in headers:
        if k.lower() == name.lower():
            return v
    return None


def simple_response(status: int = 200, body: bytes = b"ok", extra: list[tuple[str, str]] | None = None,
                    reason: str = "OK") -> bytes:
    head = f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
    for k, v in extra or []:
        head += f"{k}: {v}\r\n"
    return head.encode("latin-1") + b"\r\n" + body


# ------------------------------------------------------------------------------------------
# Threaded servers
# ------------------------------------------------------------------------------------------

class ConnRecord:
    def __init__(self, peer):
        self.peer = peer
        self.data = bytearray()
        self.requests: list[dict] = []
        self.opened_at = time.monotonic()
        self.closed_at: float | None = None
        self.note = ""


class ThreadedServer:
    """Accept loop on its own thread; one daemon thread per connection."""

    name = "server"
    backlog = 128

    def __init__(self):
        self.listener, self.port = bind_listener(self.backlog)
        self.listener.settimeout(0.2)
        self.connections: list[ConnRecord] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self._open: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept_loop, name=f"{self.name}-{self.port}", daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def _accept_loop(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, peer = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            rec = ConnRecord(peer)
            with self.lock:
                self.connections.append(rec)
                self._open.append(conn)
            threading.Thread(target=self._run, args=(conn, rec), daemon=True).start()

    def _run(self, conn: socket.socket, rec: ConnRecord) -> None:
        try:
            self.handle(conn, rec)
        except (PeerClosed, OSError, ValueError) as e:
            rec.note = f"{type(e).__name__}: {e}"
        finally:
            rec.closed_at = rec.closed_at or time.monotonic()
            try:
                conn.close()
            except OSError:
                pass

    def handle(self, conn: socket.socket, rec: ConnRecord) -> None:  # pragma: no cover
        raise NotImplementedError

    def received(self) -> bytes:
        with self.lock:
            return b"".join(bytes(c.data) for c in self.connections)

    def connection_count(self) -> int:
        with self.lock:
            return len(self.connections)

    def stop(self) -> None:
        self.stopping.set()
        try:
            self.listener.close()
        except OSError:
            pass
        with self.lock:
            for s in self._open:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                try:
                    s.close()
                except OSError:
                    pass
        self.thread.join(timeout=2)


class RecordingServer(ThreadedServer):
    """Records every byte; answers each complete request with `self.response` (bytes or callable)."""

    name = "recorder"

    def __init__(self, response: bytes | None = None):
        self.response = response if response is not None else simple_response(200, b"recorded")
        super().__init__()

    def handle(self, conn, rec):
        r = Reader(conn, record=rec.data)
        while not self.stopping.is_set():
            try:
                raw, method, target, headers = r.read_head()
            except PeerClosed:
                return
            req = {"raw_head": raw, "method": method, "target": target, "headers": headers,
                   "body": bytearray(), "complete": False}
            with self.lock:
                rec.requests.append(req)
            if (header(headers, "expect") or "").lower() == "100-continue":
                conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            r.read_body(headers, req["body"].extend)
            req["complete"] = True
            resp = self.response(req) if callable(self.response) else self.response
            conn.sendall(resp)
            if b"connection: close" in resp.split(b"\r\n\r\n", 1)[0].lower():
                return

    def requests(self) -> list[dict]:
        with self.lock:
            return [q for c in self.connections for q in c.requests]


class StallServer(ThreadedServer):
    name = "stall"

    def handle(self, conn, rec):
        conn.settimeout(0.5)
        deadline = time.monotonic() + 120
        while not self.stopping.is_set() and time.monotonic() < deadline:
            try:
                d = conn.recv(65536)
            except socket.timeout:
                continue
            if not d:
                return
            rec.data += d


class CloseServer(ThreadedServer):
    """Reads a request head and closes without a response."""

    name = "close"

    def handle(self, conn, rec):
        Reader(conn, record=rec.data).read_head()


class GarbageServer(ThreadedServer):
    name = "garbage"

    def handle(self, conn, rec):
        Reader(conn, record=rec.data).read_head()
        conn.sendall(b"SSH-2.0-OpenSSH_9.2 this is not HTTP\r\n\x00\x01\x02garbage\r\n\r\n")
        time.sleep(0.2)  # server behaviour: holds the connection a moment before closing it


class ResetServer(ThreadedServer):
    """Promises 1,000,000 bytes, sends 1000, then aborts the connection with RST."""

    name = "reset"

    def handle(self, conn, rec):
        Reader(conn, record=rec.data).read_head()
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                     b"Content-Length: 1000000\r\n\r\n" + b"r" * 1000)
        time.sleep(0.3)  # server behaviour: the 1000 bytes go out, a pause, then the RST
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()


class SlowForeverServer(ThreadedServer):
    """Streams a body announced as 1 GiB at ~800 KB/s; records when the peer went away."""

    name = "slow-forever"
    chunk = 16 * 1024
    interval = 0.02
    max_seconds = 120.0

    def handle(self, conn, rec):
        import select
        Reader(conn, record=rec.data).read_head()
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                     b"Content-Length: 1073741824\r\n\r\n")
        conn.setblocking(False)
        payload = b"s" * self.chunk
        sent = 0
        end = time.monotonic() + self.max_seconds
        while not self.stopping.is_set() and time.monotonic() < end:
            rd, wr, _ = select.select([conn], [conn], [], self.interval)
            if rd:
                try:
                    d = conn.recv(65536)
                except (BlockingIOError, InterruptedError):
                    d = b"x"
                except OSError as e:
                    rec.note = f"recv: {e}"
                    break
                if not d:
                    rec.note = "EOF"
                    break
            if wr:
                try:
                    sent += conn.send(payload)
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError as e:
                    rec.note = f"send: {e}"
                    break
            time.sleep(self.interval)  # server behaviour: the paced drip, one chunk per interval
        rec.closed_at = time.monotonic()
        rec.note += f" sent={sent}"


class BannerServer(ThreadedServer):
    """Sends a banner right after accepting, then closes: a server-first protocol."""

    name = "banner"
    banner = b"220 banner from the far side\r\n" * 100

    def handle(self, conn, rec):
        conn.sendall(self.banner)
        time.sleep(0.2)  # server behaviour: the banner, a pause, then the close


class EchoServer(ThreadedServer):
    """Sends back every byte it receives (a raw TCP echo), until the peer half-closes."""

    name = "echo"

    def handle(self, conn, rec):
        conn.settimeout(30)
        while True:
            d = conn.recv(1 << 18)
            if not d:
                conn.shutdown(socket.SHUT_WR)
                return
            conn.sendall(d)


class SlowSinkServer(ThreadedServer):
    """Reads request bodies at ~1 MB/s through a small receive buffer; never answers."""

    name = "slow-sink"

    def __init__(self):
        super().__init__()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        self.bytes_read = 0

    def handle(self, conn, rec):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        r = Reader(conn)
        r.read_head()
        self.bytes_read += len(r.buf)
        r.buf.clear()
        conn.settimeout(1.0)
        end = time.monotonic() + 60
        while not self.stopping.is_set() and time.monotonic() < end:
            budget = 100 * 1024
            while budget > 0:
                try:
                    d = conn.recv(min(budget, 65536))
                except socket.timeout:
                    break
                if not d:
                    rec.closed_at = time.monotonic()
                    return
                self.bytes_read += len(d)
                budget -= len(d)
            time.sleep(0.1)  # server behaviour: the throttled reader, ~100 KiB per 0.1 s


class Blackhole:
    """A listener with a full accept queue: new connects to it hang (SYNs are dropped)."""

    def __init__(self):
        self.listener, self.port = bind_listener(backlog=0)
        self.fillers: list[socket.socket] = []
        for _ in range(8):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.connect((HOST, self.port))
            except (BlockingIOError, OSError):
                pass
            self.fillers.append(s)
        # A filler whose connect completed is in the accept queue, and backlog 0 holds one:
        # the queue is full once any filler is writable.
        select.select([], self.fillers, [], 5.0)

    def connect_hangs(self, timeout: float = 1.0) -> bool:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect((HOST, self.port))
            return False
        except socket.timeout:
            return True
        except OSError:
            return False
        finally:
            s.close()

    def stop(self):
        for s in self.fillers:
            s.close()
        self.listener.close()


# ------------------------------------------------------------------------------------------
# Subprocess servers
# ------------------------------------------------------------------------------------------

def serve_upload_sink(port: int) -> None:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((HOST, port))
    srv.listen(128)

    def handle(conn: socket.socket) -> None:
        try:
            r = Reader(conn, timeout=120)
            while True:
                try:
                    _, method, target, headers = r.read_head()
                except PeerClosed:
                    return
                if (header(headers, "expect") or "").lower() == "100-continue":
                    conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                h = hashlib.sha256()
                n, was_chunked = r.read_body(headers, h.update)
                body = json.dumps({"sha256": h.hexdigest(), "bytes": n, "chunked": was_chunked,
                                   "method": method, "target": target,
                                   "content_length": header(headers, "content-length"),
                                   "transfer_encoding": header(headers, "transfer-encoding")}).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        except (OSError, ValueError, PeerClosed) as e:
            print(f"upload-sink: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        finally:
            conn.close()

    print("ready", flush=True)
    while True:
        c, _ = srv.accept()
        threading.Thread(target=handle, args=(c,), daemon=True).start()


def serve_httpbin(port: int) -> None:
    """httpbin as it is usually deployed: gunicorn with threaded workers (httpbin accepts
    chunked request bodies only under gunicorn). Falls back to werkzeug's threaded server."""
    import httpbin

    try:
        from gunicorn.app.base import BaseApplication
    except ImportError:
        BaseApplication = None

    if BaseApplication is None:
        import logging

        from werkzeug.serving import WSGIRequestHandler, make_server

        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        WSGIRequestHandler.protocol_version = "HTTP/1.1"
        srv = make_server(HOST, port, httpbin.app, threaded=True)
        print("ready (werkzeug)", flush=True)
        srv.serve_forever()
        return

    class Httpbin(BaseApplication):
        def load_config(self):
            for k, v in {"bind": f"{HOST}:{port}", "workers": 1, "worker_class": "gthread",
                         "threads": 32, "keepalive": 30, "timeout": 300, "loglevel": "warning",
                         "accesslog": None}.items():
                self.cfg.set(k, v)

        def load(self):
            return httpbin.app

    print("ready (gunicorn)", flush=True)
    Httpbin().run()


if __name__ == "__main__":
    kind, port_s = sys.argv[1], sys.argv[2]
    {"upload-sink": serve_upload_sink, "httpbin": serve_httpbin}[kind](int(port_s))
