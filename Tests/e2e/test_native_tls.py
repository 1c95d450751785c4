"""The native transport over TLS (docs/architecture.md, "Two transports"): which https tries it
takes (`UpstreamEngine.choose`: `http2: off`, `engine: native`, or an origin that chose
HTTP/1.1 by ALPN when libcurl offered it h2), what an HTTP/2 origin keeps (libcurl), and that a
request over it is the same request: bodies both ways byte-exact, kept-alive connections,
timings, a connection closed by the origin while idle, a server that does not speak TLS, and
connections verified under a trust a reload replaced.

The trust evaluators themselves run on the native transport in `make e2e-native-tls`
(test_trust.py with `upstream.engine: native`); here each test names its engine itself.
"""

from __future__ import annotations

import hashlib
import os
import socket
import ssl
import threading
import time
import uuid

import pytest

from h2_servers import H2FaultServer
from policy_support import AccessLog, run_check, set_sections, sighup, write_yaml
from rawhttp import RawConn, request_bytes
from support import HOST, assert_sluice_error, wait_until


class TLSEchoOrigin:
    """An HTTP/1.1 origin over TLS (ALPN http/1.1, Python's ssl) answering each request with the
    SHA-256 and length of its body (Content-Length or chunked). `close_after` > 0: the
    connection is closed that many seconds after each response, though the response promised
    keep-alive (an origin's idle timeout). Counts connections and handshakes."""

    def __init__(self, cert: str, key: str, close_after: float = 0.0, close_delimited: str = ""):
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(cert, key)
        self.ctx.set_alpn_protocols(["http/1.1"])
        self.close_after = close_after
        # "notify" / "abrupt": every response is framed by the connection's end (no length),
        # which closes with TLS close_notify / without it (a TCP close only).
        self.close_delimited = close_delimited
        self.connections = 0
        self.requests = 0
        self.lock = threading.Lock()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((HOST, 0))
        self.port = self.sock.getsockname()[1]
        self.sock.listen(64)
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, path: str) -> str:
        return f"https://{HOST}:{self.port}{path}"

    def stop(self) -> None:
        self.stopped = True
        self.sock.close()

    def _accept(self) -> None:
        while not self.stopped:
            try:
                raw, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        try:
            conn = self.ctx.wrap_socket(raw, server_side=True)
            f = conn.makefile("rb")
            while True:
                line = f.readline()
                if not line:
                    return
                headers = {}
                while True:
                    h = f.readline()
                    if h in (b"\r\n", b"\n", b""):
                        break
                    k, _, v = h.decode("latin-1").partition(":")
                    headers[k.strip().lower()] = v.strip()
                digest = hashlib.sha256()
                n = 0
                if "content-length" in headers:
                    left = int(headers["content-length"])
                    while left:
                        chunk = f.read(min(left, 65536))
                        if not chunk:
                            return
                        digest.update(chunk)
                        n += len(chunk)
                        left -= len(chunk)
                elif headers.get("transfer-encoding", "").lower() == "chunked":
                    while True:
                        size = int(f.readline().split(b";")[0], 16)
                        if size == 0:
                            while f.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            break
                        chunk = f.read(size)
                        digest.update(chunk)
                        n += len(chunk)
                        f.readline()
                with self.lock:
                    self.requests += 1
                body = f"{digest.hexdigest()} {n}\n".encode()
                if self.close_delimited:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n"
                                 + body)
                    if self.close_delimited == "notify":
                        conn.unwrap().close()
                    else:
                        conn.shutdown(socket.SHUT_RDWR)
                        conn.close()
                    return
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
                             + str(len(body)).encode() + b"\r\n\r\n" + body)
                if self.close_after:
                    time.sleep(self.close_after)  # server behaviour: an origin's idle timeout
                    conn.close()
                    return
        except (OSError, ssl.SSLError, ValueError):
            return


@pytest.fixture
def echo(pki):
    servers: list[TLSEchoOrigin] = []

    def make(**kw) -> TLSEchoOrigin:
        s = TLSEchoOrigin(str(pki.chain_pem), str(pki.leaf_key), **kw)
        servers.append(s)
        return s
    yield make
    for s in servers:
        s.stop()


@pytest.fixture
def tlsproxy(sluice_factory, tmp_path):
    """start(policies) -> (Sluice, AccessLog) with one worker (the ALPN memory is per worker)."""
    def start(policies: dict | None = None, **top):
        log = AccessLog(tmp_path / f"access-{uuid.uuid4().hex[:6]}.log")
        cfg = {"workers": 1, "monitors": [{"access_log": {"path": str(log.path)}}], **top}
        if policies is not None:
            cfg["policies"] = policies
        return sluice_factory(cfg), log
    return start


def get(c: RawConn, url: str):
    c.send(request_bytes("GET", url))
    return c.read_response(timeout=20)


def engines(log: AccessLog, n: int) -> list[tuple]:
    lines = log.wait_for(lambda e: e.get("url", "").startswith("https://"), n=n)
    return [(e["upstream_engine"], e["upstream_protocol"], e["upstream_connection"]) for e in lines[:n]]


def test_https_origin_goes_native_once_it_chose_http1_by_alpn(tlsproxy, nginx):
    proxy, log = tlsproxy()
    with RawConn(HOST, proxy.port, timeout=20) as c:
        for i in range(4):
            r = get(c, nginx.tls_url(f"/1k?n={i}"))
            assert r.status == 200 and r.body == nginx.file_1k, r
    # The first try asks by ALPN through libcurl (h2 and http/1.1 offered); nginx here speaks
    # HTTP/1.1 only, so the next ones go native, on one kept-alive connection.
    assert engines(log, 4) == [("curl", "HTTP/1.1", "new"), ("native", "HTTP/1.1", "new"),
                               ("native", "HTTP/1.1", "reused"), ("native", "HTTP/1.1", "reused")]


def test_http2_origin_stays_with_curl(tlsproxy, pki):
    h2 = H2FaultServer(str(pki.chain_pem), str(pki.leaf_key))
    try:
        proxy, log = tlsproxy()
        with RawConn(HOST, proxy.port, timeout=20) as c:
            for i in range(3):
                r = get(c, h2.url(f"/x?n={i}"))
                assert r.status == 200, r
        assert [e[:2] for e in engines(log, 3)] == [("curl", "HTTP/2")] * 3
    finally:
        h2.stop()


@pytest.mark.parametrize("upstream", [{"http2": "off"}, {"engine": "native"}], ids=["http2-off", "forced"])
def test_native_from_the_first_try_with_timings(tlsproxy, nginx, upstream):
    proxy, log = tlsproxy({"default": {"upstream": upstream}})
    with RawConn(HOST, proxy.port, timeout=20) as c:
        for i in range(2):
            r = get(c, nginx.tls_url(f"/1k?n={i}"))
            assert r.status == 200 and r.body == nginx.file_1k, r
    assert engines(log, 2) == [("native", "HTTP/1.1", "new"), ("native", "HTTP/1.1", "reused")]
    first, second = log.wait_for(lambda e: e.get("url", "").startswith("https://"), n=2)[:2]
    t1, t2 = first["timings"], second["timings"]
    # A new connection: connect, then the handshake, then the first byte (ms since the try
    # began, as libcurl reports them); a reused one has no handshake of its own.
    assert 0 <= t1["connect"] <= t1["tls"] <= t1["first_byte"] <= t1["total"] and t1["tls"] > 0, t1
    assert t2["tls"] == 0, t2


def test_large_download_is_byte_exact(tlsproxy, nginx, tmp_path):
    proxy, log = tlsproxy({"default": {"upstream": {"http2": "off"}}})
    with RawConn(HOST, proxy.port, timeout=60) as c:
        c.send(request_bytes("GET", nginx.tls_url("/medium.bin")))
        r = c.read_response(timeout=60)
    assert r.status == 200 and len(r.body) == len(nginx.medium)
    assert hashlib.sha256(r.body).digest() == hashlib.sha256(nginx.medium).digest()
    assert engines(log, 1)[0][0] == "native"


@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_upload_is_byte_exact(tlsproxy, echo, framing):
    origin = echo()
    proxy, log = tlsproxy({"default": {"upstream": {"http2": "off"}}})
    body = os.urandom(6 * 1024 * 1024 + 17)
    with RawConn(HOST, proxy.port, timeout=60) as c:
        if framing == "length":
            c.send(request_bytes("POST", origin.url("/up"), [("Content-Length", str(len(body)))]) + body)
        else:
            c.send(request_bytes("POST", origin.url("/up"), [("Transfer-Encoding", "chunked")]))
            for i in range(0, len(body), 100_000):
                part = body[i:i + 100_000]
                c.send(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            c.send(b"0\r\n\r\n")
        r = c.read_response(timeout=60)
    assert r.status == 200, r
    assert r.body.decode() == f"{hashlib.sha256(body).hexdigest()} {len(body)}\n"
    assert engines(log, 1)[0][0] == "native"


def test_origin_closing_an_idle_connection_is_seen_before_reuse(tlsproxy, echo):
    origin = echo(close_after=0.1)
    proxy, log = tlsproxy({"default": {"upstream": {"http2": "off"}}})
    with RawConn(HOST, proxy.port, timeout=20) as c:
        for i in range(3):
            c.send(request_bytes("GET", origin.url(f"/x?n={i}")))
            r = c.read_response(timeout=20)
            assert r.status == 200, r
            time.sleep(0.4)  # window: the origin closes its side in it (close_notify and FIN)
    # Each request found the pooled connection closed and opened a new one: none failed.
    assert [e[2] for e in engines(log, 3)] == ["new", "new", "new"]
    assert origin.connections == 3 and origin.requests == 3


def test_a_server_that_does_not_speak_tls_is_a_tls_failure(tlsproxy, nginx):
    proxy, log = tlsproxy({"default": {"upstream": {"http2": "off"}}})
    with RawConn(HOST, proxy.port, timeout=20) as c:
        r = get(c, f"https://{HOST}:{nginx.http_port}/1k")
        assert_sluice_error(r, 502, "TLS failure with upstream")
        # The client connection stays usable.
        r = get(c, nginx.tls_url("/1k"))
        assert r.status == 200 and r.body == nginx.file_1k
    failed = log.wait_for(lambda e: e.get("status") == 502)[0]
    assert "TLS failure" in failed["error"] and failed["upstream_engine"] in ("native", None), failed


@pytest.mark.parametrize("change", [True, False], ids=["trust-changed", "same-config"])
def test_a_reload_opens_new_tls_connections(tlsproxy, nginx, pki, change):
    """Idle TLS connections are closed at a reload (their trust, or their CA file's contents,
    may have changed), whether the policies changed or not."""
    proxy, log = tlsproxy({"default": {"upstream": {"http2": "off"}}})
    with RawConn(HOST, proxy.port, timeout=20) as c:
        assert get(c, nginx.tls_url("/1k?n=0")).status == 200
        assert get(c, nginx.tls_url("/1k?n=1")).status == 200
    policies = {"default": {"upstream": {"http2": "off"}}}
    if change:
        policies[HOST] = {"trust": {"default": True, "ca_file": str(pki.ca_pem)}}
    set_sections(proxy, policies=policies)
    sighup(proxy)
    assert wait_until(lambda: "reload: applied" in proxy.stderr(), 10), proxy.stderr()
    with RawConn(HOST, proxy.port, timeout=20) as c:
        assert get(c, nginx.tls_url("/1k?n=2")).status == 200
        assert get(c, nginx.tls_url("/1k?n=3")).status == 200
    # The connection the old trust verified is not reused under the new one.
    assert [e[2] for e in engines(log, 4)] == ["new", "reused", "new", "reused"]


def test_close_delimited_body_needs_close_notify(tlsproxy, echo):
    """A body framed by the connection's end is complete only with the origin's close_notify:
    a TCP close alone may be a cut (RFC 8446 §6.1), so the client's response is cut too."""
    clean, abrupt = echo(close_delimited="notify"), echo(close_delimited="abrupt")
    proxy, log = tlsproxy({"default": {"upstream": {"http2": "off"}}})
    with RawConn(HOST, proxy.port, timeout=20) as c:
        r = get(c, clean.url("/x"))
        assert r.status == 200 and r.complete and r.body.endswith(b" 0\n"), r
    with RawConn(HOST, proxy.port, timeout=20) as c:
        c.send(request_bytes("GET", abrupt.url("/x")))
        r = c.read_response(timeout=20, allow_truncated=True)
        assert r is not None and r.status == 200 and not r.complete, r
    cut = log.wait_for(lambda e: str(abrupt.port) in e.get("url", ""))[0]
    assert cut["outcome"] == "upstream_aborted", cut


def test_check_host_names_both_engines_for_an_https_upstream(tmp_path):
    cfg = write_yaml(tmp_path / "c.yaml", {"policies": {"api.test": {"upstream": {"scheme": "https"}}}})
    r = run_check(cfg, "api.test")
    assert r.returncode == 0, r.stderr
    assert ("upstream engine: curl (https origin, HTTP/2 offered by ALPN), then native "
            "(https origin that chose HTTP/1.1 by ALPN)") in r.stdout, r.stdout
