"""Faults with nothing lost: each fault against a counting origin, with the
client-visible outcome checked exactly and the origin's request count where it matters.

- the origin resets mid-body: the client sees the head, the bytes that came, then a close
  before the advertised length (Content-Length) or without the last chunk (chunked) — never a
  complete-looking response; curl and requests report an error;
- the origin stalls mid-body: `timeouts.total` ends it, the client is told by a close;
- the client aborts mid-upload or mid-download: the origin's transfer stops within 1 s;
- a POST is sent once whatever the fault, with or without a retry policy (and libcurl's own
  "connection died, retrying" on a reused connection does not resend it);
- SIGHUP every 100 ms, then SIGTERM, while 64 connections run requests: every response is
  byte-exact, nothing is answered twice or lost;
- an access log on a full disk or an unwritable path: Sluice keeps serving and says so once;
- out of descriptors (RLIMIT_NOFILE 256, 1000 clients): no crash, no busy loop, a clear 503
  when no upstream socket can be opened, accepts resume, one log line per episode.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import resource
import select
import signal
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests
import yaml

from conftest import SLUICE_BIN, Sluice, deep_merge, kill_tree, spawn, wait_port
from faultservers import SlowForeverServer, pick_port
from policy_support import AccessLog, monitors, read_config, sighup, stderr_len, stderr_since, write_config_text
from rawhttp import RawConn, request_bytes
from resilience_servers import (Chunked, Close, FaultUpstream, NoReadBody, Partial, PartialChunked, PartialClose,
                                Reply, Reset, Stall, StallMidBody, Try)
from resilience_support import fault, fetch, log_entry, settle_no_more_tries, start_proxy  # noqa: F401
from support import HOST, MiB, assert_sluice_error, clean_env, run_curl, session_via, tail, wait_until

# A policy that retries everything it can — except that `methods` is left at its default.
RETRY_ALL_BUT_METHODS = {"limit": 3, "backoff": {"scale": "50ms", "jitter": "none"},
                         "statuses": [500, 502, 503, 504], "errors": ["refused", "dns", "timeout", "reset", "tls"]}
POLICIES = {"none": None, "retry-empty": {"retry": {}}, "retry-all": {"retry": RETRY_ALL_BUT_METHODS}}


def proxy_with(sluice_factory, tmp_path, policy: str = "none", extra: dict | None = None):
    return start_proxy(sluice_factory, tmp_path, POLICIES[policy], extra=extra)


def assert_cut_short(r, c: RawConn, framing: str, body: bytes) -> None:
    """The client got the head, exactly `body`, and then the connection closed: a
    Content-Length response shorter than advertised, or a chunked one without its last chunk."""
    assert r is not None, "the connection closed without any response"
    assert r.status == 200, r
    assert r.framing == framing, f"framing {r.framing}, expected {framing}: {r!r}"
    assert not r.complete, f"a cut-off upstream body reached the client as a complete response: {r!r}"
    assert r.body == body, f"body {len(r.body)} bytes {r.body[:40]!r}…, expected {len(body)} bytes"
    if framing == "length":
        assert int(r.header("content-length")) > len(r.body), r
    assert c.eof, "the connection is still open after a cut-off response"


# ------------------------------------------------------------------------------------------
# The origin resets mid-body
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("policy", ["none", "retry-all"])
def test_reset_mid_body_content_length_is_cut_short(sluice_factory, tmp_path, fault, policy):
    fault.always("/cl", Partial(total=100_000, send=1000))
    p = proxy_with(sluice_factory, tmp_path, policy)
    with RawConn(HOST, p.port, timeout=15) as c:
        c.send(request_bytes("GET", fault.url + "/cl"))
        r = c.read_response(allow_truncated=True, timeout=15)
        assert_cut_short(r, c, "length", b"P" * 1000)
        assert r.header("content-length") == "100000", r
    settle_no_more_tries(fault, "/cl", 1)
    e = log_entry(p, "/cl")
    assert e["status"] == 200 and e["outcome"] == "upstream_aborted" and e["bytes_out"] == 1000, e


@pytest.mark.parametrize("policy", ["none", "retry-all"])
def test_reset_mid_body_chunked_lacks_the_last_chunk(sluice_factory, tmp_path, fault, policy):
    fault.always("/chunked", PartialChunked([b"a" * 100, b"b" * 2000]))
    p = proxy_with(sluice_factory, tmp_path, policy)
    with RawConn(HOST, p.port, timeout=15) as c:
        c.send(request_bytes("GET", fault.url + "/chunked"))
        r = c.read_response(allow_truncated=True, timeout=15)
        assert_cut_short(r, c, "chunked", b"a" * 100 + b"b" * 2000)
    settle_no_more_tries(fault, "/chunked", 1)
    assert log_entry(p, "/chunked")["outcome"] == "upstream_aborted"


def test_reset_mid_close_delimited_body_is_never_a_clean_end(sluice_factory, tmp_path, fault):
    """A close-delimited upstream body ends with a FIN; cut by a RST it is a truncation. An
    HTTP/1.1 client gets it chunked, without the last chunk; an HTTP/1.0 client, for which
    only the connection's end frames the body, gets a reset (a FIN would read as complete)."""
    fault.always("/close", PartialClose(send=1000))
    p = proxy_with(sluice_factory, tmp_path)
    with RawConn(HOST, p.port, timeout=15) as c:
        c.send(request_bytes("GET", fault.url + "/close"))
        r = c.read_response(allow_truncated=True, timeout=15)
        assert_cut_short(r, c, "chunked", b"Q" * 1000)
    with RawConn(HOST, p.port, timeout=15) as c:
        c.send(request_bytes("GET", fault.url + "/close", version="HTTP/1.0"))
        r = c.read_response(allow_truncated=True, timeout=15)
        assert r is not None and r.status == 200 and r.framing == "close", r
        assert c.reset, f"an HTTP/1.0 client saw a clean close after a cut-off body ({len(r.body)} bytes)"
    settle_no_more_tries(fault, "/close", 2)


def test_reset_mid_body_curl_and_requests_report_errors(sluice_factory, tmp_path, fault):
    fault.always("/cl-curl", Partial(total=100_000, send=1000))
    fault.always("/ch-curl", PartialChunked([b"x" * 500]))
    p = proxy_with(sluice_factory, tmp_path, "retry-empty")
    for path, code in (("/cl-curl", 18), ("/ch-curl", 18)):
        r = run_curl(["-x", p.url, "-o", "/dev/null", "-w", "%{http_code} %{size_download}", fault.url + path],
                     timeout=20)
        # 18: partial file (Content-Length); a chunked body cut short is 18 too (curl 7.88)
        # or 56 (recv failure) on other versions: anything but success.
        assert r.returncode in (code, 56), f"curl exit {r.returncode} for {path}: {r.stdout!r} {r.stderr!r}"
        assert r.stdout.startswith(b"200 "), r.stdout
    s = session_via(p.url)
    for path in ("/cl-curl", "/ch-curl"):
        with pytest.raises(requests.exceptions.RequestException):
            s.get(fault.url + path, timeout=20).content  # noqa: B018 - reading the body raises
    settle_no_more_tries(fault, "/cl-curl", 2)
    settle_no_more_tries(fault, "/ch-curl", 2, wait=0)


# ------------------------------------------------------------------------------------------
# The origin stalls mid-body
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_stall_mid_body_is_ended_by_the_total_timeout_with_a_close(sluice_factory, tmp_path, fault, framing):
    path = f"/stall-{framing}"
    fault.always(path, StallMidBody(framing=framing, send=1500))
    p = proxy_with(sluice_factory, tmp_path, "retry-all", extra={"timeouts": {"total": "2s"}})
    t0 = time.monotonic()
    with RawConn(HOST, p.port, timeout=15) as c:
        c.send(request_bytes("GET", fault.url + path))
        r = c.read_response(allow_truncated=True, timeout=15)
        elapsed = time.monotonic() - t0
        assert_cut_short(r, c, framing, b"S" * 1500)
    assert 1.8 <= elapsed <= 5.0, f"the stalled exchange ended after {elapsed:.2f}s with total: 2s"
    tries = settle_no_more_tries(fault, path, 1)
    gone = tries[0].t_done - t0
    assert gone <= elapsed + 1.0, f"the origin's connection closed {gone:.2f}s after the start ({tries[0].note})"
    e = log_entry(p, path)
    assert e["outcome"] == "upstream_aborted" and e["bytes_out"] == 1500, e
    print(f"stall mid-body ({framing}): client cut at {elapsed:.2f}s, origin closed at {gone:.2f}s")


def test_per_try_timeout_does_not_cut_a_body_that_has_started(sluice_factory, tmp_path, fault):
    """The per-try timeout covers the wait for the head; a stalled body is the total
    timeout's. (Without `timeouts.total` nothing ends a body that stops: see the report.)"""
    fault.always("/stall-pt", StallMidBody(framing="length", send=10, seconds=3))
    p = proxy_with(sluice_factory, tmp_path, extra={"timeouts": {"upstream_per_try": "1s", "total": "2500ms"}})
    t0 = time.monotonic()
    with RawConn(HOST, p.port, timeout=15) as c:
        c.send(request_bytes("GET", fault.url + "/stall-pt"))
        r = c.read_response(allow_truncated=True, timeout=15)
        assert_cut_short(r, c, "length", b"S" * 10)
    elapsed = time.monotonic() - t0
    assert 2.3 <= elapsed <= 5.5, f"cut after {elapsed:.2f}s: not by total (2.5 s)"


# ------------------------------------------------------------------------------------------
# The client aborts
# ------------------------------------------------------------------------------------------

def abort(sock: socket.socket, how: str) -> None:
    if how == "rst":
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def send_for(sock: socket.socket, total: int, seconds: float) -> int:
    """Sends up to `total` bytes for at most `seconds` (a peer that stops reading stops us)."""
    sock.setblocking(False)
    sent, chunk = 0, b"u" * 65536
    end = time.monotonic() + seconds
    while sent < total and time.monotonic() < end:
        try:
            sent += sock.send(chunk[: total - sent])
        except BlockingIOError:
            select.select([], [sock], [], max(0.0, end - time.monotonic()))  # until the peer reads again
    sock.setblocking(True)
    return sent


@pytest.mark.parametrize("how", ["fin", "rst"])
@pytest.mark.parametrize("origin", ["reads", "does-not-read"])
def test_client_abort_mid_upload_stops_the_upstream_within_1s(sluice_factory, tmp_path, fault, origin, how):
    path = f"/up-{origin}-{how}"
    if origin == "reads":
        fault.always(path, Reply(200))   # reads the whole body first: it never gets it
    else:
        fault.always(path, NoReadBody())
    p = proxy_with(sluice_factory, tmp_path, "retry-all")
    c = RawConn(HOST, p.port, timeout=10)
    c.send(request_bytes("POST", fault.url + path, headers={"Content-Length": str(64 * MiB)}))
    sent = send_for(c.sock, 2 * MiB, 1.5)
    assert wait_until(lambda: fault.count(path) == 1, 5), "the upload never reached the origin"
    t_abort = time.monotonic()
    abort(c.sock, how)
    tries = fault.tries(path)
    if origin == "reads":
        ok = wait_until(lambda: tries[0].t_body > 0, 5)
        t_gone = tries[0].t_body
    else:
        ok = wait_until(lambda: tries[0].t_done > 0, 5)
        t_gone = tries[0].t_done
    assert ok, f"the origin's connection is still open 5 s after the client aborted (sent {sent} bytes)"
    lag = t_gone - t_abort
    print(f"upload abort ({origin}, {how}) after {sent} bytes: origin saw the close {lag * 1000:.0f} ms later")
    assert lag < 1.0, f"the origin saw the close {lag:.2f}s after the client aborted"
    assert not tries[0].body_complete
    time.sleep(0.3)  # window: no second try of the aborted upload may reach the origin
    assert fault.count(path) == 1, f"the origin saw {fault.count(path)} tries of an aborted upload"
    assert p.sluice.alive()


@pytest.mark.parametrize("client", ["reading", "stopped-reading"])
def test_client_abort_mid_download_stops_the_upstream_within_1s(proxy, client):
    srv = SlowForeverServer()
    try:
        c = RawConn(HOST, proxy.port, timeout=10, rcvbuf=64 * 1024)
        c.send(request_bytes("GET", f"{srv.url}/forever"))
        head = c.read_head(timeout=10)
        assert head is not None and head.status == 200, head
        got = len(c.buf)
        deadline = time.monotonic() + 10
        while got < 64 * 1024 and time.monotonic() < deadline:
            d = c.sock.recv(65536)
            assert d
            got += len(d)
        if client == "stopped-reading":
            # (Sluice's send buffer toward the client is still filling after 2 s: it stops reading the
            # upstream only once that buffer is full)
            time.sleep(2.0)  # time passing: the client has not read for 2 s and its data backs up in Sluice
        t_abort = time.monotonic()
        abort(c.sock, "fin")
        assert srv.connection_count() == 1
        rec = srv.connections[0]
        assert wait_until(lambda: rec.closed_at is not None, 5), f"upstream still open 5 s later ({rec.note})"
        lag = rec.closed_at - t_abort
        print(f"download abort ({client}): upstream closed {lag * 1000:.0f} ms later ({rec.note})")
        assert lag < 1.0, f"upstream saw the close {lag:.2f}s after the client left ({rec.note})"
    finally:
        srv.stop()


# ------------------------------------------------------------------------------------------
# A POST is never sent twice
# ------------------------------------------------------------------------------------------

# fault -> (action, extra config, what the client sees)
POST_FAULTS = {
    "reset-before-head": (lambda: Reset(), {}, ("error", 502, "upstream")),
    "close-before-head": (lambda: Close(), {}, ("error", 502, "upstream")),
    "reset-mid-body": (lambda: Partial(total=50_000, send=700), {}, ("cut", "length", b"P" * 700)),
    "stall-before-head": (lambda: Stall(10), {"timeouts": {"upstream_per_try": "1s"}},
                          ("error", 504, "no response head in time")),
    "stall-mid-body": (lambda: StallMidBody(send=300, seconds=10), {"timeouts": {"total": "1500ms"}},
                       ("cut", "length", b"S" * 300)),
    "status-503": (lambda: Reply(503), {}, ("status", 503, None)),
    "status-502": (lambda: Reply(502), {}, ("status", 502, None)),
}


@pytest.mark.parametrize("method", ["POST", "PATCH"])
@pytest.mark.parametrize("policy", ["retry-empty", "retry-all"])
@pytest.mark.parametrize("name", sorted(POST_FAULTS))
def test_non_idempotent_request_is_sent_once_whatever_the_fault(sluice_factory, tmp_path, fault, name, policy, method):
    make, extra, expect = POST_FAULTS[name]
    path = f"/once-{name}"
    fault.always(path, make())
    p = proxy_with(sluice_factory, tmp_path, policy, extra=extra)
    body = hashlib.sha256(path.encode()).hexdigest().encode() * 10
    with RawConn(HOST, p.port, timeout=20) as c:
        c.send(request_bytes(method, fault.url + path, body=body))
        r = c.read_response(method=method, allow_truncated=True, timeout=20)
        kind = expect[0]
        if kind == "error":
            assert_sluice_error(r, expect[1], expect[2])
        elif kind == "cut":
            assert_cut_short(r, c, expect[1], expect[2])
        else:
            assert r is not None and r.status == expect[1] and r.header("X-Try") == "1" and r.complete, r
    tries = settle_no_more_tries(fault, path, 1, wait=0.8)
    assert tries[0].method == method and tries[0].body == body, (tries[0].method, len(tries[0].body))
    e = log_entry(p, path)
    assert e["attempts"] == 1, e


@pytest.mark.parametrize("case", ["post-empty", "post-body", "post-body-credentials", "patch-body"])
def test_non_idempotent_request_on_a_reused_upstream_connection_is_not_resent(sluice_factory, tmp_path, fault, case):
    """libcurl resends a request by itself ("Connection died, retrying a fresh connect") when a
    reused connection ends before any response byte — for any method. The origin here took
    the request and then reset: a POST must not reach it a second time."""
    method = "PATCH" if case.startswith("patch") else "POST"
    body = b"" if case == "post-empty" else b"payload-" + case.encode()
    warm, path = f"/warm-{case}", f"/reused-{case}"
    fault.always(warm, Reply(200))
    fault.always(path, Reset())
    policy = {"retry": {}}
    if case.endswith("credentials"):
        policy["credentials"] = {"username": "u", "password": "p"}
    p = start_proxy(sluice_factory, tmp_path, policy)
    with RawConn(HOST, p.port, timeout=20) as c:  # one client connection: one worker, one pool
        c.send(request_bytes("GET", fault.url + warm))
        r = c.read_response(timeout=20)
        assert r is not None and r.status == 200, r
        headers = {"Content-Length": "0"} if not body else None
        c.send(request_bytes(method, fault.url + path, headers=headers, body=body))
        r = c.read_response(method=method, timeout=20)
        assert_sluice_error(r, 502, "upstream")
    tries = settle_no_more_tries(fault, path, 1, wait=0.5)
    assert tries[0].conn == fault.tries(warm)[0].conn, "the request did not go on the pooled connection"


@pytest.mark.parametrize("policy", ["retry-empty", "retry-all"])
def test_get_on_a_reused_connection_may_be_retried_but_is_answered(sluice_factory, tmp_path, fault, policy):
    """The control for the test above: an idempotent request may be resent (by libcurl or by
    the retry policy); it is answered, never left hanging."""
    fault.always("/warm-get", Reply(200))
    fault.script("/reused-get", [Reset()], Reply(200, body=b"second"))
    p = proxy_with(sluice_factory, tmp_path, policy)
    with RawConn(HOST, p.port, timeout=20) as c:
        c.send(request_bytes("GET", fault.url + "/warm-get"))
        assert c.read_response(timeout=20).status == 200
        c.send(request_bytes("GET", fault.url + "/reused-get"))
        r = c.read_response(timeout=20)
        assert r is not None and r.status == 200 and r.body == b"second", r
    settle_no_more_tries(fault, "/reused-get", 2)


class DelayedReply(Reply):
    def __init__(self, delay: float, **kw):
        super().__init__(200, **kw)
        self.delay = delay

    def run(self, srv, conn, reader, t):
        time.sleep(self.delay)  # server behaviour: the answer comes `delay` seconds after the request
        super().run(srv, conn, reader, t)


@pytest.mark.parametrize("outcome", ["answered", "reset"])
def test_post_in_flight_during_drain_is_sent_once(sluice_factory, tmp_path, fault, outcome):
    path = f"/drain-post-{outcome}"
    if outcome == "answered":
        fault.always(path, DelayedReply(1.5, body=b"done"))
    else:
        class DelayedReset(Reset):
            def run(self, srv, conn, reader, t):
                time.sleep(1.5)  # server behaviour: the reset comes 1.5 s after the request, mid-drain
                super().run(srv, conn, reader, t)
        fault.always(path, DelayedReset())
    p = proxy_with(sluice_factory, tmp_path, "retry-all", extra={"timeouts": {"drain": "10s"}})
    with RawConn(HOST, p.port, timeout=20) as c:
        c.send(request_bytes("POST", fault.url + path, body=b"drain-body"))
        assert wait_until(lambda: fault.count(path) == 1, 5)
        p.sluice.expected_exit = True
        p.sluice.signal(signal.SIGTERM)
        r = c.read_response(method="POST", timeout=20)
        if outcome == "answered":
            assert r is not None and r.status == 200 and r.body == b"done" and r.complete, r
            assert "close" in r.connection_tokens(), r
        else:
            assert_sluice_error(r, 502, "upstream")
    assert p.sluice.wait(15) == 0
    tries = fault.tries(path)
    assert len(tries) == 1, f"the origin saw {len(tries)} tries"


# ------------------------------------------------------------------------------------------
# SIGHUP every 100 ms, then SIGTERM, with 64 connections
# ------------------------------------------------------------------------------------------

def load_body(path: str) -> bytes:
    """The body the origin sends for a path: its size and bytes depend on the path."""
    seed = hashlib.sha256(path.encode()).digest()
    size = 200 + int.from_bytes(seed[:2], "big") % 48_000
    return (seed * (size // 32 + 1))[:size]


def load_action(t: Try):
    body = load_body(t.path)
    if t.method == "POST":
        body = hashlib.sha256(t.body).hexdigest().encode() + b" " + body[:1000]
    return Chunked(body=body, chunk=8192) if int(t.path.rsplit("/", 1)[1]) % 3 == 0 else Reply(200, body=body)


@pytest.mark.deadline(120)
def test_sighup_every_100ms_then_sigterm_with_64_connections_lose_nothing(sluice_factory, tmp_path):
    n_clients, max_requests, hup_seconds = 64, 400, 4.0
    origin = FaultUpstream(default=load_action)
    log = AccessLog(tmp_path / "load-access.log")
    try:
        proxy = sluice_factory({"timeouts": {"drain": "20s"}, "monitors": monitors(access=log.path),
                                "policies": {"default": {"adapters": [{"headers": {"set": {"X-Gen": "a"}}}]}}})
        cfg = read_config(proxy)
        texts = []
        for gen in ("a", "b"):
            cfg["policies"]["default"]["adapters"][0]["headers"]["set"]["X-Gen"] = gen
            texts.append(yaml.safe_dump(cfg, sort_keys=False))
        lock = threading.Lock()
        ok: list[str] = []
        unanswered: list[tuple[str, float]] = []   # (path, when sent): closed before any response byte
        failures: list[str] = []
        t_term = [float("inf")]
        start = threading.Barrier(n_clients + 1, timeout=30)

        def client(n: int):
            c = RawConn(HOST, proxy.port, timeout=30)
            try:
                start.wait()
                for i in range(max_requests):
                    path = f"/load/{n}/{i}"
                    post = i % 4 == 3
                    body = f"post {n} {i} ".encode() * 50 if post else b""
                    t_send = time.monotonic()
                    try:
                        c.send(request_bytes("POST" if post else "GET", origin.url + path, body=body))
                        r = c.read_response(method="POST" if post else "GET", timeout=30, allow_truncated=True)
                    except (OSError, TimeoutError) as e:
                        with lock:
                            failures.append(f"{path}: {type(e).__name__}: {e}")
                        return
                    except Exception as e:  # noqa: BLE001 - a protocol error is a failure too
                        with lock:
                            failures.append(f"{path}: {type(e).__name__}: {e}")
                        return
                    if r is None:  # closed before any byte of a response
                        with lock:
                            unanswered.append((path, t_send))
                        return
                    want = load_body(path)
                    if post:
                        want = hashlib.sha256(body).hexdigest().encode() + b" " + want[:1000]
                    if r.status != 200 or not r.complete or r.body != want:
                        with lock:
                            failures.append(f"{path}: status {r.status} complete={r.complete} "
                                            f"{len(r.body)}/{len(want)} bytes, equal={r.body == want}")
                        return
                    with lock:
                        ok.append(path)
                    if "close" in r.connection_tokens():
                        return
            finally:
                c.close()

        threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(n_clients)]
        for t in threads:
            t.start()
        start.wait()
        hups = 0
        end = time.monotonic() + hup_seconds
        while time.monotonic() < end:
            write_config_text(proxy, texts[hups % 2])
            sighup(proxy)
            hups += 1
            time.sleep(0.1)  # time passing: reloads at ~10/s, spread over hup_seconds of client traffic
        proxy.expected_exit = True
        t_term[0] = time.monotonic()
        proxy.signal(signal.SIGTERM)
        for t in threads:
            t.join(max(0.1, t_term[0] + 40 - time.monotonic()))
        stuck = sum(t.is_alive() for t in threads)
        rc = proxy.wait(30)
        t_exit = time.monotonic() - t_term[0]
        print(f"{len(ok)} byte-exact responses, {hups} SIGHUPs in {hup_seconds:.0f}s, "
              f"{len(unanswered)} connections closed idle by the drain, exit {rc} {t_exit:.2f}s after SIGTERM")
        assert stuck == 0, f"{stuck} clients still running 40 s after SIGTERM"
        assert not failures, f"{len(failures)} failed or corrupted responses: {failures[:5]}\n{proxy.stderr()[-3000:]}"
        assert rc == 0, f"exit code {rc} after the drain\n{proxy.stderr()[-3000:]}"
        assert len(ok) >= 500, f"only {len(ok)} requests during {hup_seconds}s of reloads"
        # A request left without an answer was one sent as the drain closed its idle
        # connection: after SIGTERM, and never seen by the origin.
        seen: dict[str, int] = {}
        for t in origin.tries():
            seen[t.path] = seen.get(t.path, 0) + 1
        for path, t_send in unanswered:
            assert t_send >= t_term[0] - 0.5, f"{path} was sent {t_term[0] - t_send:.2f}s before SIGTERM and never answered"
            assert path not in seen, f"{path} reached the origin but its client got no answer: " \
                                     f"{[e for e in log.lines() if path in e.get('url', '')]}"
        twice = {k: v for k, v in seen.items() if v != 1}
        assert not twice, f"requests the origin saw more than once: {list(twice.items())[:5]}"
        assert set(ok) <= set(seen), "a response without a request at the origin"
        assert len(seen) == len(ok), f"the origin saw {len(seen)} requests, the clients got {len(ok)} answers"
        logged = [e["url"] for e in log.lines()]
        assert len(logged) == len(ok) and len(set(logged)) == len(ok), \
            f"{len(ok)} answers, {len(logged)} access-log lines ({len(set(logged))} distinct)"
    finally:
        origin.stop()


# ------------------------------------------------------------------------------------------
# Access log on a full disk, or on a path that cannot be written
# ------------------------------------------------------------------------------------------

FULL_RE = re.compile(r"cannot write log .*access\.log.*No space left on device")


def requests_through(proxy, url: str, n: int, spread: float = 0.0) -> None:
    s = session_via(proxy.url)
    for i in range(n):
        r = s.get(f"{url}?i={i}", timeout=10)
        assert r.status_code == 200, r.text
        if spread:
            time.sleep(spread / n)  # time passing: the requests spread over `spread` s, across many log flushes


def count_lines(text: str, pattern: re.Pattern) -> int:
    return sum(1 for line in text.splitlines() if pattern.search(line))


def test_access_log_on_a_full_disk_keeps_serving_and_says_so_once_per_episode(sluice_factory, tmp_path, fault):
    link = tmp_path / "access.log"
    link.symlink_to("/dev/full")
    p = sluice_factory({"monitors": monitors(access=link)})
    url = fault.url + "/full"
    requests_through(p, url, 40, spread=1.0)          # ~10 flushes, every one fails
    assert wait_until(lambda: count_lines(p.stderr(), FULL_RE) >= 1, 5), f"nothing said about ENOSPC:\n{p.stderr()}"
    requests_through(p, url, 20, spread=0.5)
    time.sleep(0.5)  # window: the failing flushes of these lines must not report the full disk again
    assert count_lines(p.stderr(), FULL_RE) == 1, f"the full disk was reported more than once:\n{p.stderr()}"
    # The disk has room again (the path is a file now): SIGUSR1 reopens it, lines flow, and
    # the log says how many were lost.
    link.unlink()
    off = stderr_len(p)
    p.signal(signal.SIGUSR1)
    assert wait_until(lambda: "reopened" in stderr_since(p, off), 5)
    requests_through(p, url + "-back", 5)
    assert wait_until(lambda: len(AccessLog(link).lines()) == 5, 5), AccessLog(link).text()
    # The writer says so after the write that succeeded: the lines may be in the file first.
    recovered_re = re.compile(r"log .*access\.log is writing again; 60 line\(s\)")
    assert wait_until(lambda: recovered_re.search(stderr_since(p, off)), 5), stderr_since(p, off)
    # A second episode is reported again, once.
    link.unlink()
    link.symlink_to("/dev/full")
    p.signal(signal.SIGUSR1)
    requests_through(p, url + "-again", 20, spread=0.5)
    assert wait_until(lambda: count_lines(p.stderr(), FULL_RE) == 2, 5), p.stderr()
    time.sleep(0.5)  # window: later flushes of this episode must not report it a second time
    assert count_lines(p.stderr(), FULL_RE) == 2, p.stderr()
    assert p.alive()


def unwritable(tmp_path: Path) -> Path:
    """A path that not even root can create: its parent is a regular file."""
    f = tmp_path / "not-a-directory"
    f.write_text("a regular file\n")
    return f / "access.log"


def test_unwritable_access_log_at_start_is_a_config_error(tmp_path):
    bad = unwritable(tmp_path)
    port = pick_port()
    cfg = tmp_path / "bad-log.yaml"
    cfg.write_text(yaml.safe_dump({"listen": [f"{HOST}:{port}"], "monitors": [{"access_log": {"path": str(bad)}}]}))
    r = subprocess.run([SLUICE_BIN, "run", "--config", str(cfg)], capture_output=True, text=True, timeout=20,
                       env=clean_env())
    assert r.returncode == 1, f"exit {r.returncode}: {r.stderr}"
    assert re.search(rf"{re.escape(str(cfg))}:\d+:\d+: .*cannot open log {re.escape(str(bad))}: Not a directory",
                     r.stderr), r.stderr


def test_unwritable_access_log_at_reload_keeps_the_running_log(sluice_factory, tmp_path, fault):
    good = tmp_path / "good.log"
    p = sluice_factory({"monitors": monitors(access=good)})
    requests_through(p, fault.url + "/before", 3)
    cfg = read_config(p)
    cfg["monitors"] = monitors(access=unwritable(tmp_path))
    write_config_text(p, yaml.safe_dump(cfg, sort_keys=False))
    off = stderr_len(p)
    sighup(p)
    assert wait_until(lambda: "Not a directory" in stderr_since(p, off), 5), stderr_since(p, off)
    text = stderr_since(p, off)
    assert re.search(r"reload failed.*:\d+:\d+: .*cannot open log .*Not a directory", text), text
    requests_through(p, fault.url + "/after", 3)
    assert wait_until(lambda: len(AccessLog(good).lines()) == 6, 5), AccessLog(good).text()
    assert count_lines(stderr_since(p, off), re.compile("Not a directory")) == 1, stderr_since(p, off)


def test_unwritable_access_log_at_reopen_keeps_the_old_file(sluice_factory, tmp_path, fault):
    d = tmp_path / "logs"
    d.mkdir()
    path = d / "access.log"
    p = sluice_factory({"monitors": monitors(access=path)})
    requests_through(p, fault.url + "/one", 2)
    # "rotation" gone wrong: the directory moves away and a file takes its name
    moved = tmp_path / "logs.moved"
    d.rename(moved)
    Path(d).write_text("in the way\n")
    off = stderr_len(p)
    p.signal(signal.SIGUSR1)
    assert wait_until(lambda: "Not a directory" in stderr_since(p, off), 5), stderr_since(p, off)
    requests_through(p, fault.url + "/two", 2)
    assert wait_until(lambda: len(AccessLog(moved / "access.log").lines()) == 4, 5), "lines lost after a failed reopen"
    assert count_lines(stderr_since(p, off), re.compile("Not a directory")) == 1, stderr_since(p, off)
    # fixed: the next SIGUSR1 moves to the path
    Path(d).unlink()
    d.mkdir()
    p.signal(signal.SIGUSR1)
    assert wait_until(lambda: "reopened 1" in stderr_since(p, off), 5), stderr_since(p, off)
    requests_through(p, fault.url + "/three", 2)
    assert wait_until(lambda: len(AccessLog(path).lines()) == 2, 5)
    assert p.alive()


# ------------------------------------------------------------------------------------------
# Out of file descriptors
# ------------------------------------------------------------------------------------------

class LimitedSluice(Sluice):
    """Sluice started with RLIMIT_NOFILE `nofile` (as under `ulimit -n`)."""

    def __init__(self, config_path: Path, port: int, workdir: Path, nofile: int):
        super().__init__(config_path, port, workdir)
        self.nofile = nofile

    def start(self, timeout: float = 15.0, env=None) -> "LimitedSluice":
        self.out_f = open(self.out_path, "wb")
        self.err_f = open(self.err_path, "wb")
        n = self.nofile

        def limit():
            resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))

        self.proc = spawn([SLUICE_BIN, "run", "--config", str(self.config_path)], stdout=self.out_f,
                          stderr=self.err_f, stdin=subprocess.DEVNULL, preexec_fn=limit)
        try:
            wait_port(self.port, timeout, self.proc)
        except Exception as e:
            kill_tree(self.proc)
            raise RuntimeError(f"sluice did not start: {e}\n{self.stderr()}") from e
        return self

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture
def limited_sluice(tmp_path):
    started: list[LimitedSluice] = []

    def start(nofile: int, overrides: dict | None = None) -> LimitedSluice:
        port = pick_port()
        cfg = deep_merge({"listen": [f"{HOST}:{port}"], "timeouts": {"drain": "5s"}}, overrides or {})
        path = tmp_path / f"limited-{port}.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        s = LimitedSluice(path, port, tmp_path, nofile)
        started.append(s)
        return s.start()

    yield start
    problems = []
    for s in started:
        crashed = s.proc.poll()
        rc = s.stop()
        print(f"---- limited sluice :{s.port} (nofile {s.nofile}), exit {rc if crashed is None else crashed} ----\n"
              f"{s.stderr()[-6000:]}")
        if crashed is not None:
            problems.append(f"sluice :{s.port} exited during the test with code {crashed}")
    if problems:
        pytest.fail("; ".join(problems), pytrace=False)


EMFILE_RE = re.compile(r"Too many open files|EMFILE")


def test_out_of_descriptors_idle_clients_no_spin_then_503_then_recovery(limited_sluice, fault):
    """Idle clients take every descriptor: accept() fails with EMFILE. Sluice must not spin on
    its still-readable listener, must say why once, must answer a request that got a client
    descriptor but no upstream socket with a clear 503 (not a hang, not "refused"), and must
    accept again once descriptors are free."""
    # limits.max_connections above the descriptor limit (its default, auto, stays below it):
    # this is the last line of defence, descriptors actually running out.
    p = limited_sluice(64, {"limits": {"max_connections": 100000}})
    fault.always("/fd", Reply(200, body=b"fd-ok"))
    idle = []
    try:
        for _ in range(90):
            s = socket.create_connection((HOST, p.port), timeout=5)
            idle.append(s)
        assert wait_until(lambda: p.open_fds() >= 63, 5), f"{p.open_fds()} descriptors open"
        cpu0, t0 = p.cpu_seconds(), time.monotonic()
        time.sleep(1.5)  # time passing: the CPU use is measured over 1.5 s of refused accepts
        cpu = (p.cpu_seconds() - cpu0) / (time.monotonic() - t0)
        print(f"out of descriptors, idle: {p.open_fds()} fds open, CPU {cpu * 100:.0f} %")
        assert cpu < 0.3, f"Sluice burns {cpu * 100:.0f} % CPU while it cannot accept"
        assert wait_until(lambda: EMFILE_RE.search(p.stderr()), 3), f"the log does not say why:\n{p.stderr()}"
        # Every client now sends a request: each one accepted has no descriptor for its
        # upstream and gets a 503 (and a close, which frees one); none may hang.
        for s in idle:
            s.sendall(request_bytes("GET", fault.url + "/fd"))
        statuses: dict[int, int] = {}
        # A client that got its answer leaves, as a real one would: a 200 left its client
        # connection open and an upstream connection in libcurl's pool, and while every one
        # of them stayed, the clients still in the listen queue could never get a descriptor.
        for s in idle:
            c = RawConn.__new__(RawConn)
            c.sock, c.timeout, c.buf, c.eof, c.reset = s, 20.0, bytearray(), False, False
            s.settimeout(30)
            r = c.read_response(timeout=30)
            s.close()
            assert r is not None, "closed without an answer"
            statuses[r.status] = statuses.get(r.status, 0) + 1
            if r.status != 200:
                assert_sluice_error(r, 503, "descriptor")
            else:
                assert r.body == b"fd-ok"
        print(f"answers while out of descriptors: {statuses}")
        assert set(statuses) <= {200, 503} and sum(statuses.values()) == len(idle), statuses
    finally:
        for s in idle:
            s.close()
    # descriptors are free again: service resumes
    # (libcurl's pool keeps an upstream connection per 200 for a while: up to 23 here)
    assert wait_until(lambda: p.open_fds() < 56, 10), f"{p.open_fds()} descriptors still open"
    r = session_via(p.url).get(fault.url + "/fd", timeout=10)
    assert r.status_code == 200 and r.content == b"fd-ok"
    lines = [l for l in p.stderr().splitlines() if EMFILE_RE.search(l)]
    assert 1 <= len(lines) <= 6, f"{len(lines)} log lines about EMFILE:\n" + "\n".join(lines[:20])


@pytest.mark.deadline(180)
@pytest.mark.parametrize("max_connections", ["auto", 100000])
def test_ulimit_256_with_1000_concurrent_clients(limited_sluice, fault, max_connections):
    # auto: limits.max_connections ((256 - 64) / 2 = 96) answers the excess with a 503 at
    # accept, before descriptors run out; 100000: descriptors do run out (EMFILE).
    p = limited_sluice(256, {"limits": {"max_connections": max_connections}})
    body = b"z" * 2048
    fault.always("/many", Reply(200, body=body))
    n = 1000

    async def one(i: int):
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection(HOST, p.port), 30)
        except (OSError, asyncio.TimeoutError) as e:
            return f"connect: {type(e).__name__}"
        try:
            w.write(request_bytes("GET", f"{fault.url}/many?i={i}", headers={"Connection": "close"}))
            await w.drain()
            data = await asyncio.wait_for(r.read(), 90)
        except (OSError, asyncio.TimeoutError) as e:
            return f"io: {type(e).__name__}"
        finally:
            w.close()
        head, _, rest = data.partition(b"\r\n\r\n")
        status = head.split(b" ", 2)[1] if head.startswith(b"HTTP/1.1 ") else b"?"
        if status == b"200":
            return 200 if rest == body else f"200 with {len(rest)} bytes"
        if status == b"503" and b"sluice: " in rest and (b"descriptor" in rest or b"limits.max_connections" in rest):
            return 503
        return f"{status!r}: {data[:200]!r}"

    async def main():
        return await asyncio.gather(*(one(i) for i in range(n)))

    old = resource.getrlimit(resource.RLIMIT_NOFILE)
    if old[0] < 2 * n + 100:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(old[1], 4 * n), old[1]))
    t0 = time.monotonic()
    try:
        results = asyncio.run(main())
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, old)
    elapsed = time.monotonic() - t0
    counts: dict = {}
    for x in results:
        counts[x] = counts.get(x, 0) + 1
    print(f"1000 clients against nofile 256 in {elapsed:.1f}s: {counts}")
    assert p.alive(), "sluice died"
    bad = {k: v for k, v in counts.items() if k not in (200, 503)}
    assert not bad, f"clients without a clear answer: {bad}"
    # auto admits 96 at a time, and the 1000 arrive together
    assert counts.get(200, 0) >= (50 if max_connections == "auto" else 100), counts
    why = EMFILE_RE if max_connections != "auto" else re.compile(r"limits\.max_connections")
    lines = [l for l in p.stderr().splitlines() if why.search(l)]
    print("\n".join(lines[:10]))
    assert lines, "nothing in the log says why connections were refused or waited"
    assert len(lines) <= 10, f"{len(lines)} lines about it: a flood"
    # accepts resume
    r = session_via(p.url).get(fault.url + "/many?after", timeout=10)
    assert r.status_code == 200 and r.content == body
