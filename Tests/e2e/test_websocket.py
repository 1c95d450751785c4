"""WebSocket and other upgrades (policy key `upgrades:`, docs/configuration.md "Upgrades").

A real WebSocket server (Python `websockets`, plain and TLS with the test PKI) and real
`websockets` clients, through every path Sluice itself forwards:

- a gateway route (origin-form, the client talks to the route listener directly);
- the forward listener with an absolute-form handshake (`GET http://host:port/echo`), which a
  browser never sends but any HTTP client configured with a plain proxy does;
- an intercepted host (`intercept: true`): CONNECT, TLS to Sluice's minted leaf, then the
  handshake; Sluice speaks TLS to the origin itself, with the host's trust settings.

What is proved: 10,000 echoes on each path (the adapter's header reached the origin's
handshake, the access log has one line with status 101 and the bytes both ways), a 64 MiB
binary message (plain and intercepted), the close handshake with its code and reason, a
client that stops reading (the origin is held back instead of Sluice buffering; plain and
intercepted), the idle timeout, a non-101 answer relayed whole, `upgrades: []` and other
protocols (the request goes on without `Upgrade`, so the origin refuses it), the handshake
as an exchange (a 503 retried, a refused origin's 502, a silent one's 504, the origin's
certificate evaluated), and the origin connection reached as libcurl reaches any (a TLS
route upstream, a parent proxy through CONNECT).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import ssl
import threading
import time

import pytest
from websockets.client import ClientProtocol
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.http11 import Response
from websockets.sync.client import ClientConnection, connect
from websockets.sync.server import serve
from websockets.uri import parse_uri

from faultservers import pick_port
from policy_support import AccessLog, run_check, write_yaml
from support import HOST, proc_status, wait_until

ADAPTER = {"headers": {"set": {"X-Sluice-WS": "adapted"}}}
ECHOES = 10_000
BATCH = 200


# ------------------------------------------------------------------------------------------
# The origin: a websockets echo server that records every handshake it was sent
# ------------------------------------------------------------------------------------------


class EchoServer:
    """`/echo` echoes; `/flood?n=N&size=S` sends N binary messages of S bytes after the first
    message it receives, counting what its sends returned for. `/refuse` answers 403."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None):
        self.port = pick_port()
        self.requests: list[tuple[str, Headers]] = []
        self.close_codes: list[tuple[int | None, str | None]] = []
        self.flood_sent = 0
        self.flood_done = threading.Event()
        self.closed = threading.Event()
        self.server = serve(self._handler, HOST, self.port, ssl=ssl_context, max_size=None,
                            process_request=self._process_request, ping_interval=None)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _process_request(self, connection, request):
        self.requests.append((request.path, request.headers))
        if request.path == "/refuse":
            return connection.respond(403, "refused by the origin\n")
        if request.path == "/flaky" and len(self.requests) == 1:
            return connection.respond(503, "not yet\n")
        return None

    def _handler(self, ws):
        try:
            if ws.request.path.startswith("/flood"):
                query = dict(p.split("=") for p in ws.request.path.split("?", 1)[1].split("&"))
                n, size = int(query["n"]), int(query["size"])
                ws.recv()
                chunk = os.urandom(size)
                for _ in range(n):
                    ws.send(chunk)
                    self.flood_sent += size
                self.flood_done.set()
            for message in ws:
                ws.send(message)
        except ConnectionClosed:
            pass
        finally:
            self.close_codes.append((ws.close_code, ws.close_reason))
            self.closed.set()

    def upgrades(self) -> list[Headers]:
        return [h for _, h in self.requests if h.get("Upgrade", "").lower() == "websocket"]

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(5)


@pytest.fixture
def echo():
    s = EchoServer()
    yield s
    s.stop()


@pytest.fixture
def tls_echo(pki):
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(pki.chain_pem), str(pki.leaf_key))
    s = EchoServer(ctx)
    yield s
    s.stop()


# ------------------------------------------------------------------------------------------
# Clients
# ------------------------------------------------------------------------------------------


class AbsoluteFormProtocol(ClientProtocol):
    """A client whose handshake names the whole URL (`GET http://host:port/path HTTP/1.1`),
    as a request to a forward proxy does."""

    def connect(self):
        request = super().connect()
        request.path = f"http://{self.uri.host}:{self.uri.port}{request.path}"
        return request


def via_absolute_form(proxy_port: int, url: str, **kw) -> ClientConnection:
    sock = socket.create_connection((HOST, proxy_port), timeout=10)
    sock.settimeout(None)
    protocol = AbsoluteFormProtocol(parse_uri(url), max_size=kw.pop("max_size", 1 << 20))
    conn = ClientConnection(sock, protocol, ping_interval=None, **kw)
    conn.handshake(timeout=10)
    return conn


def via_interception(proxy_port: int, url: str, ca_pem, **kw) -> ClientConnection:
    """CONNECT, then TLS to Sluice's leaf (trusting only Sluice's CA), then the handshake."""
    u = parse_uri(url)
    sock = socket.create_connection((HOST, proxy_port), timeout=10)
    sock.sendall(f"CONNECT {u.host}:{u.port} HTTP/1.1\r\nHost: {u.host}:{u.port}\r\n\r\n".encode())
    answer = b""
    while b"\r\n\r\n" not in answer:
        data = sock.recv(4096)
        assert data, f"CONNECT answer cut short: {answer!r}"
        answer += data
    assert answer.startswith(b"HTTP/1.1 200"), answer
    sock.settimeout(None)
    ctx = ssl.create_default_context(cafile=str(ca_pem))
    return connect(url, sock=sock, ssl=ctx, proxy=None, ping_interval=None, open_timeout=10, **kw).__enter__()


def echo_many(ws: ClientConnection, count: int = ECHOES) -> int:
    """Sends `count` numbered text messages in batches and checks each echo, in order."""
    done = 0
    while done < count:
        n = min(BATCH, count - done)
        for i in range(done, done + n):
            ws.send(f"message {i}")
        for i in range(done, done + n):
            got = ws.recv(timeout=10)
            assert got == f"message {i}", f"echo {i}: got {got!r}"
        done += n
    return done


def upgrade_lines(log: AccessLog, n: int = 1, timeout: float = 10.0) -> list[dict]:
    return log.wait_for(lambda e: e.get("status") == 101, n=n, timeout=timeout)


# ------------------------------------------------------------------------------------------
# Starting Sluice
# ------------------------------------------------------------------------------------------


def forward_proxy(sluice_factory, tmp_path, policy: dict | None = None, extra: dict | None = None, hosts=(HOST,)):
    log = tmp_path / "access.log"
    entry = {"adapters": [ADAPTER], **(policy or {})}
    cfg = {"monitors": [{"access_log": {"path": str(log)}}], "policies": {h: dict(entry) for h in hosts}}
    cfg.update(extra or {})
    return sluice_factory(cfg), AccessLog(log)


def intercepting_proxy(sluice_factory, tls_echo, tmp_path, pki, ca_file=True):
    """Sluice intercepting CONNECTs to localhost, with a fresh CA in tmp_path/sluice-ca."""
    from test_intercept import out, sluice_cli
    ca = tmp_path / "sluice-ca"
    r = sluice_cli("ca", "init", "--dir", str(ca))
    assert r.returncode == 0, out(r)
    return forward_proxy(sluice_factory, tmp_path, policy={"intercept": True}, hosts=("localhost",),
                         extra={"tls": {"ca_dir": str(ca), "ca_file": str(pki.ca_pem) if ca_file else None},
                                "access": {"connect_ports": [tls_echo.port]}})


# ------------------------------------------------------------------------------------------
# The origin itself (no Sluice): if this fails, the fixture is broken, not the proxy
# ------------------------------------------------------------------------------------------


def test_echo_server_direct(echo):
    with connect(f"ws://{HOST}:{echo.port}/echo", proxy=None, ping_interval=None) as ws:
        assert echo_many(ws, 10) == 10
    assert len(echo.upgrades()) == 1


# ------------------------------------------------------------------------------------------
# 10,000 echoes on each path
# ------------------------------------------------------------------------------------------


def test_echo_through_route(sluice_factory, echo, tmp_path):
    rport = pick_port()
    log = tmp_path / "access.log"
    sluice_factory({"routes": [{"listen": f"{HOST}:{rport}", "upstream": f"http://{HOST}:{echo.port}"}],
                    "monitors": [{"access_log": {"path": str(log)}}],
                    "policies": {HOST: {"adapters": [ADAPTER]}}})
    started = time.monotonic()
    # No permessage-deflate here, so that the byte counts can be checked exactly enough.
    with connect(f"ws://{HOST}:{rport}/echo", proxy=None, ping_interval=None, open_timeout=10,
                 compression=None) as ws:
        assert echo_many(ws) == ECHOES
    elapsed = time.monotonic() - started
    print(f"{ECHOES} echoes through a route: {elapsed:.2f} s")
    assert elapsed < 60, f"{ECHOES} echoes took {elapsed:.1f} s"
    handshakes = echo.upgrades()
    assert len(handshakes) == 1, f"the origin saw {len(echo.requests)} requests: {echo.requests}"
    h = handshakes[0]
    assert h["X-Sluice-WS"] == "adapted", h
    assert "sluice" in h.get("Via", "").lower(), h
    assert "upgrade" in h["Connection"].lower(), h
    assert "Sec-WebSocket-Key" in h, h
    line = upgrade_lines(AccessLog(log))[0]
    assert line["method"] == "GET" and line["outcome"] == "tunnel", line
    # Every message went both ways: its payload plus the frame's head (2 bytes, and the
    # client's 4-byte mask), the close frames on top.
    payload = sum(len(f"message {i}") for i in range(ECHOES))
    assert payload + 6 * ECHOES <= line["bytes_in"] <= payload + 6 * ECHOES + 64, line
    assert payload + 2 * ECHOES <= line["bytes_out"] <= payload + 2 * ECHOES + 64, line


def test_echo_through_absolute_form(sluice_factory, echo, tmp_path):
    proxy, log = forward_proxy(sluice_factory, tmp_path)
    started = time.monotonic()
    with via_absolute_form(proxy.port, f"ws://{HOST}:{echo.port}/echo") as ws:
        assert echo_many(ws) == ECHOES
    print(f"{ECHOES} echoes through absolute-form: {time.monotonic() - started:.2f} s")
    [h] = echo.upgrades()
    assert h["X-Sluice-WS"] == "adapted", h
    path, _ = echo.requests[0]
    assert path == "/echo", f"the origin was sent {path!r}, not origin-form"
    line = upgrade_lines(log)[0]
    assert line["url"] == f"http://{HOST}:{echo.port}/echo", line
    assert line["outcome"] == "tunnel" and line["bytes_out"] > 0, line


def test_echo_through_interception(sluice_factory, tls_echo, tmp_path, pki):
    proxy, log = intercepting_proxy(sluice_factory, tls_echo, tmp_path, pki)
    ca = tmp_path / "sluice-ca"
    with via_interception(proxy.port, f"wss://localhost:{tls_echo.port}/echo", ca / "ca.pem") as ws:
        assert echo_many(ws) == ECHOES
    [h] = tls_echo.upgrades()
    assert h["X-Sluice-WS"] == "adapted", h
    line = upgrade_lines(log)[0]
    assert line["url"] == f"https://localhost:{tls_echo.port}/echo", line


def test_intercepted_origin_trust_is_applied(sluice_factory, tls_echo, tmp_path, pki):
    """Without the test CA (system CAs only) the origin's certificate is refused: 502, and
    no handshake reached the origin."""
    proxy, log = intercepting_proxy(sluice_factory, tls_echo, tmp_path, pki, ca_file=False)
    ca = tmp_path / "sluice-ca"
    with pytest.raises(InvalidStatus) as e:
        via_interception(proxy.port, f"wss://localhost:{tls_echo.port}/echo", ca / "ca.pem")
    assert e.value.response.status_code == 502, e.value.response
    assert b"TLS" in e.value.response.body or b"certificate" in e.value.response.body, e.value.response.body
    assert tls_echo.upgrades() == []


# ------------------------------------------------------------------------------------------
# Big messages, closing, backpressure, idle
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["absolute-form", "intercepted"])
def test_64_mib_binary_message(sluice_factory, echo, tls_echo, tmp_path, pki, path):
    message = os.urandom(64 << 20)
    if path == "intercepted":
        proxy, log = intercepting_proxy(sluice_factory, tls_echo, tmp_path, pki)
        ws = via_interception(proxy.port, f"wss://localhost:{tls_echo.port}/echo", tmp_path / "sluice-ca" / "ca.pem",
                              max_size=None, compression=None)
    else:
        proxy, log = forward_proxy(sluice_factory, tmp_path)
        ws = via_absolute_form(proxy.port, f"ws://{HOST}:{echo.port}/echo", max_size=None)
    with ws:
        started = time.monotonic()
        ws.send(message)
        got = ws.recv(timeout=60)
        print(f"{path}: 64 MiB echoed in {time.monotonic() - started:.2f} s")
    assert isinstance(got, bytes) and len(got) == len(message), len(got)
    assert hashlib.sha256(got).digest() == hashlib.sha256(message).digest()
    line = upgrade_lines(log)[0]
    assert line["bytes_in"] >= 64 << 20 and line["bytes_out"] >= 64 << 20, line


def test_close_handshake(sluice_factory, echo, tmp_path):
    proxy, log = forward_proxy(sluice_factory, tmp_path)
    with via_absolute_form(proxy.port, f"ws://{HOST}:{echo.port}/echo") as ws:
        assert echo_many(ws, 3) == 3
        ws.close(code=4001, reason="done here")
    assert echo.closed.wait(10), "the origin never saw the connection close"
    assert echo.close_codes == [(4001, "done here")], echo.close_codes
    # The client got the origin's close frame back (a clean close, not a cut connection).
    assert ws.protocol.close_rcvd is not None and ws.protocol.close_rcvd.code == 4001, ws.protocol.close_rcvd
    line = upgrade_lines(log)[0]
    assert line["outcome"] == "tunnel" and line.get("error") is None, json.dumps(line)


@pytest.mark.parametrize("path", ["absolute-form", "intercepted"])
def test_client_that_stops_reading(sluice_factory, echo, tls_echo, tmp_path, pki, path):
    """The origin floods 96 MiB at a client that reads nothing: Sluice stops reading the
    origin (its sends block) instead of buffering; once the client reads, all of it arrives.
    Intercepted, both sides of Sluice are TLS (a bufferevent to the client, libcurl's to the
    origin)."""
    n, size = 96, 1 << 20
    if path == "intercepted":
        proxy, log = intercepting_proxy(sluice_factory, tls_echo, tmp_path, pki)
        origin = tls_echo
        ws = via_interception(proxy.port, f"wss://localhost:{tls_echo.port}/flood?n={n}&size={size}",
                              tmp_path / "sluice-ca" / "ca.pem", max_size=None, max_queue=1, compression=None)
    else:
        proxy, log = forward_proxy(sluice_factory, tmp_path)
        origin = echo
        ws = via_absolute_form(proxy.port, f"ws://{HOST}:{echo.port}/flood?n={n}&size={size}", max_size=None,
                               max_queue=1).__enter__()
    rss_before = proc_status(proxy.pid)["VmRSS"]
    ws.send("go")
    # The client's own library reads into its queue of one message and stops: the rest
    # stays in sockets and in Sluice, bounded by its watermarks.
    assert wait_until(lambda: origin.flood_sent >= 4 * size, 10), f"the origin sent only {origin.flood_sent} bytes"
    time.sleep(2)  # window: the origin must not get the 96 MiB out, nor Sluice's RSS grow with it, in it
    stalled = origin.flood_sent
    rss_stalled = proc_status(proxy.pid)["VmRSS"]
    assert not origin.flood_done.is_set(), "the origin sent all 96 MiB to a client that read nothing"
    assert stalled <= 48 * size, f"the origin sent {stalled >> 20} MiB to a client that read nothing"
    growth_mib = (rss_stalled - rss_before) / 1024
    assert growth_mib < 24, f"Sluice's RSS grew {growth_mib:.1f} MiB while the client did not read"
    received = 0
    for _ in range(n):
        received += len(ws.recv(timeout=30))
    ws.close()
    assert received == n * size
    assert origin.flood_done.wait(10)
    print(f"{path}: stalled at {stalled >> 20} MiB sent; RSS grew {growth_mib:.1f} MiB while stalled")


def test_idle_timeout(sluice_factory, echo, tmp_path):
    proxy, log = forward_proxy(sluice_factory, tmp_path,
                               policy={"upgrades": {"allow": ["websocket"], "idle_timeout": "1s"}})
    with via_absolute_form(proxy.port, f"ws://{HOST}:{echo.port}/echo") as ws:
        assert echo_many(ws, 2) == 2
        started = time.monotonic()
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=15)
    waited = time.monotonic() - started
    assert 0.8 <= waited < 10, f"closed after {waited:.1f} s, idle_timeout is 1 s"
    line = upgrade_lines(log)[0]
    assert "idle" in (line.get("error") or ""), line
    assert echo.closed.wait(10), "the origin connection stayed open after the idle timeout"


# ------------------------------------------------------------------------------------------
# Answers other than 101, and policies that do not allow the upgrade
# ------------------------------------------------------------------------------------------


def test_non_101_answer_is_relayed(sluice_factory, echo, tmp_path):
    proxy, log = forward_proxy(sluice_factory, tmp_path)
    with pytest.raises(InvalidStatus) as e:
        via_absolute_form(proxy.port, f"ws://{HOST}:{echo.port}/refuse")
    response: Response = e.value.response
    assert response.status_code == 403, response
    assert response.body == b"refused by the origin\n", response.body
    assert "sluice" in response.headers.get("Via", "").lower(), response.headers
    assert len(echo.requests) == 1
    line = log.wait_for(lambda e: e.get("status") == 403)[0]
    assert line["outcome"] == "ok", line


def test_upgrades_empty_list_forwards_without_upgrade(sluice_factory, echo, tmp_path):
    proxy, log = forward_proxy(sluice_factory, tmp_path, policy={"upgrades": []})
    with pytest.raises(InvalidStatus) as e:
        via_absolute_form(proxy.port, f"ws://{HOST}:{echo.port}/echo")
    assert e.value.response.status_code != 101
    assert len(echo.requests) == 1, echo.requests
    _, h = echo.requests[0]
    assert "Upgrade" not in h and "upgrade" not in h.get("Connection", "").lower(), h
    assert h["X-Sluice-WS"] == "adapted", h  # it went through the plain pipeline
    assert echo.upgrades() == []


def test_default_policy_allows_websocket_only(sluice_factory, echo, tmp_path):
    """Without `upgrades:` WebSocket is carried; another protocol (`h2c`) is not: the request
    goes on without `Upgrade`."""
    proxy, log = forward_proxy(sluice_factory, tmp_path)
    sock = socket.create_connection((HOST, proxy.port), timeout=10)
    sock.sendall(f"GET http://{HOST}:{echo.port}/echo HTTP/1.1\r\nHost: {HOST}:{echo.port}\r\n"
                 "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"
                 "\r\n".encode())
    answer = b""
    while b"\r\n\r\n" not in answer:
        data = sock.recv(4096)
        if not data:
            break
        answer += data
    sock.close()
    assert not answer.startswith(b"HTTP/1.1 101"), answer
    assert len(echo.requests) == 1
    _, h = echo.requests[0]
    assert "Upgrade" not in h, h


# ------------------------------------------------------------------------------------------
# The origin connection is libcurl's: TLS to a route's https upstream, and a parent proxy
# ------------------------------------------------------------------------------------------


def test_route_to_tls_origin(sluice_factory, tls_echo, tmp_path):
    """A route whose upstream is https: Sluice speaks TLS to the origin (tls.ca_file trusts
    the test CA), the client speaks plain ws:// to the route."""
    rport = pick_port()
    sluice_factory({"routes": [{"listen": f"{HOST}:{rport}", "upstream": f"https://localhost:{tls_echo.port}"}]})
    with connect(f"ws://{HOST}:{rport}/echo", proxy=None, ping_interval=None, open_timeout=10) as ws:
        assert echo_many(ws, 1000) == 1000
    assert len(tls_echo.upgrades()) == 1


def test_through_parent_proxy(sluice_factory, echo, tmp_path):
    """`upstream_proxy`: the origin connection is a CONNECT through the parent (here a second
    Sluice, which tunnels it byte for byte and logs the CONNECT)."""
    parent_log = tmp_path / "parent-access.log"
    parent = sluice_factory({"access": {"connect_ports": [echo.port]},
                             "monitors": [{"access_log": {"path": str(parent_log)}}]}, name="parent")
    proxy, log = forward_proxy(sluice_factory, tmp_path,
                               policy={"upstream_proxy": {"url": f"http://{HOST}:{parent.port}"}})
    with via_absolute_form(proxy.port, f"ws://{HOST}:{echo.port}/echo") as ws:
        assert echo_many(ws, 1000) == 1000
    assert len(echo.upgrades()) == 1
    connects = AccessLog(parent_log).wait_for(lambda e: e.get("method") == "CONNECT")
    assert connects[0]["url"] == f"{HOST}:{echo.port}", connects
    assert upgrade_lines(log)[0]["outcome"] == "tunnel"


# ------------------------------------------------------------------------------------------
# The handshake is an exchange: retries, failures, the per-try timeout
# ------------------------------------------------------------------------------------------


def test_handshake_answered_503_is_retried(sluice_factory, echo, tmp_path):
    proxy, log = forward_proxy(sluice_factory, tmp_path, policy={"retry": {"limit": 2, "backoff": {"scale": "10ms"}}})
    with via_absolute_form(proxy.port, f"ws://{HOST}:{echo.port}/flaky") as ws:
        assert echo_many(ws, 5) == 5
    assert [p for p, _ in echo.requests] == ["/flaky", "/flaky"], echo.requests
    line = upgrade_lines(log)[0]
    assert line["attempts"] == 2 and line["retries"][0]["reason"].startswith("status 503"), json.dumps(line)


def test_refused_origin_is_a_502_and_the_connection_stays(sluice_factory, tmp_path):
    proxy, log = forward_proxy(sluice_factory, tmp_path)
    closed = pick_port()
    with pytest.raises(InvalidStatus) as e:
        via_absolute_form(proxy.port, f"ws://{HOST}:{closed}/echo")
    assert e.value.response.status_code == 502, e.value.response
    assert b"refused" in e.value.response.body, e.value.response.body
    assert log.wait_for(lambda e: e.get("status") == 502)[0]["outcome"] == "error"


def test_origin_that_never_answers_is_a_504(sluice_factory, stall_server, tmp_path):
    proxy, log = forward_proxy(sluice_factory, tmp_path, extra={"timeouts": {"upstream_per_try": "1s", "drain": "5s"}})
    started = time.monotonic()
    with pytest.raises(InvalidStatus) as e:
        via_absolute_form(proxy.port, f"ws://{HOST}:{stall_server.port}/echo")
    assert e.value.response.status_code == 504, e.value.response
    assert b"no response head in time" in e.value.response.body, e.value.response.body
    assert time.monotonic() - started < 10
    assert wait_until(lambda: b"Upgrade: websocket" in stall_server.received(), 5), stall_server.received()


def test_check_host_describes_upgrades(sluice_bin, tmp_path):
    cfg = write_yaml(tmp_path / "c.yaml", {"policies": {
        "default": {"upgrades": {"allow": ["websocket", "h2c"], "idle_timeout": "90s"}},
        "api.test": {"upgrades": []}}})
    r = run_check(cfg, host="www.test")
    assert r.returncode == 0, r.stderr
    assert "upgrades: websocket, h2c, idle timeout 90000 ms" in r.stdout, r.stdout
    r = run_check(cfg, host="api.test")
    assert "  upgrades: none\n" in r.stdout, r.stdout


def test_upgrade_to_a_denied_address_is_refused(sluice_factory, echo, tmp_path):
    """`access.deny` holds for an upgrade's origin connection (checked after DNS, before a
    socket exists): 403, and nothing reached the origin."""
    proxy, log = forward_proxy(sluice_factory, tmp_path, extra={"access": {"deny": ["127.0.0.0/8"]}})
    with pytest.raises(InvalidStatus) as e:
        via_absolute_form(proxy.port, f"ws://{HOST}:{echo.port}/echo")
    assert e.value.response.status_code == 403, e.value.response
    assert b"denied" in e.value.response.body, e.value.response.body
    assert echo.requests == []


def test_circuit_breaking_counts_handshakes(sluice_factory, tmp_path):
    """`health:` sees an upgrade's try like any other: a refused origin opens the circuit, and
    the next handshake fails fast with 503 without a connection attempt."""
    proxy, log = forward_proxy(sluice_factory, tmp_path, policy={"health": {"consecutive_failures": 1, "cooldown": "60s"}})
    closed = pick_port()
    for expected in (502, 503):
        with pytest.raises(InvalidStatus) as e:
            via_absolute_form(proxy.port, f"ws://{HOST}:{closed}/echo")
        assert e.value.response.status_code == expected, e.value.response
    assert b"circuit is open" in e.value.response.body, e.value.response.body


def test_handshakes_bypass_the_shared_cache(sluice_factory, echo, tmp_path):
    """With a cache_store, every handshake reaches the origin and gets its own 101 (an upgrade
    is never answered from, nor stored in, the cache; docs/caching.md)."""
    proxy, log = forward_proxy(sluice_factory, tmp_path, extra={"cache_store": {"memory": "8MiB"}})
    for _ in range(3):
        with via_absolute_form(proxy.port, f"ws://{HOST}:{echo.port}/echo") as ws:
            assert echo_many(ws, 3) == 3
    assert len(echo.upgrades()) == 3
    assert all("cache" not in line for line in upgrade_lines(log, n=3)), "an upgrade went through the cache"
