"""A tiny, strict HTTP/1.1 client over a raw socket, for tests that need exact bytes.

It never hides what the proxy did: interim (1xx) responses, framing (chunked, length, close),
truncation and connection closure are all reported, and every read has a deadline.
"""

from __future__ import annotations

import re
import socket
import time
from dataclasses import dataclass, field

DEFAULT_TIMEOUT = 10.0


class ProtocolError(Exception):
    """The peer sent something that is not HTTP/1.1."""


class Truncated(Exception):
    """The connection ended before the message did."""


def take_through(buf: bytearray, marker: bytes) -> bytes | None:
    """Removes and returns buf's bytes up to and including the first marker; None if absent."""
    i = buf.find(marker)
    if i < 0:
        return None
    out = bytes(buf[: i + len(marker)])
    del buf[: i + len(marker)]
    return out


@dataclass
class Response:
    version: str
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes = b""
    raw_head: bytes = b""
    chunked: bool = False
    complete: bool = True  # False when the body ended early (close/reset mid-body)
    framing: str = ""  # "chunked", "length", "close" or "none"
    interim: list["Response"] = field(default_factory=list)

    def header(self, name: str) -> str | None:
        lname = name.lower()
        for k, v in self.headers:
            if k.lower() == lname:
                return v
        return None

    def headers_named(self, name: str) -> list[str]:
        lname = name.lower()
        return [v for k, v in self.headers if k.lower() == lname]

    def has_header(self, name: str) -> bool:
        return self.header(name) is not None

    def connection_tokens(self) -> set[str]:
        toks: set[str] = set()
        for v in self.headers_named("connection"):
            toks.update(t.strip().lower() for t in v.split(",") if t.strip())
        return toks

    def __repr__(self) -> str:  # short, for assertion messages
        body = self.body[:200]
        return (f"<Response {self.version} {self.status} {self.reason!r} framing={self.framing} "
                f"complete={self.complete} headers={self.headers} body[:200]={body!r}>")


class RawConn:
    """One client TCP connection with a receive buffer."""

    def __init__(self, host: str, port: int, timeout: float = DEFAULT_TIMEOUT,
                 rcvbuf: int | None = None, connect_timeout: float = 5.0):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(connect_timeout)
        self.sock.connect((host, port))
        self.sock.settimeout(timeout)
        self.timeout = timeout
        self.buf = bytearray()
        self.eof = False
        self.reset = False

    # -- plumbing -------------------------------------------------------------------------
    def __enter__(self) -> "RawConn":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, deadline: float, n: int = 65536) -> bool:
        """Receive more bytes into the buffer; False on EOF/reset. Raises TimeoutError."""
        if self.eof:
            return False
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("deadline passed while waiting for data")
        self.sock.settimeout(min(remaining, self.timeout))
        try:
            chunk = self.sock.recv(n)
        except (ConnectionResetError, BrokenPipeError):
            self.eof = True
            self.reset = True
            return False
        except socket.timeout as e:
            raise TimeoutError("timed out waiting for data") from e
        if not chunk:
            self.eof = True
            return False
        self.buf += chunk
        return True

    def _read_until(self, marker: bytes, deadline: float, limit: int = 1 << 20) -> bytes | None:
        while True:
            out = take_through(self.buf, marker)
            if out is not None:
                return out
            if len(self.buf) > limit:
                raise ProtocolError(f"no {marker!r} within {limit} bytes: {bytes(self.buf[:200])!r}")
            if not self._fill(deadline):
                return None

    def _read_exact(self, n: int, deadline: float) -> tuple[bytes, bool]:
        while len(self.buf) < n:
            if not self._fill(deadline, max(65536, min(n - len(self.buf), 1 << 20))):
                out = bytes(self.buf)
                self.buf.clear()
                return out, False
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out, True

    # -- HTTP -----------------------------------------------------------------------------
    def read_head(self, timeout: float | None = None) -> Response | None:
        """Read one response head. None if the connection closed before any byte."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        raw = self._read_until(b"\r\n\r\n", deadline)
        if raw is None:
            if self.buf:
                raise ProtocolError(f"connection closed inside a response head: {bytes(self.buf)!r}")
            return None
        lines = raw[:-4].split(b"\r\n")
        status_line = lines[0].decode("latin-1")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise ProtocolError(f"bad status line {status_line!r}")
        headers = []
        for line in lines[1:]:
            name, sep, value = line.decode("latin-1").partition(":")
            if not sep:
                raise ProtocolError(f"bad header line {line!r}")
            headers.append((name, value.strip()))
        return Response(version=parts[0], status=int(parts[1]),
                        reason=parts[2] if len(parts) > 2 else "", headers=headers, raw_head=raw)

    def read_response(self, method: str = "GET", timeout: float | None = None,
                      allow_truncated: bool = False, skip_interim: bool = True,
                      max_body: int = 256 << 20) -> Response | None:
        """Read one full response (interim 1xx collected into .interim).

        Returns None when the connection was closed before any response byte.
        """
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        interim: list[Response] = []
        while True:
            head = self.read_head(timeout=max(0.001, deadline - time.monotonic()))
            if head is None:
                if interim:
                    raise Truncated("connection closed after an interim response")
                return None
            if 100 <= head.status < 200 and head.status != 101 and skip_interim:
                interim.append(head)
                continue
            break
        head.interim = interim
        return self.read_body(head, method=method, deadline=deadline, allow_truncated=allow_truncated,
                              max_body=max_body)

    def read_body(self, head: Response, method: str = "GET", deadline: float | None = None,
                  allow_truncated: bool = False, max_body: int = 256 << 20) -> Response:
        """Read the body that belongs to an already-read head (fills head.body)."""
        if deadline is None:
            deadline = time.monotonic() + self.timeout
        te = ",".join(head.headers_named("transfer-encoding")).lower()
        cl = head.headers_named("content-length")
        if method.upper() == "HEAD" or head.status in (204, 304) or 100 <= head.status < 200:
            head.framing = "none"
        elif "chunked" in te:
            head.framing = "chunked"
            head.chunked = True
            head.body, head.complete = self._read_chunked(deadline, max_body)
        elif cl:
            if len(set(cl)) != 1 or not cl[0].isdigit():
                raise ProtocolError(f"invalid Content-Length {cl}")
            n = int(cl[0])
            if n > max_body:
                raise ProtocolError(f"Content-Length {n} larger than max_body")
            head.framing = "length"
            head.body, head.complete = self._read_exact(n, deadline)
        else:
            head.framing = "close"
            while self._fill(deadline):
                if len(self.buf) > max_body:
                    raise ProtocolError("close-delimited body larger than max_body")
            head.body = bytes(self.buf)
            self.buf.clear()
        if not head.complete and not allow_truncated:
            raise Truncated(f"body truncated after {len(head.body)} bytes: {head!r}")
        return head

    def _read_chunked(self, deadline: float, max_body: int) -> tuple[bytes, bool]:
        body = bytearray()
        while True:
            line = self._read_until(b"\r\n", deadline, limit=4096)
            if line is None:
                return bytes(body), False
            size_txt = line[:-2].split(b";", 1)[0].strip()
            try:
                size = int(size_txt, 16)
            except ValueError as e:
                raise ProtocolError(f"bad chunk size line {line!r}") from e
            if size == 0:
                # trailers, then the final CRLF
                while True:
                    t = self._read_until(b"\r\n", deadline, limit=65536)
                    if t is None:
                        return bytes(body), False
                    if t == b"\r\n":
                        return bytes(body), True
            data, ok = self._read_exact(size, deadline)
            body += data
            if not ok:
                return bytes(body), False
            if len(body) > max_body:
                raise ProtocolError("chunked body larger than max_body")
            crlf, ok = self._read_exact(2, deadline)
            if not ok:
                return bytes(body), False
            if crlf != b"\r\n":
                raise ProtocolError(f"chunk not followed by CRLF: {crlf!r}")

    def wait_closed(self, timeout: float = 5.0) -> bool:
        """True if the peer closes (EOF or RST) within timeout with no further data.

        Bytes arriving instead make it raise, since a closed-connection check that silently
        drops a second response would hide a bug.
        """
        deadline = time.monotonic() + timeout
        if self.buf:
            raise ProtocolError(f"unexpected extra bytes: {bytes(self.buf[:200])!r}")
        try:
            if self._fill(deadline):
                raise ProtocolError(f"unexpected extra bytes: {bytes(self.buf[:200])!r}")
        except TimeoutError:
            return False
        return True


def request_bytes(method: str, target: str, headers: dict | list | None = None, body: bytes = b"",
                  version: str = "HTTP/1.1", host: str | None = None,
                  content_length: bool = True) -> bytes:
    """Build a request. Host is derived from an absolute target unless given or present."""
    hdrs: list[tuple[str, str]] = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
    names = {k.lower() for k, _ in hdrs}
    if "host" not in names:
        if host is None and "://" in target:
            # the authority ends at the first "/", "?" or "#" (RFC 3986 §3.2)
            host = re.split(r"[/?#]", target.split("://", 1)[1], maxsplit=1)[0]
        if host is not None:
            hdrs.insert(0, ("Host", host))
    if body and content_length and "content-length" not in names and "transfer-encoding" not in names:
        hdrs.append(("Content-Length", str(len(body))))
    out = f"{method} {target} {version}\r\n".encode("latin-1")
    for k, v in hdrs:
        out += f"{k}: {v}\r\n".encode("latin-1")
    return out + b"\r\n" + body


def chunked(body_parts: list[bytes]) -> bytes:
    out = b""
    for p in body_parts:
        if p:
            out += f"{len(p):x}\r\n".encode() + p + b"\r\n"
    return out + b"0\r\n\r\n"
