"""HTTP/2 to origins (`upstream.http2` per host; the server's `upstream.max_connections_per_host`
and `upstream.max_streams`): against nginx with `http2` on (TLS, and h2c for prior knowledge)
and a purpose-built h2 origin that answers with GOAWAY or stream resets (h2_servers.py).

What is proved, counting at the origin: the protocol used (nginx's `$server_protocol` and the
access log's `upstream_protocol`), multiplexing (64 concurrent client connections share one
upstream connection per worker), a large body streamed with backpressure over a stream, and
retries when a stream is refused, reset or cut by GOAWAY before its first byte.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import nginx_conf, spawn, stop_process, wait_port
from faultservers import HOST, pick_port
from h2_servers import H2FaultServer
from policy_support import AccessLog
from rawhttp import RawConn, request_bytes
from support import MiB, RssMonitor, session_via, tail, wait_until

LOG_FORMAT = "log_format h2 '$connection $connection_requests $server_protocol $status \"$request\"';"
LINE_RE = re.compile(r'^(\d+) (\d+) (\S+) (\d+) "([^"]*)"$')

NGINX_H2 = """\
    types {{ application/octet-stream bin; text/plain txt; }}
    default_type application/octet-stream;
    keepalive_requests 100000;
    keepalive_timeout 120s;
    http2_max_concurrent_streams 128;
    server {{
        listen {host}:{tls_port} ssl http2;
        ssl_certificate {chain};
        ssl_certificate_key {key};
        access_log {d}/tls.log h2;
        root {www};
        location = /slow.bin {{ limit_rate 256k; }}
    }}
    server {{
        listen {host}:{h2c_port} http2;
        access_log {d}/h2c.log h2;
        root {www};
    }}
"""

BIG = 64 * MiB
SLOW = 256 * 1024


class H2Nginx:
    def __init__(self, d: Path, pki):
        self.dir = d
        self.www = d / "www"
        self.www.mkdir()
        self.file_1k = os.urandom(1024)
        (self.www / "1k").write_bytes(self.file_1k)
        big = os.urandom(BIG)
        (self.www / "big.bin").write_bytes(big)
        self.big_sha = hashlib.sha256(big).hexdigest()
        (self.www / "slow.bin").write_bytes(os.urandom(SLOW))
        self.tls_port, self.h2c_port = pick_port(), pick_port()
        conf = d / "nginx.conf"
        conf.write_text(nginx_conf(d, NGINX_H2.format(host=HOST, tls_port=self.tls_port, h2c_port=self.h2c_port,
                                                      chain=pki.chain_pem, key=pki.leaf_key, d=d, www=self.www),
                                   log_directives=LOG_FORMAT))
        self.log = open(d / "stderr.log", "wb")
        self.proc = spawn(["nginx", "-p", str(d), "-e", str(d / "error.log"), "-c", str(conf)],
                          stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL)
        try:
            wait_port(self.tls_port, 15, self.proc)
            wait_port(self.h2c_port, 15, self.proc)
        except Exception as e:
            self.stop()
            raise RuntimeError(f"nginx did not start: {e}\n{tail(d / 'error.log')}") from e

    def lines(self, which: str, tag: str) -> list[tuple[int, int, str, int, str]]:
        try:
            text = (self.dir / f"{which}.log").read_text("utf-8", "replace")
        except OSError:
            return []
        out = []
        for raw in text.splitlines():
            m = LINE_RE.match(raw.strip())
            assert m, f"unexpected nginx log line {raw!r}"
            if tag in m[5]:
                out.append((int(m[1]), int(m[2]), m[3], int(m[4]), m[5]))
        return out

    def wait_lines(self, which: str, tag: str, n: int, timeout: float = 5.0) -> list[tuple[int, int, str, int, str]]:
        """The lines for tag once there are n (nginx logs a request after its last byte left)."""
        wait_until(lambda: len(self.lines(which, tag)) >= n, timeout)
        return self.lines(which, tag)

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()


@pytest.fixture(scope="module")
def h2nginx(tmp_path_factory, pki):
    n = H2Nginx(tmp_path_factory.mktemp("h2nginx"), pki)
    yield n
    n.stop()


@pytest.fixture
def h2fault(pki):
    s = H2FaultServer(str(pki.chain_pem), str(pki.leaf_key))
    yield s
    s.stop()


def tag() -> str:
    return "t" + os.urandom(6).hex()


def h2proxy(sluice_factory, tmp_path, http2: str | None, port: int, *, scheme: str = "https", workers: int = 1,
            extra: dict | None = None, retry: dict | None = None):
    """Sluice whose policy for 127.0.0.1 sends plain-HTTP requests to `scheme` on `port` with
    `upstream.http2`; access log in tmp_path."""
    log = tmp_path / f"access-{port}.log"
    up: dict = {"scheme": scheme, "port": port}
    if http2 is not None:
        up["http2"] = http2
    policy: dict = {"upstream": up}
    if retry is not None:
        policy["retry"] = retry
    cfg = {"workers": workers, "policies": {HOST: policy},
           "monitors": [{"access_log": {"path": str(log)}}]}
    cfg.update(extra or {})
    return sluice_factory(cfg), AccessLog(log)


def url(path: str) -> str:
    # The policy's upstream override sends it to the origin's port and scheme.
    return f"http://{HOST}:80{path}"


# ------------------------------------------------------------------------------------------
# the protocol used
# ------------------------------------------------------------------------------------------

def metric(admin_port: int, name: str, **labels: str) -> float:
    text = session_via(None).get(f"http://{HOST}:{admin_port}/metrics", timeout=10).text
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(name + "{"):
            got = ",".join(sorted(line[len(name) + 1:line.index("}")].split(",")))
            if got == want:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_auto_negotiates_h2_with_a_tls_origin_and_logs_it(sluice_factory, tmp_path, h2nginx):
    admin = pick_port()
    log_path = tmp_path / "access-auto.log"
    proxy, log = h2proxy(sluice_factory, tmp_path, None, h2nginx.tls_port,  # http2 defaults to auto
                         extra={"admin": {"listen": f"{HOST}:{admin}"},
                                "monitors": [{"access_log": {"path": str(log_path)}}, {"metrics": {}}]})
    log = AccessLog(log_path)
    t = tag()
    s = session_via(proxy.url)
    for i in range(3):
        r = s.get(url(f"/1k?{t}-{i}"), timeout=10)
        assert r.status_code == 200 and r.content == h2nginx.file_1k, r
        # An HTTP/1.1 client gets an HTTP/1.1 response (h2's lower-case names pass as they are)
        assert r.raw.version == 11
    lines = h2nginx.wait_lines("tls", t, 3)
    assert len(lines) == 3 and {ln[2] for ln in lines} == {"HTTP/2.0"}, lines
    assert len({ln[0] for ln in lines}) == 1, f"one connection for sequential requests: {lines}"
    entries = log.wait_for(lambda e: t in e.get("url", ""), n=3)
    assert [e["upstream_protocol"] for e in entries] == ["HTTP/2"] * 3, entries
    assert [e["upstream_connection"] for e in entries] == ["new", "reused", "reused"], entries
    assert metric(admin, "sluice_upstream_requests_total", protocol="HTTP/2", connection="new") == 1
    assert metric(admin, "sluice_upstream_requests_total", protocol="HTTP/2", connection="reused") == 2
    assert metric(admin, "sluice_upstream_requests_total", protocol="HTTP/1.1", connection="new") == 0


def test_off_speaks_http1_to_an_h2_origin(sluice_factory, tmp_path, h2nginx):
    proxy, log = h2proxy(sluice_factory, tmp_path, "off", h2nginx.tls_port)
    t = tag()
    r = session_via(proxy.url).get(url(f"/1k?{t}"), timeout=10)
    assert r.status_code == 200 and r.content == h2nginx.file_1k
    lines = h2nginx.wait_lines("tls", t, 1)
    assert [ln[2] for ln in lines] == ["HTTP/1.1"], lines
    assert log.wait_for(lambda e: t in e.get("url", ""))[0]["upstream_protocol"] == "HTTP/1.1"


def test_auto_falls_back_to_http1_with_an_http1_only_tls_origin(sluice_factory, tmp_path, nginx):
    proxy, log = h2proxy(sluice_factory, tmp_path, "auto", nginx.https_port)
    t = tag()
    s = session_via(proxy.url)
    for i in range(2):
        r = s.get(url(f"/1k?{t}{i}"), timeout=10)
        assert r.status_code == 200 and r.content == nginx.file_1k
    entries = log.wait_for(lambda e: t in e.get("url", ""), n=2)
    assert [e["upstream_protocol"] for e in entries] == ["HTTP/1.1"] * 2, entries


def test_prior_knowledge_speaks_h2c_on_plain_http(sluice_factory, tmp_path, h2nginx):
    proxy, log = h2proxy(sluice_factory, tmp_path, "prior_knowledge", h2nginx.h2c_port, scheme="http")
    t = tag()
    r = session_via(proxy.url).get(url(f"/1k?{t}"), timeout=10)
    assert r.status_code == 200 and r.content == h2nginx.file_1k
    assert [ln[2] for ln in h2nginx.wait_lines("h2c", t, 1)] == ["HTTP/2.0"]
    assert log.wait_for(lambda e: t in e.get("url", ""))[0]["upstream_protocol"] == "HTTP/2"


def test_auto_on_plain_http_stays_http1(sluice_factory, tmp_path, nginx):
    proxy, log = h2proxy(sluice_factory, tmp_path, None, nginx.http_port, scheme="http")
    t = tag()
    r = session_via(proxy.url).get(url(f"/1k?{t}"), timeout=10)
    assert r.status_code == 200 and r.content == nginx.file_1k
    assert log.wait_for(lambda e: t in e.get("url", ""))[0]["upstream_protocol"] == "HTTP/1.1"


def test_head_and_post_over_h2(sluice_factory, tmp_path, h2nginx, h2fault):
    """HEAD gets the head without a body; a POST's body goes out on its stream."""
    proxy, _ = h2proxy(sluice_factory, tmp_path, None, h2nginx.tls_port)
    t = tag()
    s = session_via(proxy.url)
    r = s.head(url(f"/1k?{t}"), timeout=10)
    assert r.status_code == 200 and r.headers["Content-Length"] == "1024" and r.content == b""
    assert [ln[2:4] for ln in h2nginx.wait_lines("tls", t, 1)] == [("HTTP/2.0", 200)]
    proxy2, _ = h2proxy(sluice_factory, tmp_path, None, h2fault.port)
    r = session_via(proxy2.url).post(url(f"/post?{t}"), data=b"x" * 300_000, timeout=10)
    assert r.status_code == 200 and r.text == f"ok /post?{t}\n" and r.headers["x-origin"] == "h2-fault"
    assert [(q.method, q.path) for q in h2fault.requests] == [("POST", f"/post?{t}")]


def test_body_without_length_and_trailers_over_h2(sluice_factory, tmp_path, h2fault):
    """An h2 response without content-length (the stream's end ends it) followed by a
    trailer section: re-chunked for the HTTP/1.1 client, complete, trailers dropped (as for
    an HTTP/1.1 origin's), and the connection serves the next request."""
    proxy, _ = h2proxy(sluice_factory, tmp_path, None, h2fault.port)
    expected = b"ok /trailers\n" * 1000
    with RawConn(HOST, proxy.port, timeout=10) as c:
        for _ in range(2):
            c.send(request_bytes("GET", url("/trailers")))
            r = c.read_response()
            assert r.status == 200 and r.body == expected, r
            assert r.headers_named("transfer-encoding") == ["chunked"], r.headers
            assert r.headers_named("x-checksum") == [] and r.complete, r
    assert h2fault.connections == 1 and len(h2fault.answered) == 2


# ------------------------------------------------------------------------------------------
# multiplexing and pool limits
# ------------------------------------------------------------------------------------------

def concurrent_gets(proxy_url: str, t: str, clients: int, per_client: int) -> list[int]:
    def one(i: int) -> list[int]:
        s = session_via(proxy_url)
        out = []
        for j in range(per_client):
            r = s.get(url(f"/1k?{t}-{i}-{j}"), timeout=30)
            out.append(r.status_code if r.content and len(r.content) == 1024 else -r.status_code)
        s.close()
        return out

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        return [c for codes in pool.map(one, range(clients)) for c in codes]


@pytest.mark.parametrize("workers", [1, 2])
def test_64_clients_share_one_upstream_connection_per_worker(sluice_factory, tmp_path, h2nginx, workers):
    proxy, log = h2proxy(sluice_factory, tmp_path, None, h2nginx.tls_port, workers=workers)
    t = tag()
    codes = concurrent_gets(proxy.url, t, clients=64, per_client=4)
    assert codes == [200] * 256, codes
    lines = h2nginx.wait_lines("tls", t, 256)
    assert len(lines) == 256 and {ln[2] for ln in lines} == {"HTTP/2.0"}
    connections = {ln[0] for ln in lines}
    assert 1 <= len(connections) <= workers, f"{len(connections)} upstream connections for {workers} worker(s)"
    entries = log.wait_for(lambda e: t in e.get("url", ""), n=256)
    assert sum(e["upstream_connection"] == "new" for e in entries) == len(connections), entries[:5]


def slow_gets(proxy_url: str, t: str, clients: int) -> list[int]:
    """`clients` concurrent GETs of /slow.bin (256 KiB that nginx sends at 256 KiB/s: each
    holds its stream for about a second, so they overlap)."""
    def one(i: int) -> int:
        r = session_via(proxy_url).get(url(f"/slow.bin?{t}-{i}"), timeout=30)
        return r.status_code if len(r.content) == SLOW else -r.status_code

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        return list(pool.map(one, range(clients)))


@pytest.mark.parametrize("cap", [0, 2])
def test_max_streams_and_max_connections_per_host(sluice_factory, tmp_path, h2nginx, cap):
    """12 overlapping requests with max_streams: 4 need at least 3 connections (libcurl 7.88
    may open more while the first ones are still being set up); with
    max_connections_per_host: 2 they take exactly 2 (the rest wait for a free stream). The
    admin API shows the limits in force."""
    admin = pick_port()
    proxy, _ = h2proxy(sluice_factory, tmp_path, None, h2nginx.tls_port,
                       extra={"upstream": {"max_streams": 4, "max_connections_per_host": cap},
                              "admin": {"listen": f"{HOST}:{admin}"}})
    shown = session_via(None).get(f"http://{HOST}:{admin}/config", timeout=10).json()["server"]["upstream"]
    assert shown == {"max_connections_per_host": cap, "max_streams": 4}, shown
    t = tag()
    codes = slow_gets(proxy.url, t, clients=12)
    assert codes == [200] * 12, codes
    lines = h2nginx.wait_lines("tls", t, 12)
    connections = {ln[0] for ln in lines}
    assert len(lines) == 12 and all(ln[2] == "HTTP/2.0" for ln in lines), lines
    if cap:
        assert len(connections) == cap, f"{len(connections)} connections under a cap of {cap}"
    else:
        assert len(connections) >= 3, f"{len(connections)} connections carried 12 overlapping streams of at most 4"


# ------------------------------------------------------------------------------------------
# streaming and backpressure over a stream
# ------------------------------------------------------------------------------------------

def test_large_body_streams_with_backpressure_over_h2(sluice_factory, tmp_path, h2nginx):
    """A client reading ~2 MB/s from a 64 MiB h2 response: Sluice pauses the stream instead
    of reading the body into memory; meanwhile other requests multiplexed on the same
    connection are answered (which lets libcurl buffer the paused stream's window: bounded,
    not the body); then the whole body arrives intact."""
    proxy, log = h2proxy(sluice_factory, tmp_path, None, h2nginx.tls_port)
    t = tag()
    s = session_via(proxy.url)
    assert s.get(url(f"/1k?{t}-warm"), timeout=10).status_code == 200
    mon = RssMonitor(proxy.pid)
    digest = hashlib.sha256()
    with mon, RawConn(HOST, proxy.port, timeout=20, rcvbuf=64 * 1024) as c:
        c.send(request_bytes("GET", url(f"/big.bin?{t}")))
        head = c.read_head(timeout=10)
        assert head is not None and head.status == 200, head
        got = len(c.buf)
        digest.update(c.buf)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 3.0:
            budget = 200 * 1024  # per 0.1 s -> ~2 MB/s
            while budget > 0:
                d = c.sock.recv(min(budget, 65536))
                assert d, "connection closed during the slow read"
                digest.update(d)
                got += len(d)
                budget -= len(d)
            time.sleep(0.1)  # server behaviour: the throttled client reads 200 KiB per 0.1 s (~2 MB/s)
        slow_growth = mon.current_growth_mib()
        # the connection is not blocked for other streams while this one is paused
        for i in range(5):
            r = s.get(url(f"/1k?{t}-during-{i}"), timeout=10)
            assert r.status_code == 200 and r.content == h2nginx.file_1k
        time.sleep(0.5)  # window: libcurl buffers the paused stream's data in flight: its window, never the body
        shared_growth = mon.current_growth_mib()
        while got < BIG:
            d = c.sock.recv(1 << 20)
            assert d, f"connection closed after {got} bytes"
            digest.update(d)
            got += len(d)
    assert got == BIG and digest.hexdigest() == h2nginx.big_sha
    print(f"slow h2 reader: RSS growth {slow_growth:.1f} MiB while throttled, {shared_growth:.1f} MiB after "
          f"other streams used the connection; {mon.describe()}")
    assert slow_growth < 24, f"Sluice buffered {slow_growth:.1f} MiB of a paused h2 stream"
    # Once other streams make libcurl read the connection, the paused stream's data in flight
    # is buffered: at most its window, 32 MiB in libcurl 7.88 (docs/configuration.md).
    assert mon.growth_mib < 56, f"more than a stream window buffered: {mon.describe()}"
    lines = h2nginx.wait_lines("tls", t, 7)
    assert len(lines) == 7 and {ln[2] for ln in lines} == {"HTTP/2.0"} and len({ln[0] for ln in lines}) == 1, lines


# ------------------------------------------------------------------------------------------
# GOAWAY and stream resets before the first byte
# ------------------------------------------------------------------------------------------

RETRY = {"limit": 2, "backoff": {"scale": "10ms", "max_delay": "20ms"}}


@pytest.mark.parametrize("lingers", [False, True])
def test_goaway_before_the_first_byte_is_retried_on_a_new_connection(sluice_factory, tmp_path, h2fault, lingers):
    """GOAWAY leaves the request's stream unprocessed (its id above the last one). libcurl
    7.88 does not resend such a stream itself (it fails it with 16, HTTP2): Sluice counts it
    as a `reset`, which the host's `retry` retries on a new connection. The origin closes
    at once, or leaves the closing to the client (lingers)."""
    h2fault.goaway_lingers = lingers
    proxy, log = h2proxy(sluice_factory, tmp_path, None, h2fault.port, retry=RETRY)
    s = session_via(proxy.url)
    assert s.get(url("/first"), timeout=10).status_code == 200
    h2fault.arm("goaway")
    r = s.get(url("/after-goaway"), timeout=10)
    assert r.status_code == 200 and r.text == "ok /after-goaway\n", r.text
    assert h2fault.faults == ["goaway"]
    sent = [q for q in h2fault.requests if q.path == "/after-goaway"]
    assert len(sent) == 2 and sent[0].connection != sent[1].connection, sent
    assert [q.path for q in h2fault.answered] == ["/first", "/after-goaway"]
    e = log.wait_for(lambda e: e.get("url", "").endswith("/after-goaway"))[0]
    assert e["attempts"] == 2 and e["upstream_connection"] == "new" and e["upstream_protocol"] == "HTTP/2", e


def test_goaway_without_a_retry_policy_is_502(sluice_factory, tmp_path, h2fault):
    proxy, log = h2proxy(sluice_factory, tmp_path, None, h2fault.port)
    h2fault.arm("goaway")
    r = session_via(proxy.url).get(url("/goaway-once"), timeout=10)
    assert r.status_code == 502 and "127.0.0.1" in r.text, (r.status_code, r.text)
    assert len(h2fault.requests) == 1 and h2fault.answered == []
    # the next request gets a new connection and its answer
    r = session_via(proxy.url).get(url("/next"), timeout=10)
    assert r.status_code == 200 and h2fault.connections == 2


def test_an_idle_connection_closed_with_goaway_is_not_reused(sluice_factory, tmp_path, h2fault):
    """The origin ends an idle pooled h2 connection (GOAWAY, close): the next request opens a
    new connection and succeeds without any retry (the pooled socket's watch reports the
    GOAWAY, so libcurl's liveness check reads it instead of a "quiet" answer)."""
    proxy, log = h2proxy(sluice_factory, tmp_path, None, h2fault.port)
    s = session_via(proxy.url)
    assert s.get(url("/one"), timeout=10).status_code == 200
    h2fault.close_idle = True
    assert wait_until(lambda: 1 in h2fault.ended, 5)
    # The GOAWAY is in the pooled socket now. An exchange Sluice answers itself on its one worker
    # (a CONNECT to a port it does not allow: 403, nothing sent upstream) proves its loop has
    # turned since, so the pooled socket's watch has seen the GOAWAY before /two comes.
    with RawConn(HOST, proxy.port, timeout=10) as c:
        c.send(b"CONNECT 127.0.0.1:9 HTTP/1.1\r\nHost: 127.0.0.1:9\r\n\r\n")
        barrier = c.read_response(timeout=10)
    assert barrier is not None and barrier.status == 403, barrier
    h2fault.close_idle = False
    r = s.get(url("/two"), timeout=10)
    assert r.status_code == 200 and r.text == "ok /two\n"
    assert [q.path for q in h2fault.requests] == ["/one", "/two"] and h2fault.connections == 2
    e = log.wait_for(lambda e: e.get("url", "").endswith("/two"))[0]
    assert e["attempts"] == 1 and e["upstream_connection"] == "new", e


def test_refused_stream_is_retried(sluice_factory, tmp_path, h2fault):
    proxy, _ = h2proxy(sluice_factory, tmp_path, None, h2fault.port)
    h2fault.arm("refuse")
    r = session_via(proxy.url).get(url("/refused"), timeout=10)
    assert r.status_code == 200 and r.text == "ok /refused\n"
    assert h2fault.faults == ["refuse"] and len([q for q in h2fault.requests if q.path == "/refused"]) == 2


def test_refused_post_is_not_resent(sluice_factory, tmp_path, h2fault):
    """libcurl's own resend of a refused stream is not told apart from its resend after a
    lost connection: a request that is not idempotent is never sent twice (502)."""
    proxy, _ = h2proxy(sluice_factory, tmp_path, None, h2fault.port)
    h2fault.arm("refuse")
    r = session_via(proxy.url).post(url("/refused-post"), data=b"once", timeout=10)
    assert r.status_code == 502, (r.status_code, r.text)
    assert len([q for q in h2fault.requests if q.path == "/refused-post"]) == 1


@pytest.mark.parametrize("fault", ["stall", "hang"])
def test_a_client_that_leaves_resets_its_stream_not_the_connection(sluice_factory, tmp_path, h2fault, fault):
    """A client leaves in the middle of its response (stall), or before its head (hang):
    libcurl resets that stream (RST_STREAM), the shared connection keeps serving the next
    request, and it ends cleanly when Sluice stops (EOF after TLS close_notify)."""
    proxy, _ = h2proxy(sluice_factory, tmp_path, None, h2fault.port)
    s = session_via(proxy.url)
    h2fault.arm(fault)  # the first request: the one that opened the connection
    with RawConn(HOST, proxy.port, timeout=10) as c:
        c.send(request_bytes("GET", url("/stalled")))
        if fault == "stall":
            head = c.read_head(timeout=10)
            assert head is not None and head.status == 200, head
        else:
            assert wait_until(lambda: any(q.path == "/stalled" for q in h2fault.requests), 5)
    stalled = next(q for q in h2fault.requests if q.path == "/stalled")
    assert s.get(url("/after"), timeout=10).status_code == 200
    # libcurl 7.88 queues the RST_STREAM; it leaves at the latest with the connection's next frames
    assert wait_until(lambda: stalled.stream in h2fault.stream_resets, 5), h2fault.stream_resets
    assert h2fault.connections == 1 and {q.connection for q in h2fault.requests} == {1}
    proxy.expected_exit = True
    proxy.signal(signal.SIGTERM)
    assert proxy.wait(15) == 0
    assert wait_until(lambda: 1 in h2fault.ended, 5)
    assert h2fault.ended == {1: "eof"}, h2fault.ended


def test_stream_reset_before_the_first_byte_is_retried_by_policy(sluice_factory, tmp_path, h2fault):
    proxy, log = h2proxy(sluice_factory, tmp_path, None, h2fault.port, retry=RETRY)
    h2fault.arm("reset", 2)
    r = session_via(proxy.url).get(url("/reset"), timeout=10)
    assert r.status_code == 200 and r.text == "ok /reset\n"
    assert h2fault.faults == ["reset", "reset"]
    assert len([q for q in h2fault.requests if q.path == "/reset"]) == 3
    e = log.wait_for(lambda e: e.get("url", "").endswith("/reset"))[0]
    assert e["attempts"] == 3 and e["upstream_protocol"] == "HTTP/2", e
    assert len({q.connection for q in h2fault.requests}) == 1, "a stream reset keeps the connection"


def test_stream_reset_of_a_post_is_502_and_never_resent(sluice_factory, tmp_path, h2fault):
    proxy, log = h2proxy(sluice_factory, tmp_path, None, h2fault.port, retry=RETRY)
    h2fault.arm("reset")
    r = session_via(proxy.url).post(url("/post-reset"), data=b"once", timeout=10)
    assert r.status_code == 502, (r.status_code, r.text)
    assert len([q for q in h2fault.requests if q.path == "/post-reset"]) == 1
    e = log.wait_for(lambda e: e.get("url", "").endswith("/post-reset"))[0]
    assert e["attempts"] == 1 and e["status"] == 502, e
