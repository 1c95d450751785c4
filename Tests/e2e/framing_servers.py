"""A raw-socket origin for the upstream framing tests (test_upstream_framing.py), on 127.0.0.1.

FramingOrigin reads each request head (and its body, Content-Length or chunked) on a
connection, then writes exactly the bytes scripted for the request's path — nothing is added,
nothing is fixed — and afterwards keeps the connection open for the next request, closes it
(FIN), or resets it (RST), as the script says. A path without a script gets a fresh,
well-formed answer that names the path and the request's sequence number, so a test can tell a
real answer from bytes left over on a reused upstream connection.

Everything it saw is recorded: per connection, the requests (method, path, headers) in order,
and whether the peer (Sluice) closed the connection.
"""

from __future__ import annotations

import socket
import time
import urllib.parse
from dataclasses import dataclass, field

from faultservers import PeerClosed, Reader, ThreadedServer
from resilience_servers import rst_close

# Nothing here waits forever: a connection thread gives up after this long without a request.
IDLE_TIMEOUT = 30.0


@dataclass
class Answer:
    """The exact bytes for one request, then what happens to the connection:
    "keep" (read the next request), "close" (FIN after `linger` seconds) or "rst"."""
    wire: bytes
    after: str = "keep"
    linger: float = 0.1


@dataclass
class Seen:
    conn: int
    seq: int
    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes = b""


@dataclass
class ConnState:
    n: int
    peer_closed: bool = False
    requests: list[Seen] = field(default_factory=list)


def fresh_body(path: str, seq: int) -> bytes:
    return f"fresh {path} #{seq}".encode()


def fresh_answer(path: str, seq: int) -> bytes:
    body = fresh_body(path, seq)
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Fresh: yes\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)


class FramingOrigin(ThreadedServer):
    name = "framing-origin"

    def __init__(self):
        self.answers: dict[str, Answer] = {}
        self.seen: list[Seen] = []
        self.conns: list[ConnState] = []
        super().__init__()

    def script(self, path: str, answer: Answer) -> str:
        with self.lock:
            self.answers[path] = answer
        return f"{self.url}{path}"

    def requests(self, path: str | None = None) -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if path is None or s.path == path]

    def conn_of(self, path: str) -> ConnState | None:
        """The connection that carried the first request for `path`."""
        with self.lock:
            for s in self.seen:
                if s.path == path:
                    return self.conns[s.conn - 1]
        return None

    def handle(self, conn: socket.socket, rec) -> None:
        with self.lock:
            st = ConnState(n=len(self.conns) + 1)
            self.conns.append(st)
        r = Reader(conn, timeout=IDLE_TIMEOUT)
        while not self.stopping.is_set():
            try:
                _, method, target, headers = r.read_head()
            except (PeerClosed, socket.timeout, ConnectionError):
                st.peer_closed = True
                return
            body = bytearray()
            r.read_body(headers, body.extend)
            path = urllib.parse.urlsplit(target).path if "://" in target else target.split("?", 1)[0]
            with self.lock:
                seen = Seen(conn=st.n, seq=len(self.seen) + 1, method=method, path=path, headers=headers,
                            body=bytes(body))
                self.seen.append(seen)
                st.requests.append(seen)
                answer = self.answers.get(path)
            if answer is None:
                answer = Answer(fresh_answer(path, seen.seq))
            conn.sendall(answer.wire)
            if answer.after == "keep":
                continue
            time.sleep(answer.linger)  # server behaviour: the answer's connection lingers before its FIN or RST
            if answer.after == "rst":
                rst_close(conn)
            return  # "close": ThreadedServer._run closes the socket (FIN)
