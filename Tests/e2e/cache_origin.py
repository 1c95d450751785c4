"""A purpose-built origin for the shared-cache tests: every resource's status, header fields
and body are set by the test, every request that reaches it is counted and recorded, and it
answers conditional requests (If-None-Match against the resource's ETag, If-Modified-Since
against its Last-Modified) with 304 as an origin should, so a test can assert exactly how
many requests got past the cache and what they carried."""

from __future__ import annotations

import threading
import time
from email.utils import parsedate_to_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from faultservers import HOST, pick_port


class Resource:
    def __init__(self, status: int = 200, headers: dict | list | None = None, body: bytes = b"body",
                 conditional: bool = True, chunked: bool = False, delay: float = 0.0, trickle: float = 0.0):
        self.chunked = chunked
        self.trickle = trickle
        self.delay = delay
        self.status = status
        self.headers = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
        self.body = body
        self.conditional = conditional

    def header(self, name: str) -> str | None:
        for k, v in self.headers:
            if k.lower() == name.lower():
                return v
        return None


class CountingOrigin:
    def __init__(self):
        self.resources: dict[str, Resource] = {}
        self.log: list[tuple[str, str, dict]] = []  # (method, path, headers lower-cased)
        self.lock = threading.Lock()
        origin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def handle_any(self):
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                with origin.lock:
                    origin.log.append((self.command, self.path, headers))
                    res = origin.resources.get(self.path.split("?")[0]) or Resource(404, {}, b"no such resource")
                status, body = res.status, res.body
                if res.delay:
                    time.sleep(res.delay)  # server behaviour: a slow answer, so that concurrent requests overlap
                if res.conditional and self.command in ("GET", "HEAD") and self._not_modified(res, headers):
                    status, body = 304, b""
                self.send_response(status)
                for k, v in res.headers:
                    self.send_header(k, v)
                bodiless = self.command == "HEAD" or status in (204, 304)
                if res.chunked and not bodiless:
                    self.send_header("Transfer-Encoding", "chunked")
                elif status != 304 and status != 204:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if bodiless:
                    return
                if res.chunked:
                    for i in range(0, len(body), 4096):
                        piece = body[i:i + 4096]
                        if i and res.trickle:
                            self.wfile.flush()
                            time.sleep(res.trickle)  # server behaviour: the body streams slowly: a fill in progress
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    self.wfile.write(b"0\r\n\r\n")
                else:
                    self.wfile.write(body)

            @staticmethod
            def _not_modified(res: Resource, headers: dict) -> bool:
                etag = res.header("ETag")
                inm = headers.get("if-none-match")
                if inm is not None:
                    tags = [t.strip().removeprefix("W/") for t in inm.split(",")]
                    return inm.strip() == "*" or (etag is not None and etag.removeprefix("W/") in tags)
                ims, lm = headers.get("if-modified-since"), res.header("Last-Modified")
                if ims and lm:
                    try:
                        return parsedate_to_datetime(lm) <= parsedate_to_datetime(ims)
                    except (TypeError, ValueError):
                        return False
                return False

            do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = handle_any

        self.port = pick_port()
        self.server = ThreadingHTTPServer((HOST, self.port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = "") -> str:
        return f"http://{HOST}:{self.port}{path}"

    def set(self, path: str, status: int = 200, headers: dict | list | None = None, body: bytes = b"body",
            conditional: bool = True, chunked: bool = False, delay: float = 0.0, trickle: float = 0.0) -> str:
        with self.lock:
            self.resources[path] = Resource(status, headers, body, conditional, chunked, delay, trickle)
        return self.url(path)

    def count(self, path: str, method: str | None = None) -> int:
        with self.lock:
            return sum(1 for m, p, _ in self.log if p.split("?")[0] == path and (method is None or m == method))

    def requests(self, path: str) -> list[tuple[str, dict]]:
        with self.lock:
            return [(m, h) for m, p, h in self.log if p.split("?")[0] == path]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
