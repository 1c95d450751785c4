"""The retry/OAuth upstreams of resilience_servers.py, used directly (no Sluice): if these fail,
the fault is in the test harness, not in the proxy."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import time
import urllib.parse
from email.utils import parsedate_to_datetime

import pytest

from rawhttp import RawConn, request_bytes
from resilience_servers import (BearerUpstream, Close, FaultUpstream, NotTLSServer, Partial, Reset,
                                RetryAfterDate, Stall, TokenServer)
from support import HOST


def direct(port: int, method: str, path: str, headers=None, body=b"", timeout=5.0, allow_truncated=False):
    with RawConn(HOST, port, timeout=timeout) as c:
        c.send(request_bytes(method, path, headers, body=body, host=f"{HOST}:{port}"))
        return c.read_response(method=method, timeout=timeout, allow_truncated=allow_truncated)


@pytest.fixture
def up():
    s = FaultUpstream()
    yield s
    s.stop()


def test_fault_upstream_script_and_records(up):
    up.fail_then_ok("/s", 2, 503)
    body = os.urandom(5000)
    statuses = [direct(up.port, "POST", "/s?q=1", body=body).status for _ in range(3)]
    assert statuses == [503, 503, 200]
    ts = up.wait_tries("/s", 3)          # t_done is stamped just after the reply is sent
    assert [t.n for t in ts] == [1, 2, 3]
    assert all(t.body == body and t.sha256 == hashlib.sha256(body).hexdigest() for t in ts)
    assert all(t.t_arrival <= t.t_head <= t.t_body <= t.t_done for t in ts)
    assert ts[0].target == "/s?q=1" and ts[0].path == "/s"


def test_fault_upstream_keep_alive_and_default(up):
    with RawConn(HOST, up.port) as c:
        for _ in range(2):
            c.send(request_bytes("GET", "/unscripted", host=f"{HOST}:{up.port}"))
            r = c.read_response()
            assert r.status == 200 and r.header("X-Try") is not None
    assert up.connection_count() == 1 and up.count("/unscripted") == 2


def test_fault_upstream_reset_close_stall_partial(up):
    up.always("/rst", Reset())
    up.always("/fin", Close())
    up.always("/stall", Stall())
    up.always("/partial", Partial(total=5000, send=100, pause=0.05))
    with RawConn(HOST, up.port) as c:
        c.send(request_bytes("GET", "/rst", host="x"))
        assert c.read_response() is None and c.reset
    with RawConn(HOST, up.port) as c:
        c.send(request_bytes("GET", "/fin", host="x"))
        assert c.read_response() is None and c.eof
    c = RawConn(HOST, up.port, timeout=0.4)
    c.send(request_bytes("GET", "/stall", host="x"))
    with pytest.raises(TimeoutError):
        c.read_response(timeout=0.4)
    t_close = time.monotonic()
    c.close()
    ts = up.wait_tries("/stall", 1, timeout=3)
    assert ts[0].t_done and abs(ts[0].t_done - t_close) < 0.2, "stall must record when the peer gave up"
    r = direct(up.port, "GET", "/partial", allow_truncated=True)
    assert r.status == 200 and not r.complete and r.body == b"P" * 100


def test_retry_after_date_action(up):
    up.always("/date", RetryAfterDate(503, ahead=2))
    r = direct(up.port, "GET", "/date")
    when = parsedate_to_datetime(r.header("Retry-After")).timestamp()
    assert 1.8 < when - time.time() <= 2.0
    t = up.tries("/date")[0]
    assert 1.8 < t.expected_delay <= 2.0


def test_not_tls_server_counts_connections():
    s = NotTLSServer()
    try:
        import ssl
        ctx = ssl.create_default_context()
        with socket.create_connection((HOST, s.port), timeout=3) as raw:
            with pytest.raises(ssl.SSLError):
                ctx.wrap_socket(raw, server_hostname="localhost")
        assert s.connection_count() == 1
    finally:
        s.stop()


def _token_post(ts: TokenServer, form: dict, auth=None):
    hdrs = {"Content-Type": "application/x-www-form-urlencoded"}
    if auth:
        hdrs["Authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    return direct(ts.port, "POST", "/token", hdrs, urllib.parse.urlencode(form).encode())


def test_token_server_grants_and_modes():
    ts = TokenServer(client_id="cid", client_secret="sec", expires_in=7, refresh_token="rt-1")
    try:
        r = _token_post(ts, {"grant_type": "client_credentials"}, auth=("cid", "sec"))
        j = json.loads(r.body)
        assert r.status == 200 and j["access_token"] == ts.token(1) and j["expires_in"] == 7
        assert j["token_type"] == "Bearer"
        r = _token_post(ts, {"grant_type": "client_credentials", "client_id": "cid", "client_secret": "sec"})
        assert r.status == 200 and ts.grants() == 2 and ts.current == ts.token(2)
        assert [q.auth_mode for q in ts.all_requests()] == ["basic", "body"]
        assert _token_post(ts, {"grant_type": "client_credentials"}, auth=("cid", "bad")).status == 401
        assert _token_post(ts, {"grant_type": "refresh_token", "refresh_token": "rt-1"}, auth=("cid", "sec")).status == 200
        assert _token_post(ts, {"grant_type": "refresh_token", "refresh_token": "nope"}, auth=("cid", "sec")).status == 400
        ts.mode = "fail"
        assert _token_post(ts, {"grant_type": "client_credentials"}, auth=("cid", "sec")).status == 500
        assert ts.grants() == 3
        port = ts.port
        ts.kill()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((HOST, port), timeout=2).close()
    finally:
        ts.stop()


def test_bearer_upstream_requires_current_token():
    ts = TokenServer(client_id="cid", client_secret="sec")
    b = BearerUpstream(ts)
    try:
        assert direct(b.port, "GET", "/x").status == 401
        _token_post(ts, {"grant_type": "client_credentials"}, auth=("cid", "sec"))
        ok = direct(b.port, "GET", "/x", {"Authorization": f"Bearer {ts.token(1)}"})
        assert ok.status == 200 and json.loads(ok.body)["token"] == ts.token(1)
        _token_post(ts, {"grant_type": "client_credentials"}, auth=("cid", "sec"))
        assert direct(b.port, "GET", "/x", {"Authorization": f"Bearer {ts.token(1)}"}).status == 401  # stale
        b.reject.add(ts.token(2))
        assert direct(b.port, "GET", "/x", {"Authorization": f"Bearer {ts.token(2)}"}).status == 401
        assert [s.accepted for s in b.requests()] == [False, True, False, False]
    finally:
        b.stop()
        ts.stop()
