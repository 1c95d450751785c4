"""HTTPS: absolute-form https:// targets (Sluice speaks TLS upstream, verifying against the
configured CA), CONNECT tunnels, and the access rules (connect_ports, allow_clients, deny)."""

import json
import socket
import ssl
import time

import pytest

from rawhttp import RawConn, request_bytes
from support import (HOST, connect_through, assert_connection_kept, assert_sluice_error, run_curl, send_raw,
                     session_via, wait_until)


# ------------------------------------------------------------------------------------------
# https:// in absolute form over a plaintext client connection
# ------------------------------------------------------------------------------------------

def test_https_absolute_form_verified_with_ca(proxy, nginx):
    with RawConn(HOST, proxy.port) as c:
        c.send(request_bytes("GET", nginx.tls_url("/1k")))
        r = c.read_response()
        assert r.status == 200, r
        assert r.body == nginx.file_1k
        # and again on the same connection
        c.send(request_bytes("GET", nginx.tls_url("/data.json")))
        r = c.read_response()
        assert r.status == 200 and r.body == nginx.json_body


def test_https_absolute_form_without_test_ca_is_502_tls(sluice_factory, nginx, httpbin):
    proxy = sluice_factory({"tls": None})  # system trust store: the test CA is unknown
    r, c = send_raw(proxy.port, request_bytes("GET", nginx.tls_url("/1k")))
    with c:
        assert_sluice_error(r, 502, "TLS")
        assert nginx.file_1k not in r.body
        assert_connection_kept(c, httpbin.port)


def test_https_to_plain_http_port_is_502_tls(proxy, nginx, httpbin):
    """TLS handshake against a server that speaks plain HTTP fails: 502 naming TLS."""
    r, c = send_raw(proxy.port, request_bytes("GET", f"https://{HOST}:{nginx.http_port}/1k"))
    with c:
        assert_sluice_error(r, 502, "TLS")
        assert_connection_kept(c, httpbin.port)


def test_https_certificate_for_another_name_is_502_tls(proxy, nginx, httpbin):
    """nginx's third server has a certificate from the test CA, but for wrong.test only."""
    r, c = send_raw(proxy.port, request_bytes("GET", f"https://{HOST}:{nginx.https_wrong_name_port}/1k"))
    with c:
        assert_sluice_error(r, 502, "TLS")
        assert_connection_kept(c, httpbin.port)


# ------------------------------------------------------------------------------------------
# CONNECT
# ------------------------------------------------------------------------------------------

def test_connect_with_curl(proxy, nginx, pki):
    r = run_curl(["-x", proxy.url, "--cacert", str(pki.ca_pem), nginx.tls_url("/1k")], timeout=20)
    assert r.returncode == 0, r.stderr
    assert r.stdout == nginx.file_1k


def test_connect_with_requests(proxy, nginx, pki):
    s = session_via(proxy.url)
    s.verify = str(pki.ca_pem)
    for _ in range(2):
        r = s.get(nginx.tls_url("/data.json"), timeout=15)
        assert r.status_code == 200
        assert r.json() == json.loads(nginx.json_body)


def test_connect_raw_tunnel_is_transparent(proxy, nginx, pki):
    s = socket.create_connection((HOST, proxy.port), timeout=10)
    try:
        head = connect_through(s, f"{HOST}:{nginx.https_port}")
        assert head.startswith(b"HTTP/1.1 200") or head.startswith(b"HTTP/1.0 200"), head
        assert b"transfer-encoding" not in head.lower() and b"content-length" not in head.lower(), head
        ctx = ssl.create_default_context(cafile=str(pki.ca_pem))
        with ctx.wrap_socket(s, server_hostname=HOST) as t:
            t.settimeout(10)
            for path, expected in (("/1k", nginx.file_1k), ("/data.json", nginx.json_body)):
                t.sendall(f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())
                buf = b""
                while b"\r\n\r\n" not in buf:
                    d = t.recv(65536)
                    assert d, "tunnel closed"
                    buf += d
                h, _, body = buf.partition(b"\r\n\r\n")
                n = int([x for x in h.split(b"\r\n") if x.lower().startswith(b"content-length:")][0].split(b":")[1])
                while len(body) < n:
                    d = t.recv(65536)
                    assert d, "tunnel closed mid-body"
                    body += d
                assert body == expected
    finally:
        s.close()


def test_connect_port_not_allowed_is_403(proxy, recorder, httpbin):
    r, c = send_raw(proxy.port, f"CONNECT {HOST}:{recorder.port} HTTP/1.1\r\nHost: {HOST}:{recorder.port}\r\n\r\n".encode())
    with c:
        assert_sluice_error(r, 403, "port")
        assert_connection_kept(c, httpbin.port)
    time.sleep(0.3)  # window: the refused CONNECT must not open a connection to its destination in it
    assert recorder.connection_count() == 0, "a refused CONNECT reached its destination"


def test_connect_port_allowed_but_refused_is_502(sluice_factory, closed_port, httpbin):
    proxy = sluice_factory({"access": {"connect_ports": [closed_port]}})
    r, c = send_raw(proxy.port, f"CONNECT {HOST}:{closed_port} HTTP/1.1\r\nHost: {HOST}:{closed_port}\r\n\r\n".encode())
    with c:
        assert_sluice_error(r, 502, "refused")


def test_client_not_in_allow_clients_is_refused(sluice_factory, recorder):
    proxy = sluice_factory({"access": {"allow_clients": ["10.9.9.0/24"]}})
    outcome = None
    try:
        with RawConn(HOST, proxy.port, timeout=5) as c:
            c.send(request_bytes("GET", f"http://{HOST}:{recorder.port}/acl"))
            r = c.read_response(timeout=5)
            if r is None:
                outcome = "closed"
            else:
                outcome = f"status {r.status}"
                assert r.status == 403, f"client outside allow_clients got {r!r}"
    except (ConnectionResetError, BrokenPipeError):
        outcome = "reset"
    assert outcome in ("closed", "reset", "status 403"), outcome
    time.sleep(0.3)  # window: the refused client's request must not reach the upstream in it
    assert recorder.connection_count() == 0, "a client outside allow_clients reached the upstream"


def test_client_not_in_allow_clients_connect_refused(sluice_factory, nginx):
    proxy = sluice_factory({"access": {"allow_clients": ["10.9.9.0/24"]}})
    try:
        with RawConn(HOST, proxy.port, timeout=5) as c:
            c.send(f"CONNECT {HOST}:{nginx.https_port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            r = c.read_response(timeout=5)
            assert r is None or r.status == 403, f"client outside allow_clients got {r!r}"
    except (ConnectionResetError, BrokenPipeError):
        pass


# ------------------------------------------------------------------------------------------
# access.deny: checked after DNS
# ------------------------------------------------------------------------------------------

@pytest.fixture
def deny_loopback_proxy(sluice_factory, recorder):
    return sluice_factory({"access": {"deny": ["127.0.0.0/8"], "connect_ports": [recorder.port]}})


def test_deny_by_resolved_address_get(deny_loopback_proxy, recorder):
    # "localhost" is a name: the denial must happen after resolving it
    with RawConn(HOST, deny_loopback_proxy.port) as c:
        for path in ("/a", "/b"):
            c.send(request_bytes("GET", f"http://localhost:{recorder.port}{path}"))
            r = c.read_response()
            assert_sluice_error(r, 403, "denied")  # twice: the connection is kept
    time.sleep(0.3)  # window: the denied requests must not open a connection to the upstream in it
    assert recorder.connection_count() == 0


def test_deny_by_resolved_address_connect(deny_loopback_proxy, recorder):
    r, c = send_raw(deny_loopback_proxy.port,
                    f"CONNECT localhost:{recorder.port} HTTP/1.1\r\nHost: localhost:{recorder.port}\r\n\r\n".encode())
    with c:
        assert_sluice_error(r, 403, "denied")
    time.sleep(0.3)  # window: the denied CONNECT must not open a connection to its destination in it
    assert recorder.connection_count() == 0


# ------------------------------------------------------------------------------------------
# Tunnel byte handling
# ------------------------------------------------------------------------------------------

def read_connect_head(c: RawConn):
    r = c.read_head(timeout=10)
    assert r is not None and r.status == 200, f"CONNECT not established: {r!r}"
    return r


def test_connect_bytes_sent_with_the_connect_head_reach_the_origin(sluice_factory, recorder):
    """A client may send tunnel bytes right behind the CONNECT head, in the same write."""
    proxy = sluice_factory({"access": {"connect_ports": [recorder.port]}})
    with RawConn(HOST, proxy.port) as c:
        c.send(f"CONNECT {HOST}:{recorder.port} HTTP/1.1\r\nHost: {HOST}:{recorder.port}\r\n\r\n".encode()
               + b"GET /inside-tunnel HTTP/1.1\r\nHost: tunnelled\r\n\r\n")
        read_connect_head(c)
        r = c.read_response(timeout=10)
        assert r is not None and r.body == b"recorded", r
    reqs = recorder.requests()
    assert [q["target"] for q in reqs] == ["/inside-tunnel"]
    # inside a tunnel nothing is rewritten: no Via, Host untouched
    assert ("Host", "tunnelled") in reqs[0]["headers"]
    assert not any(k.lower() == "via" for k, _ in reqs[0]["headers"])


def test_connect_origin_closing_flushes_its_data_then_closes(sluice_factory, banner_server):
    proxy = sluice_factory({"access": {"connect_ports": [banner_server.port]}})
    with RawConn(HOST, proxy.port) as c:
        c.send(f"CONNECT {HOST}:{banner_server.port} HTTP/1.1\r\nHost: {HOST}:{banner_server.port}\r\n\r\n".encode())
        read_connect_head(c)
        deadline = time.monotonic() + 10
        while not c.eof and time.monotonic() < deadline:
            c._fill(deadline)
        assert bytes(c.buf) == banner_server.banner, f"got {len(c.buf)} of {len(banner_server.banner)} bytes"
        assert c.eof, "tunnel not closed after the origin closed"


@pytest.mark.parametrize("line", ["CONNECT 127.0.0.1 HTTP/1.1", "CONNECT http://127.0.0.1:443/ HTTP/1.1",
                                  "CONNECT /path HTTP/1.1", "CONNECT 127.0.0.1:notaport HTTP/1.1"])
def test_connect_malformed_authority_is_400(proxy, line):
    r, c = send_raw(proxy.port, (line + "\r\nHost: 127.0.0.1\r\n\r\n").encode())
    with c:
        assert_sluice_error(r, 400, "bad request")


def test_connect_by_host_name(proxy, nginx, pki):
    r = run_curl(["-x", proxy.url, "--cacert", str(pki.ca_pem), f"https://localhost:{nginx.https_port}/1k"],
                 timeout=20)
    assert r.returncode == 0, r.stderr
    assert r.stdout == nginx.file_1k


def test_connect_tunnel_full_duplex_64mib(sluice_factory, echo_server):
    """64 MiB pushed through a tunnel to an echo server while the echo is read concurrently:
    both directions flow, byte for byte, with backpressure and no deadlock. (No half-close:
    RFC 9110 §9.3.6 lets a tunnel close both sides when one side closes.)"""
    import hashlib
    import threading
    proxy = sluice_factory({"access": {"connect_ports": [echo_server.port]}})
    size = 64 << 20
    block = hashlib.sha256(b"dup").digest() * 8192  # 256 KiB
    with RawConn(HOST, proxy.port, timeout=30) as c:
        c.send(f"CONNECT {HOST}:{echo_server.port} HTTP/1.1\r\nHost: {HOST}:{echo_server.port}\r\n\r\n".encode())
        read_connect_head(c)
        sent_hash = hashlib.sha256()
        errors = []

        def writer():
            try:
                for _ in range(size // len(block)):
                    c.sock.sendall(block)
                    sent_hash.update(block)
            except OSError as e:
                errors.append(repr(e))

        t = threading.Thread(target=writer, daemon=True)
        t.start()
        got_hash = hashlib.sha256()
        got_hash.update(bytes(c.buf))
        got = len(c.buf)
        c.buf.clear()
        deadline = time.monotonic() + 60
        while got < size and time.monotonic() < deadline:
            d = c.sock.recv(1 << 20)
            if not d:
                break
            got_hash.update(d)
            got += len(d)
        t.join(timeout=10)
    assert not errors, errors
    assert got == size, f"echoed {got} of {size} bytes"
    assert got_hash.hexdigest() == sent_hash.hexdigest()


def test_connect_client_abort_closes_origin_side(sluice_factory, slow_forever_server):
    proxy = sluice_factory({"access": {"connect_ports": [slow_forever_server.port]}})
    c = RawConn(HOST, proxy.port, timeout=10)
    try:
        c.send(f"CONNECT {HOST}:{slow_forever_server.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        read_connect_head(c)
        c.send(b"GET /forever HTTP/1.1\r\nHost: x\r\n\r\n")
        deadline = time.monotonic() + 10
        while len(c.buf) < 64 * 1024 and time.monotonic() < deadline:
            assert c._fill(deadline)
    finally:
        c.close()
    t_close = time.monotonic()
    rec = slow_forever_server.connections[0]
    assert wait_until(lambda: rec.closed_at is not None, 6), \
        "origin side of the tunnel still open 6 s after the client left"
    assert rec.closed_at - t_close < 2.0, f"origin saw the close {rec.closed_at - t_close:.2f}s late"
