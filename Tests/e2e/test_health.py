"""Upstream health and circuit breaking (`health:`, docs/configuration.md#health;
docs/errors.md, "circuit is open"): a switchable origin that fails (answers 503, or refuses
connections with its listener closed) and comes back. After `consecutive_failures` failures in
a row the origin's circuit opens and requests are answered 503 with Retry-After without
reaching it; after the cooldown one trial request (or, with `probe:`, one probe GET) closes it.
Every test counts the requests that reached the origin while the circuit was open (0 but the
trial or the probes) and measures the time to recover after the origin came back; the access
log's `circuit`, the metrics and the admin API's `GET /upstreams` show the state. Two workers
everywhere: the state is shared, whichever worker a connection lands on."""

from __future__ import annotations

import socket
import ssl
import threading
import time

import requests

from faultservers import HOST, Reader, PeerClosed, pick_port
from policy_support import AccessLog, run_check, set_sections, sighup, until
from rawhttp import RawConn, request_bytes
from support import TIME_SCALE, assert_sluice_error

SLACK = 2.0 * TIME_SCALE  # s a recovery may take beyond its bound on a loaded 2-core machine


class SwitchableOrigin:
    """An origin on a fixed port that can go down (listener closed: connections refused) and
    come back, or answer `status` to everything. Every request is recorded with the time it
    arrived, its path and whether it is a probe (User-Agent `sluice-health-probe`). Answers
    close the connection, so no pooled connection outlives a switch."""

    def __init__(self, tls=None):
        self.tls = tls  # an ssl.SSLContext (server side), or None for plain HTTP
        self.port = pick_port()
        self.status = 200
        self.lock = threading.Lock()
        self.seen: list[tuple[float, str, bool]] = []
        self.listener: socket.socket | None = None
        self.thread: threading.Thread | None = None
        self.up()

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{HOST}:{self.port}"

    @property
    def origin(self) -> str:
        return self.url

    def up(self) -> None:
        if self.listener is not None:
            return
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        for _ in range(100):
            try:
                s.bind((HOST, self.port))
                break
            except OSError:
                time.sleep(0.05)  # poll interval: retry the bind until the old listener's port is free
        else:
            raise RuntimeError(f"could not bind {HOST}:{self.port} again")
        s.listen(64)
        s.settimeout(0.1)
        self.listener = s
        self.thread = threading.Thread(target=self._accept, args=(s,), daemon=True)
        self.thread.start()

    def down(self) -> None:
        s, self.listener = self.listener, None
        if s is not None:
            s.close()
            self.thread.join(timeout=2)

    def _accept(self, s: socket.socket) -> None:
        while self.listener is s:
            try:
                conn, _ = s.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            if self.tls is not None:
                conn.settimeout(10)
                conn = self.tls.wrap_socket(conn, server_side=True)
            _, _, target, headers = Reader(conn, timeout=10).read_head()
            probe = any(k.lower() == "user-agent" and v == "sluice-health-probe" for k, v in headers)
            with self.lock:
                self.seen.append((time.monotonic(), target, probe))
                status = self.status
            body = f"origin {status}".encode()
            conn.sendall(f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        except (PeerClosed, OSError, ValueError):  # ssl.SSLError is an OSError
            pass
        finally:
            conn.close()

    def set_status(self, status: int) -> None:
        with self.lock:
            self.status = status

    def requests(self, since: float = 0.0, probes: bool | None = None) -> list[tuple[float, str, bool]]:
        with self.lock:
            return [r for r in self.seen if r[0] >= since and (probes is None or r[2] == probes)]

    def stop(self) -> None:
        self.down()


def get(proxy_port: int, url: str):
    """One GET on a new client connection (so the two workers share the traffic)."""
    c = RawConn(HOST, proxy_port, timeout=15)
    try:
        c.send(request_bytes("GET", url, headers={"Connection": "close"}))
        return c.read_response(timeout=15)
    finally:
        c.close()


def admin_upstreams(admin: int) -> dict:
    r = requests.get(f"http://{HOST}:{admin}/upstreams", timeout=5)
    assert r.status_code == 200, r.text
    return {u["origin"]: u for u in r.json()["upstreams"]}


def metrics_text(admin: int) -> str:
    return requests.get(f"http://{HOST}:{admin}/metrics", timeout=5).text


def metric(admin: int, name: str, origin: str) -> float | None:
    prefix = f'{name}{{origin="{origin}"}} '
    for row in metrics_text(admin).splitlines():
        if row.startswith(prefix):
            return float(row.split()[-1])
    return None


def start(sluice_factory, tmp_path, origin: SwitchableOrigin, health: dict, retry=None, more: dict | None = None):
    admin = pick_port()
    log = tmp_path / "access.log"
    policy = {"health": health, **(more or {})}
    if retry is not None:
        policy["retry"] = retry
    proxy = sluice_factory({
        "workers": 2,
        "admin": {"listen": f"{HOST}:{admin}"},
        "monitors": [{"access_log": {"path": str(log)}}, {"metrics": {}}],
        "policies": {HOST: policy},
    })
    return proxy, admin, AccessLog(log)


def open_circuit(proxy, origin: SwitchableOrigin, failures: int, expect: int) -> None:
    """Sends `failures` requests that fail (each answered `expect`, the origin's failure)."""
    for i in range(failures):
        r = get(proxy.port, f"{origin.url}/fail/{i}")
        assert r is not None and r.status == expect, f"failure {i + 1}: {r!r}"


def assert_fails_fast(proxy, origin: SwitchableOrigin, path: str, max_retry_after: int):
    r = get(proxy.port, f"{origin.url}{path}")
    assert_sluice_error(r, 503, f"upstream {HOST}:{origin.port} is failing: its circuit is open")
    retry_after = int(r.header("retry-after"))
    assert 1 <= retry_after <= max_retry_after, r
    return retry_after


def test_503s_open_the_circuit_requests_fail_fast_and_one_trial_closes_it(sluice_factory, tmp_path):
    origin = SwitchableOrigin()
    try:
        proxy, admin, log = start(sluice_factory, tmp_path, origin, {"consecutive_failures": 3, "cooldown": "2s"})
        # A success between failures resets the count: 2 failures, 1 success, 2 failures stay closed.
        origin.set_status(503)
        open_circuit(proxy, origin, 2, 503)
        origin.set_status(200)
        assert get(proxy.port, f"{origin.url}/ok").status == 200
        origin.set_status(503)
        open_circuit(proxy, origin, 2, 503)
        assert admin_upstreams(admin)[origin.origin]["state"] == "closed"
        assert admin_upstreams(admin)[origin.origin]["consecutive_failures"] == 2
        # The third failure in a row opens it.
        open_circuit(proxy, origin, 1, 503)
        opened = time.monotonic()
        assert len(origin.requests()) == 6

        # Open: 20 requests are answered 503 by Sluice; none reaches the origin.
        for i in range(20):
            assert_fails_fast(proxy, origin, f"/while-open/{i}", 2)
        assert origin.requests(since=opened) == [], "a request reached the origin while its circuit was open"
        up = admin_upstreams(admin)[origin.origin]
        assert up["state"] == "open" and up["opens"] == 1 and up["failed_fast"] == 20, up
        assert up["failure_threshold"] == 3 and up["cooldown_ms"] == 2000 and up["probe"] is None, up
        assert metric(admin, "sluice_upstream_circuit_state", origin.origin) == 1
        assert metric(admin, "sluice_upstream_circuit_failed_fast_total", origin.origin) == 20
        assert metric(admin, "sluice_upstream_circuit_opened_total", origin.origin) == 1
        lines = log.wait_for(lambda e: "/while-open/" in e["url"], n=20)
        assert all(e["circuit"] == "open" and e["status"] == 503 and e["attempts"] == 0 for e in lines), lines[0]
        assert all("circuit is open" in e["error"] for e in lines), lines[0]
        # The 503 keeps the client connection: two on one connection.
        c = RawConn(HOST, proxy.port, timeout=15)
        try:
            for i in range(2):
                c.send(request_bytes("GET", f"{origin.url}/kept/{i}"))
                assert_sluice_error(c.read_response(timeout=15), 503, "its circuit is open")
        finally:
            c.close()
        assert origin.requests(since=opened) == []

        # Still failing after the cooldown: the one trial reaches it, fails, and reopens it.
        def trial_went() -> bool:
            get(proxy.port, f"{origin.url}/trial-1")
            return len(origin.requests(since=opened)) > 0
        until(trial_went, 2 + SLACK + 1, 0.1, "the first trial")
        trial_failed = time.monotonic()
        assert [r[1] for r in origin.requests(since=opened)] == ["/trial-1"], origin.requests(since=opened)
        retry_after = assert_fails_fast(proxy, origin, "/after-failed-trial", 2)
        assert retry_after == 2, "a failed trial reopens the circuit for the whole cooldown"
        assert admin_upstreams(admin)[origin.origin]["state"] == "open"

        # The origin comes back; requests every 100 ms: the next trial closes the circuit.
        origin.set_status(200)
        back = time.monotonic()
        statuses = []

        def recovered() -> bool:
            r = get(proxy.port, f"{origin.url}/poll")
            statuses.append(r.status)
            return r.status == 200
        until(recovered, 2 + SLACK, 0.1, "recovery after the origin came back")
        recovery = time.monotonic() - back
        reached = origin.requests(since=trial_failed)
        # Until the trial, nothing reached it: exactly one request did (the trial, answered 200).
        assert len(reached) == 1 and reached[0][1] == "/poll", reached
        assert statuses[-1] == 200 and all(s == 503 for s in statuses[:-1]), statuses
        assert recovery <= 2 + SLACK, recovery
        print(f"circuit figures (trial): requests reaching the origin while open: 0 (+2 trials); "
              f"fast-failed: {admin_upstreams(admin)[origin.origin]['failed_fast']}; recovery {recovery:.2f} s "
              f"(cooldown 2 s)")

        # Closed again: requests flow, the log and the gauge say so.
        for i in range(5):
            assert get(proxy.port, f"{origin.url}/closed/{i}").status == 200
        assert admin_upstreams(admin)[origin.origin]["state"] == "closed"
        assert metric(admin, "sluice_upstream_circuit_state", origin.origin) == 0
        assert log.wait_for(lambda e: e["url"].endswith("/closed/4"))[0]["circuit"] == "closed"
    finally:
        origin.stop()


def test_refused_connections_open_it_and_a_probe_closes_it(sluice_factory, tmp_path):
    origin = SwitchableOrigin()
    try:
        proxy, admin, log = start(sluice_factory, tmp_path, origin,
                                  {"consecutive_failures": 2, "cooldown": "1s",
                                   "probe": {"path": "/healthz", "interval": "500ms"}})
        origin.down()
        for i in range(2):
            r = get(proxy.port, f"{origin.url}/down/{i}")
            assert_sluice_error(r, 502, "refused the connection")
        assert_fails_fast(proxy, origin, "/open", 1)
        up = admin_upstreams(admin)[origin.origin]
        assert up["state"] in ("open", "half_open") and up["probe"] == "/healthz", up

        # Down for a while: requests keep failing fast (probes fail: refused).
        deadline = time.monotonic() + 2.5
        fast = 0
        while time.monotonic() < deadline:
            assert_fails_fast(proxy, origin, f"/while-down/{fast}", 1)
            fast += 1
            # time passing: 2.5 s down (cooldown 1 s, probes every 500 ms fail), a request every 0.1 s
            time.sleep(0.1)
        origin.up()
        back = time.monotonic()
        statuses = []

        def recovered() -> bool:
            r = get(proxy.port, f"{origin.url}/poll")
            statuses.append(r.status)
            return r.status == 200
        until(recovered, 1 + 0.5 + SLACK, 0.1, "recovery after the origin came back")
        recovery = time.monotonic() - back
        reached = origin.requests()
        # Before the first 200, only probes reached it; the probe closed the circuit.
        first_proxied = next(i for i, r in enumerate(reached) if not r[2])
        assert reached[first_proxied][1] == "/poll", reached
        probes = reached[:first_proxied]
        assert len(probes) >= 1 and all(r[1] == "/healthz" and r[2] for r in probes), reached
        assert len(probes) <= 2, f"more than one probe per interval: {probes}"
        assert all(s == 503 for s in statuses[:-1]) and statuses[-1] == 200, statuses
        assert recovery <= 1 + 0.5 + SLACK, recovery
        up = admin_upstreams(admin)[origin.origin]
        assert up["state"] == "closed" and up["opens"] == 1 and up["failed_fast"] >= fast, up
        line = log.wait_for(lambda e: e["url"].endswith("/poll") and e["status"] == 200)[0]
        assert line["circuit"] == "closed", line
        print(f"circuit figures (probe): requests reaching the origin while open: 0 (+{len(probes)} probe(s)); "
              f"fast-failed: {up['failed_fast']}; recovery {recovery:.2f} s (cooldown 1 s, interval 0.5 s)")
    finally:
        origin.stop()


def test_https_probes_go_through_the_parent_proxy_with_the_hosts_trust(sluice_factory, tmp_path, pki):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(pki.chain_pem), str(pki.leaf_key))
    origin = SwitchableOrigin(tls=ctx)
    try:
        parent_log_path = tmp_path / "parent-access.log"
        parent = sluice_factory({"monitors": [{"access_log": {"path": str(parent_log_path)}}],
                                 "access": {"connect_ports": [origin.port]}}, name="parent")
        parent_log = AccessLog(parent_log_path)
        # The child trusts the test CA (tls.ca_file) and reaches the origin only through the parent.
        proxy, admin, log = start(sluice_factory, tmp_path, origin,
                                  {"consecutive_failures": 1, "cooldown": "500ms",
                                   "probe": {"path": "/healthz", "interval": "300ms"}},
                                  more={"upstream_proxy": {"url": parent.url}})
        origin.set_status(503)
        r = get(proxy.port, f"{origin.url}/fail")  # absolute https URL over plain HTTP: TLS from Sluice
        assert r.status == 503 and r.body == b"origin 503", r
        assert_fails_fast(proxy, origin, "/open", 1)
        assert admin_upstreams(admin)[origin.origin]["state"] in ("open", "half_open")
        opened = time.monotonic()
        origin.set_status(200)
        until(lambda: admin_upstreams(admin)[origin.origin]["state"] == "closed", 0.5 + 0.3 + SLACK, 0.05,
              "a probe closing the circuit")
        probes = origin.requests(since=opened, probes=True)
        assert probes and all(p[1] == "/healthz" for p in probes), origin.requests()
        assert origin.requests(since=opened, probes=False) == [], "a request reached the origin while open"
        # Every request and probe to the origin went through a CONNECT to the parent.
        tunnels = parent_log.wait_for(lambda e: e.get("method") == "CONNECT" and str(origin.port) in e["url"],
                                      n=1 + len(probes))
        assert len(tunnels) == len(origin.requests()), (tunnels, origin.requests())
        assert get(proxy.port, f"{origin.url}/after").status == 200
    finally:
        origin.stop()


def test_retries_stop_at_an_open_circuit(sluice_factory, tmp_path):
    origin = SwitchableOrigin()
    try:
        retry = {"limit": 5, "statuses": [503], "backoff": {"scale": "50ms", "jitter": "none"}}
        proxy, admin, log = start(sluice_factory, tmp_path, origin, {"consecutive_failures": 2, "cooldown": "10s"},
                                  retry=retry)
        origin.set_status(503)
        # One request: try 1 and its retry fail (the circuit opens); the second retry fails fast.
        r = get(proxy.port, f"{origin.url}/retried")
        assert_sluice_error(r, 503, "its circuit is open")
        assert 9 <= int(r.header("retry-after")) <= 10, r
        assert len(origin.requests()) == 2, origin.requests()
        line = log.wait_for(lambda e: e["url"].endswith("/retried"))[0]
        assert line["attempts"] == 2 and line["circuit"] == "open", line
        # A second request with retries never reaches it.
        assert_fails_fast(proxy, origin, "/retried-again", 10)
        assert len(origin.requests()) == 2
    finally:
        origin.stop()


def test_reload_keeps_an_unchanged_circuit_and_resets_a_changed_one(sluice_factory, tmp_path):
    origin = SwitchableOrigin()
    try:
        proxy, admin, _ = start(sluice_factory, tmp_path, origin, {"consecutive_failures": 1, "cooldown": "30s"})
        origin.set_status(500)
        open_circuit(proxy, origin, 1, 500)
        assert_fails_fast(proxy, origin, "/open", 30)
        origin.set_status(200)
        generation = requests.get(f"http://{HOST}:{admin}/config", timeout=5).json()["configuration_generation"]

        def reloaded(g: int) -> bool:
            return requests.get(f"http://{HOST}:{admin}/config", timeout=5).json()["configuration_generation"] == g

        # The host's health settings unchanged (another policy added): the circuit stays open.
        set_sections(proxy, policies={HOST: {"health": {"consecutive_failures": 1, "cooldown": "30s"}},
                                      "other.example": {}})
        sighup(proxy)
        until(lambda: reloaded(generation + 1), 10, 0.1, "the first reload")
        # window: the workers apply the reload on their loops; it must not reset the unchanged circuit
        time.sleep(0.3)
        assert_fails_fast(proxy, origin, "/still-open", 30)
        assert admin_upstreams(admin)[origin.origin]["state"] == "open"
        # Changed settings: the origin starts closed under them.
        set_sections(proxy, policies={HOST: {"health": {"consecutive_failures": 2, "cooldown": "30s"}}})
        sighup(proxy)
        until(lambda: reloaded(generation + 2), 10, 0.1, "the second reload")
        assert origin.url not in admin_upstreams(admin)
        until(lambda: get(proxy.port, f"{origin.url}/after-change").status == 200, 5, 0.1, "a request after the reload")
        up = admin_upstreams(admin)[origin.origin]
        assert up["state"] == "closed" and up["failure_threshold"] == 2, up
        # Health removed: the origin is no longer listed.
        assert f'origin="{origin.origin}"' in metrics_text(admin)
        set_sections(proxy, policies={HOST: {}})
        sighup(proxy)
        until(lambda: reloaded(generation + 3), 10, 0.1, "the third reload")
        assert admin_upstreams(admin) == {}
        # ... and its circuit series are gone from the metrics (they stay as bounded as the table).
        assert f'origin="{origin.origin}"' not in metrics_text(admin)
    finally:
        origin.stop()


def test_health_key_errors_are_located(sluice_bin, tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("policies:\n  default:\n    health: { consecutive_failures: 0, probe: { path: healthz } }\n")
    r = run_check(cfg)
    assert r.returncode != 0
    assert f"{cfg}:3:" in r.stderr + r.stdout and "consecutive_failures must be 1 to 1000" in r.stderr + r.stdout, r
    assert "probe path must be an origin-form path" in r.stderr + r.stdout, r
