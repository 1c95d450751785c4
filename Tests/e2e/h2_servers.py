"""An HTTP/2 origin over TLS with injectable faults, for test_http2.py (hyper-h2, in-process
threads, 127.0.0.1 only).

`H2FaultServer(cert, key)` speaks only h2 (ALPN `h2`). Every request gets `200` and
`ok <path>` (a path starting `/trailers`: that line 1000 times, no length, then a trailer
section) unless a fault is armed for it:
  goaway  the connection answers the request's HEADERS with GOAWAY (last stream id below
          the request's: RFC 9113 §6.8 says it was not processed and may be retried) and closes
  reset   the request's stream is reset (RST_STREAM INTERNAL_ERROR) before any response byte;
          the connection stays open
  refuse  the stream is reset with REFUSED_STREAM (RFC 9113 §8.7: not processed)
  stall   the stream gets its head and some body, then nothing more (the connection serves
          other streams)
  hang    the stream is never answered

`close_idle = True` makes every connection that is idle for 0.1 s end as an idle timeout
does: GOAWAY (last stream id: the last one processed), then close.

`arm(kind, count)` makes the next `count` requests meet that fault. What the server saw is
recorded: `requests` (every request: connection number, stream id, method, path),
`answered` (requests that got a 200), `faults` (kinds injected), `connections` (accepted),
`ended` (per connection number: `eof` when the client closed it with a FIN, `reset` when
with a TCP reset), `stream_resets` (stream ids the client reset).
"""

from __future__ import annotations

import socket
import ssl
import threading
from dataclasses import dataclass

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions

from faultservers import HOST, pick_port


@dataclass
class SeenRequest:
    connection: int
    stream: int
    method: str
    path: str


class H2FaultServer:
    def __init__(self, cert: str, key: str):
        self.port = pick_port()
        self.lock = threading.Lock()
        self.requests: list[SeenRequest] = []
        self.answered: list[SeenRequest] = []
        self.faults: list[str] = []
        self.connections = 0
        self.ended: dict[int, str] = {}
        self.stream_resets: list[int] = []
        self._armed: list[str] = []
        self.goaway_lingers = False
        # Set: every connection idle for 0.1 s gets GOAWAY and is closed.
        self.close_idle = False
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(cert, key)
        self.ctx.set_alpn_protocols(["h2"])
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((HOST, self.port))
        self.sock.listen(128)
        self._stop = False
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, path: str) -> str:
        return f"https://{HOST}:{self.port}{path}"

    def arm(self, kind: str, count: int = 1) -> None:
        with self.lock:
            self._armed.extend([kind] * count)

    def stop(self) -> None:
        self._stop = True
        try:
            self.sock.close()
        except OSError:
            pass
        for c in list(self._conns):
            try:
                c.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while not self._stop:
            try:
                raw, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
                number = self.connections
            threading.Thread(target=self._serve, args=(raw, number), daemon=True).start()

    def _serve(self, raw: socket.socket, number: int) -> None:
        try:
            s = self.ctx.wrap_socket(raw, server_side=True)
        except (OSError, ssl.SSLError):
            raw.close()
            return
        self._conns.append(s)
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        conn.initiate_connection()
        s.settimeout(0.1)
        try:
            s.sendall(conn.data_to_send())
            while not self._stop:
                try:
                    data = s.recv(65536)
                except (TimeoutError, socket.timeout):
                    if self.close_idle:
                        # An idle timeout as nginx's: GOAWAY naming the last stream, then close.
                        conn.close_connection(error_code=h2.errors.ErrorCodes.NO_ERROR)
                        s.sendall(conn.data_to_send())
                        self.ended[number] = "closed by the server"
                        return
                    continue
                except ConnectionResetError:
                    self.ended[number] = "reset"
                    return
                if not data:
                    self.ended[number] = "eof"
                    return
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.RequestReceived):
                        if self._request(conn, s, number, event) == "closed":
                            return
                    elif isinstance(event, h2.events.DataReceived):
                        conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                    elif isinstance(event, h2.events.StreamReset):
                        with self.lock:
                            self.stream_resets.append(event.stream_id)
                    elif isinstance(event, h2.events.ConnectionTerminated):
                        s.sendall(conn.data_to_send())
                        return
                s.sendall(conn.data_to_send())
        except (OSError, ssl.SSLError, h2.exceptions.ProtocolError):
            return
        finally:
            try:
                s.close()
            except OSError:
                pass

    def _request(self, conn, s, number: int, event) -> str:
        headers = dict(event.headers)
        seen = SeenRequest(number, event.stream_id, headers.get(":method", ""), headers.get(":path", ""))
        with self.lock:
            self.requests.append(seen)
            fault = self._armed.pop(0) if self._armed else None
            if fault:
                self.faults.append(fault)
        if fault == "goaway":
            conn.close_connection(error_code=h2.errors.ErrorCodes.NO_ERROR, last_stream_id=event.stream_id - 2 if event.stream_id > 2 else 0)
            s.sendall(conn.data_to_send())
            if self.goaway_lingers:
                return "open"  # the client closes it
            return "closed"
        if fault == "hang":
            return "open"
        if fault == "stall":
            conn.send_headers(event.stream_id, [(":status", "200"), ("content-type", "text/plain")])
            conn.send_data(event.stream_id, b"partial\n" * 64)
            return "open"
        if fault in ("reset", "refuse"):
            code = h2.errors.ErrorCodes.REFUSED_STREAM if fault == "refuse" else h2.errors.ErrorCodes.INTERNAL_ERROR
            conn.reset_stream(event.stream_id, error_code=code)
            return "open"
        body = f"ok {seen.path}\n".encode()
        if seen.path.startswith("/trailers"):
            # No length: the body ends with the stream, after a trailer section.
            conn.send_headers(event.stream_id, [(":status", "200"), ("content-type", "text/plain"),
                                                ("x-origin", "h2-fault")])
            conn.send_data(event.stream_id, body * 1000)
            conn.send_headers(event.stream_id, [("x-checksum", "done")], end_stream=True)
            with self.lock:
                self.answered.append(seen)
            return "open"
        conn.send_headers(event.stream_id, [(":status", "200"), ("content-type", "text/plain"),
                                            ("content-length", str(len(body))), ("x-origin", "h2-fault")])
        conn.send_data(event.stream_id, body, end_stream=True)
        with self.lock:
            self.answered.append(seen)
        return "open"
