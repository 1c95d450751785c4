"""Graceful shutdown: SIGTERM/SIGINT stop accepting, let in-flight requests finish within
timeouts.drain, close idle connections, and exit 0."""

import select
import signal
import socket
import time

from rawhttp import RawConn, request_bytes
from support import HOST, session_via, wait_until


def assert_new_connections_refused(port: int) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect((HOST, port))
    except ConnectionRefusedError:
        return
    else:
        # Accepted: say what happens to a request on it, for the report.
        try:
            s.sendall(b"GET http://127.0.0.1/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            data = s.recv(200)
            fate = f"answered {data!r}" if data else "closed without an answer"
        except socket.timeout:
            fate = "left hanging"
        except OSError as e:
            fate = f"reset ({e})"
        raise AssertionError(f"a new connection after SIGTERM was accepted ({fate}); it should be refused")
    finally:
        s.close()


def wait_readable(c: RawConn, timeout: float) -> None:
    r, _, _ = select.select([c.sock], [], [], timeout)
    assert r, "no response bytes yet"


def test_sigterm_lets_inflight_drip_finish_and_exits_0(sluice_factory, httpbin):
    proxy = sluice_factory({"timeouts": {"drain": "15s"}})
    with RawConn(HOST, proxy.port, timeout=20) as c:
        c.send(request_bytes("GET", f"{httpbin.url}/drip?numbytes=30&duration=3&delay=0"))
        wait_readable(c, 5)  # the head is out: the request is in flight
        t_term = time.monotonic()
        proxy.expected_exit = True
        proxy.signal(signal.SIGTERM)
        assert wait_until(lambda: "draining" in proxy.stderr(), 10), \
            f"no 'draining' line after SIGTERM:\n{proxy.stderr()}"
        time.sleep(0.5)  # window: the drip has seconds to go; Sluice must not exit with it in flight
        assert proxy.alive(), "sluice exited with a request in flight"
        assert_new_connections_refused(proxy.port)
        r = c.read_response(timeout=15)
    assert r is not None and r.status == 200, r
    assert r.complete and r.body == b"*" * 30, r
    rc = proxy.wait(timeout=15)
    elapsed = time.monotonic() - t_term
    assert rc == 0, f"exit code {rc} after SIGTERM\n{proxy.stderr()}"
    assert 1.5 <= elapsed <= 10, f"exited {elapsed:.1f}s after SIGTERM"


def test_sigint_idle_exits_0_promptly(proxy):
    proxy.expected_exit = True
    t0 = time.monotonic()
    proxy.signal(signal.SIGINT)
    rc = proxy.wait(timeout=10)
    assert rc == 0, proxy.stderr()
    assert time.monotonic() - t0 < 3


def test_sigterm_closes_idle_keep_alive_connections_without_waiting_for_drain(sluice_factory, httpbin):
    proxy = sluice_factory({"timeouts": {"drain": "30s"}})
    with RawConn(HOST, proxy.port) as c:
        c.send(request_bytes("GET", f"{httpbin.url}/get"))
        assert c.read_response().status == 200
        proxy.expected_exit = True
        t0 = time.monotonic()
        proxy.signal(signal.SIGTERM)
        rc = proxy.wait(timeout=15)
        elapsed = time.monotonic() - t0
        assert rc == 0
        assert elapsed < 3, f"an idle keep-alive connection held shutdown for {elapsed:.1f}s"
        assert c.wait_closed(3)


def test_drain_timeout_bounds_shutdown(sluice_factory, httpbin):
    proxy = sluice_factory({"timeouts": {"drain": "1s"}})
    with RawConn(HOST, proxy.port, timeout=20) as c:
        c.send(request_bytes("GET", f"{httpbin.url}/drip?numbytes=20&duration=10&delay=0"))
        wait_readable(c, 5)
        proxy.expected_exit = True
        t0 = time.monotonic()
        proxy.signal(signal.SIGTERM)
        proxy.wait(timeout=15)
        elapsed = time.monotonic() - t0
        r = c.read_response(timeout=10, allow_truncated=True)
    assert elapsed < 4, f"drain: 1s, but exit took {elapsed:.1f}s"
    assert r is not None and r.status == 200
    assert not r.complete, "the cut-off response looks complete"


def test_requests_before_sigterm_all_succeed(sluice_factory, httpbin):
    """Several in-flight requests on separate connections all complete during the drain."""
    proxy = sluice_factory({"timeouts": {"drain": "15s"}})
    conns = [RawConn(HOST, proxy.port, timeout=20) for _ in range(4)]
    try:
        for i, c in enumerate(conns):
            c.send(request_bytes("GET", f"{httpbin.url}/drip?numbytes={10 + i}&duration=2&delay=0"))
        for c in conns:
            wait_readable(c, 5)
        proxy.expected_exit = True
        proxy.signal(signal.SIGTERM)
        for i, c in enumerate(conns):
            r = c.read_response(timeout=15)
            assert r is not None and r.status == 200 and r.body == b"*" * (10 + i), r
    finally:
        for c in conns:
            c.close()
    assert proxy.wait(timeout=15) == 0


def test_service_normal_before_shutdown(proxy, httpbin):
    """Control for the tests above: the same proxy serves normally until signalled."""
    assert session_via(proxy.url).get(httpbin.url + "/get", timeout=10).status_code == 200
    assert proxy.alive()
