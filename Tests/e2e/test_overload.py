"""Overload protection (docs/configuration.md, "Load limits"; docs/errors.md, the 503 rows):
`limits.max_connections` and `limits.max_connections_per_client` refuse the connection beyond
them at accept with a 503 (Retry-After, Connection: close) while the admitted ones are held,
and let a new one in once one closes; `limits.max_in_flight_upstream` makes a request wait in
the worker's queue and then succeed, and answers 503 with Retry-After when the queue is full
or the wait runs out — such a request never reaches the (counting) origin; a client that
leaves while it waits leaves the queue; every refusal is counted in /metrics; the limits
apply on SIGHUP."""

from __future__ import annotations

import re
import socket
import threading
import time

import requests

from faultservers import HOST, Reader, ThreadedServer, pick_port, simple_response
from policy_support import set_sections, sighup, stderr_len, stderr_since, until
from rawhttp import RawConn, request_bytes
from support import assert_sluice_error, port_open, wait_until


class SlowCountingOrigin(ThreadedServer):
    """Answers every request after `delay` seconds; records each request target on arrival."""

    name = "slow-counting"

    def __init__(self, delay: float):
        self.delay = delay
        self.targets: list[str] = []
        super().__init__()

    def handle(self, conn, rec):
        r = Reader(conn, timeout=30)
        while not self.stopping.is_set():
            _, _, target, _ = r.read_head()
            with self.lock:
                self.targets.append(target)
            time.sleep(self.delay)  # server behaviour: a slow origin that answers `delay` seconds after each head
            conn.sendall(simple_response(200, b"slow ok " + target.encode()))

    def seen(self) -> list[str]:
        with self.lock:
            return list(self.targets)


def raw_from(source: str, port: int, timeout: float = 10.0) -> RawConn:
    """A RawConn whose local address is `source` (127.0.0.x), to look like another client."""
    c = RawConn.__new__(RawConn)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((source, 0))
    s.settimeout(5.0)
    s.connect((HOST, port))
    s.settimeout(timeout)
    c.sock, c.timeout, c.buf, c.eof, c.reset = s, timeout, bytearray(), False, False
    return c


def get_ok(c: RawConn, url: str) -> None:
    """One proxied GET on `c`, answered 200: the connection was admitted and works."""
    c.send(request_bytes("GET", url))
    r = c.read_response(timeout=10)
    assert r is not None and r.status == 200, f"expected 200 through an admitted connection, got {r!r}"


def assert_refused_at_accept(c: RawConn, phrase: str) -> None:
    """Sluice answers without being sent anything: 503, Retry-After, Connection: close, closed."""
    t0 = time.monotonic()
    r = c.read_response(timeout=5)
    assert_sluice_error(r, 503, phrase)
    assert time.monotonic() - t0 < 2.0, "the refusal was not immediate"
    assert r.header("retry-after") == "1", r
    assert "close" in r.connection_tokens(), r
    assert c.wait_closed(3), "a refused connection stayed open"


def metric(admin_port: int, line: str) -> float:
    text = requests.get(f"http://{HOST}:{admin_port}/metrics", timeout=5).text
    for row in text.splitlines():
        if row.startswith(line + " "):
            return float(row.split()[-1])
    return 0.0


def open_connections(admin_port: int) -> int:
    text = requests.get(f"http://{HOST}:{admin_port}/metrics", timeout=5).text
    return sum(int(float(row.split()[-1])) for row in text.splitlines()
               if row.startswith("sluice_client_connections{"))


def overload_proxy(sluice_factory, limits: dict, timeouts: dict | None = None, workers: int = 1):
    admin = pick_port()
    proxy = sluice_factory({"workers": workers, "limits": limits, "timeouts": {"drain": "5s", **(timeouts or {})},
                            "admin": {"listen": f"{HOST}:{admin}"}})
    # The admin listener may start a moment after the proxy's (CI once found it refusing).
    until(lambda: port_open(admin), 5, 0.05, "the admin listener accepting")
    # The start-up probe's connection counts until Sluice has seen it close.
    until(lambda: open_connections(admin) == 0, 5, 0.05, "the start-up probe's connection closed")
    return proxy, admin


# ------------------------------------------------------------------------------------------
# limits.max_connections
# ------------------------------------------------------------------------------------------

def test_max_connections_refuses_the_next_with_503_and_admits_after_a_close(sluice_factory, nginx):
    # Two workers: the count is shared, whichever worker the kernel hands a connection to.
    proxy, admin = overload_proxy(sluice_factory, {"max_connections": 3}, workers=2)
    held = [RawConn(HOST, proxy.port) for _ in range(3)]
    try:
        for c in held:
            get_ok(c, nginx.url("/1k"))
        extra = RawConn(HOST, proxy.port)
        assert_refused_at_accept(extra, "limits.max_connections")
        extra.close()
        assert metric(admin, 'sluice_connections_refused_total{reason="max_connections"}') == 1
        # The held ones still work.
        get_ok(held[0], nginx.url("/1k"))
        # Freeing one lets a new one in (Sluice sees the close when it reads the EOF).
        held.pop().close()
        until(lambda: open_connections(admin) == 2, 10, 0.05, "Sluice saw the held connection close")

        def admitted() -> bool:
            c = RawConn(HOST, proxy.port)
            try:
                c.send(request_bytes("GET", nginx.url("/1k")))
                r = c.read_response(timeout=5)
                if r is not None and r.status == 200:
                    held.append(c)
                    return True
                c.close()
                return False
            except OSError:
                c.close()
                return False

        assert wait_until(admitted, 5, 0.1), "no connection admitted after one of the held ones closed"
        # One line when refusing starts, one when it stops: not one per connection.
        err = proxy.stderr()
        assert err.count("refusing new client connections") == 1, err
        assert re.search(r"accepting client connections again: \d+ refused", err), err
    finally:
        for c in held:
            c.close()


def test_max_connections_per_client_counts_each_address(sluice_factory, nginx):
    proxy, admin = overload_proxy(sluice_factory, {"max_connections_per_client": 2})
    held = [raw_from("127.0.0.1", proxy.port) for _ in range(2)]
    try:
        for c in held:
            get_ok(c, nginx.url("/1k"))
        same = raw_from("127.0.0.1", proxy.port)
        assert_refused_at_accept(same, "limits.max_connections_per_client")
        same.close()
        # Another address has its own count.
        other = [raw_from("127.0.0.2", proxy.port) for _ in range(2)]
        held += other
        for c in other:
            get_ok(c, nginx.url("/1k"))
        third = raw_from("127.0.0.2", proxy.port)
        assert_refused_at_accept(third, "limits.max_connections_per_client")
        third.close()
        assert metric(admin, 'sluice_connections_refused_total{reason="max_connections_per_client"}') == 2
        # 127.0.0.1 closes one: it may open one again.
        held.pop(0).close()

        def admitted() -> bool:
            c = raw_from("127.0.0.1", proxy.port)
            c.send(request_bytes("GET", nginx.url("/1k")))
            r = c.read_response(timeout=5)
            if r is not None and r.status == 200:
                held.append(c)
                return True
            c.close()
            return False

        assert wait_until(admitted, 5, 0.1)
    finally:
        for c in held:
            c.close()


def test_connection_limits_apply_on_reload(sluice_factory, nginx):
    proxy, admin = overload_proxy(sluice_factory, {"max_connections": 1})
    held = [RawConn(HOST, proxy.port)]
    try:
        get_ok(held[0], nginx.url("/1k"))
        c = RawConn(HOST, proxy.port)
        assert_refused_at_accept(c, "limits.max_connections")
        c.close()
        offset = stderr_len(proxy)
        set_sections(proxy, limits={"max_connections": 2, "max_connections_per_client": 1})
        sighup(proxy)
        until(lambda: "reload: applied" in stderr_since(proxy, offset), 5, 0.05, "reload applied")
        assert "need a restart" not in stderr_since(proxy, offset)
        # max_connections 2 lets a second one in, but the per-client limit (1) now refuses it:
        # both keys of the new file are in force.
        c = RawConn(HOST, proxy.port)
        assert_refused_at_accept(c, "limits.max_connections_per_client")
        c.close()
        other = raw_from("127.0.0.3", proxy.port)
        held.append(other)
        get_ok(other, nginx.url("/1k"))
        config = requests.get(f"http://{HOST}:{admin}/config", timeout=5).json()
        assert config["server"]["limits"]["max_connections"] == 2
        assert config["server"]["limits"]["max_connections_per_client"] == 1
    finally:
        for c in held:
            c.close()


# ------------------------------------------------------------------------------------------
# limits.max_in_flight_upstream
# ------------------------------------------------------------------------------------------

def test_second_request_waits_and_succeeds_third_gets_503_queue_full(sluice_factory):
    origin = SlowCountingOrigin(delay=1.5)
    try:
        proxy, admin = overload_proxy(sluice_factory, {"max_in_flight_upstream": 1, "upstream_queue": 1},
                                      {"upstream_queue": "10s"})
        a, b, c = (RawConn(HOST, proxy.port, timeout=15) for _ in range(3))
        a.send(request_bytes("GET", f"{origin.url}/a"))
        until(lambda: origin.seen() == ["/a"], 5, 0.01, "the origin got /a")
        t_b = time.monotonic()
        b.send(request_bytes("GET", f"{origin.url}/b"))
        until(lambda: metric(admin, "sluice_requests_queued_total") == 1, 5, 0.05, "/b queued")
        c.send(request_bytes("GET", f"{origin.url}/c"))
        rc = c.read_response(timeout=5)
        assert_sluice_error(rc, 503, "limits.upstream_queue")
        assert rc.header("retry-after") == "1", rc
        # The connection is kept: the refusal is about load, not about the request.
        assert "close" not in rc.connection_tokens()
        ra = a.read_response(timeout=10)
        assert ra is not None and ra.status == 200 and ra.body == b"slow ok /a", ra
        rb = b.read_response(timeout=10)
        assert rb is not None and rb.status == 200 and rb.body == b"slow ok /b", rb
        # /b started only when /a was done.
        assert time.monotonic() - t_b >= 1.5
        assert origin.seen() == ["/a", "/b"], "the refused request reached the origin"
        assert metric(admin, 'sluice_requests_refused_total{reason="queue_full"}') == 1
        # The refused client's connection serves its next request.
        c.send(request_bytes("GET", f"{origin.url}/c2"))
        r2 = c.read_response(timeout=10)
        assert r2 is not None and r2.status == 200, r2
        for x in (a, b, c):
            x.close()
    finally:
        origin.stop()


def test_wait_that_runs_out_gets_503_and_never_reaches_the_origin(sluice_factory):
    origin = SlowCountingOrigin(delay=2.0)
    try:
        proxy, admin = overload_proxy(sluice_factory, {"max_in_flight_upstream": 1, "upstream_queue": 5},
                                      {"upstream_queue": "300ms"})
        a, b = RawConn(HOST, proxy.port, timeout=15), RawConn(HOST, proxy.port, timeout=15)
        a.send(request_bytes("GET", f"{origin.url}/a"))
        until(lambda: origin.seen() == ["/a"], 5, 0.01, "the origin got /a")
        t0 = time.monotonic()
        b.send(request_bytes("GET", f"{origin.url}/b"))
        rb = b.read_response(timeout=5)
        waited = time.monotonic() - t0
        assert_sluice_error(rb, 503, "timeouts.upstream_queue")
        assert rb.header("retry-after") == "1", rb
        assert 0.25 <= waited < 1.5, f"answered after {waited:.2f}s, expected about 0.3s"
        ra = a.read_response(timeout=10)
        assert ra is not None and ra.status == 200, ra
        time.sleep(0.3)  # window: with /a's slot free, the timed-out /b must not be sent to the origin in it
        assert origin.seen() == ["/a"], "the timed-out request reached the origin"
        assert metric(admin, 'sluice_requests_refused_total{reason="queue_timeout"}') == 1
        a.close()
        b.close()
    finally:
        origin.stop()


def test_client_that_leaves_the_queue_is_forgotten(sluice_factory):
    origin = SlowCountingOrigin(delay=1.0)
    try:
        proxy, admin = overload_proxy(sluice_factory, {"max_in_flight_upstream": 1, "upstream_queue": 1},
                                      {"upstream_queue": "10s"})
        a, gone = RawConn(HOST, proxy.port, timeout=15), RawConn(HOST, proxy.port, timeout=15)
        a.send(request_bytes("GET", f"{origin.url}/a"))
        until(lambda: origin.seen() == ["/a"], 5, 0.01, "the origin got /a")
        gone.send(request_bytes("GET", f"{origin.url}/gone"))
        until(lambda: metric(admin, "sluice_requests_queued_total") == 1, 5, 0.05, "/gone queued")
        gone.close()
        until(lambda: open_connections(admin) == 1, 10, 0.05, "Sluice saw /gone's client close")
        # Its place in the queue (size 1) is free again: the next one waits instead of a 503.
        b = RawConn(HOST, proxy.port, timeout=15)
        b.send(request_bytes("GET", f"{origin.url}/b"))
        until(lambda: metric(admin, "sluice_requests_queued_total") == 2, 5, 0.05, "/b queued")
        assert a.read_response(timeout=10).status == 200
        rb = b.read_response(timeout=10)
        assert rb is not None and rb.status == 200 and rb.body == b"slow ok /b", rb
        assert origin.seen() == ["/a", "/b"], "the request of the client that left reached the origin"
        assert metric(admin, 'sluice_requests_refused_total{reason="queue_full"}') == 0
        a.close()
        b.close()
    finally:
        origin.stop()


def test_in_flight_limit_applies_on_reload(sluice_factory):
    origin = SlowCountingOrigin(delay=1.0)
    try:
        proxy, admin = overload_proxy(sluice_factory, {"max_in_flight_upstream": 1, "upstream_queue": 0})
        a, b = RawConn(HOST, proxy.port, timeout=15), RawConn(HOST, proxy.port, timeout=15)
        a.send(request_bytes("GET", f"{origin.url}/a"))
        until(lambda: origin.seen() == ["/a"], 5, 0.01, "the origin got /a")
        b.send(request_bytes("GET", f"{origin.url}/b"))
        assert_sluice_error(b.read_response(timeout=5), 503, "limits.upstream_queue")
        assert a.read_response(timeout=10).status == 200
        offset = stderr_len(proxy)
        set_sections(proxy, limits={"max_in_flight_upstream": 2, "upstream_queue": 0})
        sighup(proxy)
        until(lambda: "reload: applied" in stderr_since(proxy, offset), 5, 0.05, "reload applied")
        a.send(request_bytes("GET", f"{origin.url}/a2"))
        b.send(request_bytes("GET", f"{origin.url}/b2"))
        ra, rb = a.read_response(timeout=10), b.read_response(timeout=10)
        assert ra.status == 200 and rb.status == 200, (ra, rb)
        assert sorted(origin.seen()) == ["/a", "/a2", "/b2"]
        a.close()
        b.close()
    finally:
        origin.stop()


def test_refusal_episodes_are_logged_once(sluice_factory):
    """Many queue refusals in a row: one warning when they start, one line when requests go
    through without waiting again."""
    origin = SlowCountingOrigin(delay=1.0)
    try:
        proxy, admin = overload_proxy(sluice_factory, {"max_in_flight_upstream": 1, "upstream_queue": 0})
        a = RawConn(HOST, proxy.port, timeout=15)
        a.send(request_bytes("GET", f"{origin.url}/a"))
        until(lambda: origin.seen() == ["/a"], 5, 0.01, "the origin got /a")
        for i in range(20):
            c = RawConn(HOST, proxy.port, timeout=5)
            c.send(request_bytes("GET", f"{origin.url}/x{i}"))
            assert c.read_response(timeout=5).status == 503
            c.close()
        assert a.read_response(timeout=10).status == 200
        a.send(request_bytes("GET", f"{origin.url}/after"))
        assert a.read_response(timeout=10).status == 200
        err = proxy.stderr()
        assert len(re.findall(r"refusing requests with 503", err)) == 1, err
        assert "(20 refused with 503)" in err, err
        assert metric(admin, 'sluice_requests_refused_total{reason="queue_full"}') == 20
        a.close()
    finally:
        origin.stop()
