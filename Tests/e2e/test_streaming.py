"""Bodies are streamed, never buffered: 1 GiB both ways with the proxy's memory watched, a slow
reader that must not make Sluice hoard the upstream body, and cancellation that reaches the
upstream when the client goes away."""

import hashlib
import json
import re
import subprocess
import time
import uuid

import pytest

from rawhttp import RawConn, request_bytes
from support import HOST, RSS_SCALE, connect_through, MiB, RssMonitor, clean_env, run_curl, session_via, wait_until

RSS_BUDGET_MIB = 64
SLOW_READER_BUDGET_MIB = 32


def warm_up(proxy, nginx):
    """One small exchange first, so lazily allocated pools count in the baseline."""
    r = session_via(proxy.url).get(nginx.url("/1k"), timeout=10)
    assert r.content == nginx.file_1k
    time.sleep(0.2)  # time passing: Sluice settles after the warm-up exchange before the RSS baseline is taken


def curl_upload(proxy, url: str, extra: list[str], stdin=None, timeout: float = 200):
    return run_curl(["-x", proxy.url, *extra, url], timeout=timeout, stdin=stdin)


@pytest.mark.heavy
def test_download_1gib_sha_and_rss(proxy, nginx, big_file):
    warm_up(proxy, nginx)
    h = hashlib.sha256()
    n = 0
    t0 = time.monotonic()
    with RssMonitor(proxy.pid) as mon:
        p = subprocess.Popen(["curl", "-sS", "--max-time", "200", "-x", proxy.url, nginx.url(big_file.url_path)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())
        try:
            while chunk := p.stdout.read(4 * MiB):
                h.update(chunk)
                n += len(chunk)
            rc = p.wait(timeout=30)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=5)
    elapsed = time.monotonic() - t0
    err = p.stderr.read().decode()
    assert rc == 0, f"curl exit {rc}: {err}"
    assert n == big_file.size, f"got {n} bytes of {big_file.size}"
    assert h.hexdigest() == big_file.sha256
    print(f"1 GiB download through sluice in {elapsed:.1f}s ({big_file.size / MiB / elapsed:.0f} MiB/s); {mon.describe()}")
    assert mon.growth_mib < RSS_BUDGET_MIB, mon.describe()


@pytest.mark.heavy
def test_upload_1gib_content_length_sha_and_rss(proxy, nginx, upload_sink, big_file):
    warm_up(proxy, nginx)
    t0 = time.monotonic()
    with RssMonitor(proxy.pid) as mon:
        r = curl_upload(proxy, upload_sink.url + "/upload-cl", ["-T", str(big_file.path)])
    elapsed = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["bytes"] == big_file.size, j
    assert j["sha256"] == big_file.sha256, j
    assert j["content_length"] == str(big_file.size), f"upstream did not get the Content-Length: {j}"
    print(f"1 GiB upload (Content-Length) in {elapsed:.1f}s; {mon.describe()}")
    assert mon.growth_mib < RSS_BUDGET_MIB, mon.describe()


@pytest.mark.heavy
def test_upload_1gib_chunked_sha_and_rss(proxy, nginx, upload_sink, big_file):
    warm_up(proxy, nginx)
    t0 = time.monotonic()
    with RssMonitor(proxy.pid) as mon, open(big_file.path, "rb") as f:
        r = curl_upload(proxy, upload_sink.url + "/upload-chunked",
                        ["-T", "-", "-X", "POST", "-H", "Transfer-Encoding: chunked"], stdin=f)
    elapsed = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["bytes"] == big_file.size, j
    assert j["sha256"] == big_file.sha256, j
    print(f"1 GiB upload (chunked) in {elapsed:.1f}s; {mon.describe()}")
    assert mon.growth_mib < RSS_BUDGET_MIB, mon.describe()


@pytest.mark.heavy
def test_slow_reader_does_not_make_sluice_buffer(proxy, nginx, big_file):
    """A client reading ~1 MB/s from a 1 GiB download: Sluice must apply backpressure to the
    upstream, not read the body into memory."""
    warm_up(proxy, nginx)
    mon = RssMonitor(proxy.pid)
    with mon, RawConn(HOST, proxy.port, timeout=10, rcvbuf=64 * 1024) as c:
        c.send(request_bytes("GET", nginx.url(big_file.url_path)))
        head = c.read_head(timeout=10)
        assert head is not None and head.status == 200, head
        got = len(c.buf)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 5.0:
            budget = 100 * 1024  # per 0.1 s -> ~1 MB/s
            while budget > 0:
                d = c.sock.recv(min(budget, 65536))
                assert d, "connection closed during a slow read"
                got += len(d)
                budget -= len(d)
            time.sleep(0.1)  # server behaviour: the throttled client reads 100 KiB per 0.1 s (~1 MB/s)
        growth_now = mon.current_growth_mib()
    print(f"slow reader read {got / MiB:.1f} MiB in 5 s; RSS growth now {growth_now:.1f} MiB; {mon.describe()}")
    assert got < 20 * MiB, "the client read faster than intended; the test did not throttle"
    assert mon.growth_mib < SLOW_READER_BUDGET_MIB, mon.describe()
    # and Sluice still serves normally
    r = session_via(proxy.url).get(nginx.url("/1k"), timeout=10)
    assert r.content == nginx.file_1k


def test_client_abort_closes_upstream_connection(proxy, slow_forever_server):
    """The upstream streams "1 GiB" slowly; the client reads a little and disconnects: the
    upstream must see its connection closed within ~2 s."""
    c = RawConn(HOST, proxy.port, timeout=10)
    try:
        c.send(request_bytes("GET", f"{slow_forever_server.url}/forever"))
        head = c.read_head(timeout=10)
        assert head is not None and head.status == 200, head
        got = len(c.buf)
        deadline = time.monotonic() + 10
        while got < 64 * 1024 and time.monotonic() < deadline:
            d = c.sock.recv(65536)
            assert d
            got += len(d)
        assert got >= 64 * 1024
    finally:
        c.close()
    t_close = time.monotonic()
    assert slow_forever_server.connection_count() == 1
    rec = slow_forever_server.connections[0]
    assert wait_until(lambda: rec.closed_at is not None, 6), \
        f"upstream connection still open 6 s after the client went away ({rec.note})"
    lag = rec.closed_at - t_close
    assert lag < 2.0, f"upstream saw the close {lag:.2f}s after the client left ({rec.note})"


@pytest.mark.heavy
def test_client_abort_mid_1gib_download_stops_nginx_transfer(proxy, nginx, big_file):
    """Same with nginx and the real 1 GiB file: nginx logs the request, with fewer bytes sent
    than the file holds, soon after the client leaves."""
    tag = uuid.uuid4().hex
    c = RawConn(HOST, proxy.port, timeout=10, rcvbuf=256 * 1024)
    try:
        c.send(request_bytes("GET", nginx.url(f"{big_file.url_path}?abort={tag}")))
        head = c.read_head(timeout=10)
        assert head is not None and head.status == 200
        got = len(c.buf)
        while got < 8 * MiB:
            d = c.sock.recv(1 << 20)
            assert d
            got += len(d)
    finally:
        c.close()
    t_close = time.monotonic()
    log = nginx.dir / "access.log"
    pat = re.compile(rf'"GET /big\.bin\?abort={tag} HTTP/1\.1" (\d+) (\d+)')

    def logged():
        return pat.search(log.read_text(errors="replace"))

    assert wait_until(logged, 6), "nginx still sending 6 s after the client left"
    lag = time.monotonic() - t_close
    m = logged()
    assert int(m.group(2)) < big_file.size, f"nginx sent the whole file: {m.group(0)}"
    assert lag < 3.0, f"nginx's transfer ended {lag:.1f}s after the client left"
    r = session_via(proxy.url).get(nginx.url("/1k"), timeout=10)
    assert r.content == nginx.file_1k


def test_many_small_downloads_then_memory_settles(proxy, nginx):
    """200 sequential requests on one connection: memory must not grow with request count."""
    warm_up(proxy, nginx)
    with RawConn(HOST, proxy.port) as c:
        for _ in range(20):
            c.send(request_bytes("GET", nginx.url("/1k")))
            assert c.read_response().body == nginx.file_1k
        base = RssMonitor(proxy.pid).baseline_kib
        for _ in range(200):
            c.send(request_bytes("GET", nginx.url("/1k")))
            assert c.read_response().body == nginx.file_1k
    grown = (RssMonitor(proxy.pid).baseline_kib - base) / 1024
    assert grown < 8 * RSS_SCALE, f"RSS grew {grown:.1f} MiB over 200 small requests"


def test_connect_tunnel_32mib_byte_exact(proxy, nginx, pki):
    h = hashlib.sha256()
    p = subprocess.Popen(["curl", "-sS", "--max-time", "60", "-x", proxy.url, "--cacert", str(pki.ca_pem),
                          nginx.tls_url("/medium.bin")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=clean_env())
    n = 0
    try:
        while chunk := p.stdout.read(1 << 20):
            h.update(chunk)
            n += len(chunk)
        rc = p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=5)
    assert rc == 0, p.stderr.read()
    assert n == len(nginx.medium) and h.hexdigest() == hashlib.sha256(nginx.medium).hexdigest()


def test_forward_32mib_byte_exact(proxy, nginx):
    r = session_via(proxy.url).get(nginx.url("/medium.bin"), timeout=60)
    assert r.status_code == 200
    assert len(r.content) == len(nginx.medium)
    assert hashlib.sha256(r.content).digest() == hashlib.sha256(nginx.medium).digest()


def test_slow_upstream_reader_does_not_make_sluice_buffer_upload(proxy, nginx, slow_sink_server):
    """Client -> upstream backpressure: a client pushing a 1 GiB body as fast as it can to an
    upstream that reads ~1 MB/s must be slowed down, not absorbed into Sluice's memory."""
    import socket
    import threading
    warm_up(proxy, nginx)
    mon = RssMonitor(proxy.pid)
    stop = threading.Event()
    pushed = [0]
    c = RawConn(HOST, proxy.port, timeout=10)
    c.send(request_bytes("PUT", f"{slow_sink_server.url}/sink",
                         headers={"Content-Length": str(1 << 30), "Content-Type": "application/octet-stream"}))
    c.sock.settimeout(0.5)
    buf = b"\0" * (1 << 20)

    def push():
        while not stop.is_set() and pushed[0] < (1 << 30):
            try:
                pushed[0] += c.sock.send(buf)
            except socket.timeout:
                continue
            except OSError:
                return

    t = threading.Thread(target=push, daemon=True)
    with mon:
        t.start()
        # time passing: the client pushes for 5 s against a ~1 MB/s sink; the bounds below are what 5 s allow
        time.sleep(5)
        stop.set()
        t.join(timeout=5)
    c.close()
    print(f"client pushed {pushed[0] / MiB:.1f} MiB, upstream read {slow_sink_server.bytes_read / MiB:.1f} MiB "
          f"in 5 s; {mon.describe()}")
    assert slow_sink_server.bytes_read < 20 * MiB, "the upstream read faster than intended"
    assert mon.growth_mib < SLOW_READER_BUDGET_MIB, mon.describe()
    assert pushed[0] < 256 * MiB, f"sluice accepted {pushed[0] / MiB:.0f} MiB that the upstream had not read"


@pytest.mark.heavy
def test_slow_reader_through_connect_tunnel_does_not_make_sluice_buffer(proxy, nginx, pki, big_file):
    import socket
    import ssl
    warm_up(proxy, nginx)
    mon = RssMonitor(proxy.pid)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    s.settimeout(10)
    s.connect((HOST, proxy.port))
    try:
        head = connect_through(s, f"{HOST}:{nginx.https_port}")
        assert b" 200 " in head.split(b"\r\n")[0], head
        t = ssl.create_default_context(cafile=str(pki.ca_pem)).wrap_socket(s, server_hostname=HOST)
        t.sendall(f"GET {big_file.url_path} HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())
        got = 0
        with mon:
            t0 = time.monotonic()
            while time.monotonic() - t0 < 5.0:
                budget = 100 * 1024
                while budget > 0:
                    d = t.recv(min(budget, 16384))
                    assert d, "tunnel closed during a slow read"
                    got += len(d)
                    budget -= len(d)
                time.sleep(0.1)  # server behaviour: the throttled client reads 100 KiB per 0.1 s (~1 MB/s)
        t.close()
    finally:
        s.close()
    print(f"slow TLS reader read {got / MiB:.1f} MiB in 5 s through the tunnel; {mon.describe()}")
    assert mon.growth_mib < SLOW_READER_BUDGET_MIB, mon.describe()
