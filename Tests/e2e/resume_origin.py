"""A purpose-built origin for resumable downloads (docs/configuration.md, "Resumable downloads").

It serves one large body, generated on the fly (never held in memory): 1 MiB blocks of one
random block, each starting with its own index, so that any byte at the wrong offset changes
the SHA-256. It answers `Range: bytes=N-` with `206` and `Content-Range` when `If-Range`
matches its current validator (its `ETag`, or its `Last-Modified` when it sends no ETag), with
the whole `200` otherwise (RFC 9110 §13.1.5), and it cuts responses where the test says:
`cuts` is a list of absolute body offsets, one per response, at which that response's
connection is reset (SO_LINGER 0) after the bytes before it were sent (-1: reset before the
head; None: not cut). `change_etag_after` makes
the representation change (a new ETag, other bytes) after that many responses; `extra` header
lines go on every response; `head_delay` holds each head back that long (so that concurrent
requests overlap), `pace` sleeps that long after each 1 MiB of body (a slow origin). Every
request is recorded (method, range, if-range)."""

from __future__ import annotations

import hashlib
import random
import socket
import struct
import time
from email.utils import formatdate

from faultservers import Reader, ThreadedServer, header

BLOCK = 1 << 20


class ResumeOrigin(ThreadedServer):
    name = "resume-origin"

    def __init__(self, size: int, cuts: list[int] | None = None, etag: str | None = '"v1"',
                 last_modified: str | None = None, change_etag_after: int | None = None,
                 chunked: bool = False, extra: list[str] | None = None, seed: int = 7,
                 head_delay: float = 0.0, pace: float = 0.0):
        self.extra = list(extra or [])
        self.head_delay = head_delay
        self.pace = pace
        self.size = size
        self.cuts = list(cuts or [])
        self.etag = etag
        self.last_modified = last_modified
        self.change_etag_after = change_etag_after
        self.chunked = chunked
        self.base = random.Random(seed).randbytes(BLOCK)
        self.version = 1
        self.responses = 0
        self.log: list[dict] = []
        super().__init__()

    # The body: block k is `base` with its first 8 bytes replaced by k (and the version).
    def block(self, k: int, version: int) -> bytes:
        return struct.pack("<II", k, version) + self.base[8:]

    def body_range(self, start: int, end: int, version: int):
        """Yields the body's bytes [start, end) in pieces of at most 1 MiB."""
        at = start
        while at < end:
            k, off = divmod(at, BLOCK)
            take = min(BLOCK - off, end - at)
            yield self.block(k, version)[off:off + take]
            at += take

    def sha256(self, version: int = 1) -> str:
        h = hashlib.sha256()
        for piece in self.body_range(0, self.size, version):
            h.update(piece)
        return h.hexdigest()

    def prefix_matches(self, data: bytes, version: int = 1) -> bool:
        """Whether `data` is the start of the body (version `version`)."""
        return all(piece == data[i:i + len(piece)] for i, piece in
                   zip(range(0, len(data), BLOCK), self.body_range(0, len(data), version)))

    def current_etag(self) -> str | None:
        if self.etag is None:
            return None
        return self.etag if self.version == 1 else f'"v{self.version}"'

    def handle(self, conn, rec):
        reader = Reader(conn, timeout=60)
        while True:
            _, method, target, headers = reader.read_head()
            with self.lock:
                index = self.responses
                self.responses += 1
                if self.change_etag_after is not None and index == self.change_etag_after:
                    self.version += 1
                version = self.version
                etag = self.current_etag()
                cut = self.cuts[index] if index < len(self.cuts) else None
                self.log.append({"method": method, "range": header(headers, "range"),
                                 "if_range": header(headers, "if-range"), "at": time.monotonic()})
            if cut == -1:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()
                return
            start = 0
            rng, if_range = header(headers, "range"), header(headers, "if-range")
            validator = etag or self.last_modified
            if rng and rng.startswith("bytes=") and rng.endswith("-") and (if_range is None or if_range == validator):
                start = int(rng[6:-1])
            status = "206 Partial Content" if start else "200 OK"
            lines = [f"HTTP/1.1 {status}", "Date: " + formatdate(usegmt=True)]
            if etag:
                lines.append(f"ETag: {etag}")
            if self.last_modified:
                lines.append(f"Last-Modified: {self.last_modified}")
            lines += self.extra
            if start:
                lines.append(f"Content-Range: bytes {start}-{self.size - 1}/{self.size}")
            if self.head_delay:
                time.sleep(self.head_delay)  # server behaviour: a slow answer, so that requests overlap
            chunked = self.chunked and not start
            lines.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {self.size - start}")
            conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
            if method == "HEAD":
                continue
            end = self.size if cut is None else max(start, min(cut, self.size))
            for piece in self.body_range(start, end, version):
                conn.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
                if self.pace:
                    time.sleep(self.pace)  # server behaviour: the body arrives slowly
            if cut is not None and cut < self.size:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()
                return
            if chunked:
                conn.sendall(b"0\r\n\r\n")
