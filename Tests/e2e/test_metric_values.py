"""Counters that say what happened (docs/metrics.md): scenarios driven through a running
Sluice, each asserting the exact values the counters of /metrics must reach, next to what
the origin saw (a counting origin records every request and its fields), with 1 and 2
workers: forwarded, cached, revalidated, refetched without validators, streamed from disk,
tunnelled, upgraded, refused at accept, retried then refused, forwarded over Sluice's own TLS
and refused by a pin, rate limited, a circuit opened then failing fast, the gauges and a
reload, a credential refreshed. The last test keeps the list whole: every metric of
docs/metrics.md is asserted here, or in the one scenario elsewhere that needs its own setup.

`sluice_cache_total` first: each `event` as docs/metrics.md defines it — `revalidated` only
when a conditional request went out and the origin answered it.
"""

from __future__ import annotations

import os
import re
import socket
import ssl
import threading
from pathlib import Path

import pytest
import requests

from cache_origin import CountingOrigin
from faultservers import pick_port
from rawhttp import RawConn, request_bytes
from resilience_support import bearer_factory, token_server_factory  # noqa: F401 (fixtures)
from test_oauth import oauth_env  # noqa: F401 (a fixture)
from support import HOST, connect_through, wait_until

SERIES = re.compile(r'^([a-z_]+)(?:\{(.*)\})? (\S+)$')


def scrape(admin: int) -> dict[tuple[str, frozenset], float]:
    """Every sample of /metrics, keyed by name and label set."""
    out = {}
    text = requests.get(f"http://{HOST}:{admin}/metrics", timeout=5).text
    for row in text.splitlines():
        if row.startswith("#") or not row.strip():
            continue
        m = SERIES.match(row)
        assert m, f"unparsable /metrics line: {row!r}"
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m[2] or ""))
        out[(m[1], labels)] = float(m[3])
    return out


def cache_events(admin: int) -> dict[str, int]:
    return {dict(labels)["event"]: int(v) for (name, labels), v in scrape(admin).items()
            if name == "sluice_cache_total"}


@pytest.fixture
def origin():
    o = CountingOrigin()
    yield o
    o.stop()


# (scenario, the origin's fields, requests, expected sluice_cache_total, requests the origin
# saw with a conditional field)
CACHE_SCENARIOS = [
    ("cached", {"Cache-Control": "max-age=60"}, 4,
     {"lookup": 4, "miss": 1, "stored": 1, "hit": 3}, 0),
    ("refetched without validators", {"Cache-Control": "max-age=0"}, 4,
     {"lookup": 4, "miss": 4, "stored": 4}, 0),
    ("revalidated with an ETag", {"Cache-Control": "max-age=0", "ETag": '"v1"'}, 4,
     {"lookup": 4, "miss": 4, "stored": 1, "revalidated": 3}, 3),
]


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("name,fields,n,expected,conditional", CACHE_SCENARIOS,
                         ids=[s[0] for s in CACHE_SCENARIOS])
def test_cache_events_count_what_happened(sluice_factory, origin, workers, name, fields, n, expected,
                                          conditional):
    admin = pick_port()
    proxy = sluice_factory({"workers": workers, "cache_store": {"memory": "16MiB"},
                            "monitors": [{"metrics": {}}], "admin": {"listen": f"{HOST}:{admin}"}})
    url = origin.set("/r", headers=fields, body=b"the body")
    with requests.Session() as s:  # one connection: the requests are sequential
        for _ in range(n):
            r = s.get(url, proxies={"http": proxy.url}, timeout=10)
            assert r.status_code == 200 and r.content == b"the body", r
    seen = origin.requests("/r")
    with_validators = [f for _, f in seen if any(k.startswith("if-") for k in f)]
    assert len(with_validators) == conditional, seen
    # The last exchange's events are recorded when it ends, which may be just after its client
    # read the whole body: wait for the counts to settle on the expected ones.
    def nonzero():
        return {k: v for k, v in cache_events(admin).items() if v}
    assert wait_until(lambda: nonzero() == expected, 5), nonzero()


# ------------------------------------------------------------------------------------------
# Traffic: each scenario drives a fresh Sluice and names the exact value each counter reaches
# ------------------------------------------------------------------------------------------

def metrics_proxy(sluice_factory, workers: int, **more):
    admin = pick_port()
    proxy = sluice_factory({"workers": workers, "monitors": [{"metrics": {}}],
                            "admin": {"listen": f"{HOST}:{admin}"}, **more})
    return proxy, admin


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def settled(admin: int, name: str, expected: float, **labels: str) -> dict:
    """/metrics once `name{labels}` reached `expected` (an exchange's counters are recorded
    when it ends, which may be just after its client got the response); fails otherwise."""
    last: dict = {}

    def reached():
        last.clear()
        last.update(scrape(admin))
        return value(last, name, **labels) == expected
    assert wait_until(reached, 5), (name, labels, value(last, name, **labels), expected)
    return last


@pytest.mark.parametrize("workers", [1, 2])
def test_forwarded_requests(sluice_factory, nginx, httpbin, workers):
    proxy, admin = metrics_proxy(sluice_factory, workers)
    with requests.Session() as s:
        for i in range(3):
            r = s.get(nginx.url(f"/1k?n={i}"), proxies={"http": proxy.url}, timeout=10)
            assert r.status_code == 200 and len(r.content) == 1024
        r = s.post(httpbin.url + "/post", data=b"x" * 300, proxies={"http": proxy.url}, timeout=10)
        assert r.status_code == 200 and r.json()["data"] == "x" * 300
    m = settled(admin, "sluice_requests_total", 1, policy="default", method="POST", status_class="2xx")
    assert value(m, "sluice_requests_total", policy="default", method="GET", status_class="2xx") == 3
    assert value(m, "sluice_response_body_bytes_total") == 3 * 1024 + len(r.content)
    assert value(m, "sluice_request_body_bytes_total") == 300
    tries = {dict(k)["connection"]: v for (n, k), v in m.items() if n == "sluice_upstream_requests_total"}
    assert sum(tries.values()) == 4 and tries.get("new", 0) >= 1, tries
    assert value(m, "sluice_upstream_total_seconds_count") == 4
    assert value(m, "sluice_upstream_first_byte_seconds_count") == 4
    assert value(m, "sluice_tunnels_total") == 0 and value(m, "sluice_retries_total", reason="refused") == 0


@pytest.mark.parametrize("workers", [1, 2])
def test_tunnelled_connect(sluice_factory, nginx, pki, workers):
    proxy, admin = metrics_proxy(sluice_factory, workers)
    raw = socket.create_connection((HOST, proxy.port), timeout=10)
    head = connect_through(raw, f"{HOST}:{nginx.https_port}")
    assert head.startswith(b"HTTP/1.1 200"), head
    tls = ssl.create_default_context(cafile=str(pki.ca_pem)).wrap_socket(raw, server_hostname=HOST)
    tls.sendall(b"GET /1k HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    got = b""
    while chunk := tls.recv(65536):
        got += chunk
    tls.close()
    assert got.startswith(b"HTTP/1.1 200") and got.endswith(nginx.file_1k)
    # The tunnel is counted when it closes.

    def counted():
        m = scrape(admin)
        return value(m, "sluice_tunnels_total") == 1 and \
            value(m, "sluice_requests_total", policy="default", method="CONNECT", status_class="2xx") == 1
    assert wait_until(counted, 5), scrape(admin)


@pytest.mark.parametrize("workers", [1, 2])
def test_retried_then_refused(sluice_factory, closed_port, workers):
    proxy, admin = metrics_proxy(sluice_factory, workers, policies={
        "default": {"retry": {"limit": 2, "errors": ["refused"], "backoff": {"scale": "1ms"}}}})
    r = requests.get(f"http://{HOST}:{closed_port}/", proxies={"http": proxy.url}, timeout=10)
    assert r.status_code == 502
    m = settled(admin, "sluice_requests_total", 1, policy="default", method="GET", status_class="5xx")
    assert value(m, "sluice_retries_total", reason="refused") == 2
    assert value(m, "sluice_retries_stopped_total", reason="limit") == 1
    assert value(m, "sluice_own_responses_total", kind="upstream_refused") == 1
    assert value(m, "sluice_upstream_requests_total", protocol="HTTP/1.1", connection="new") == 0


@pytest.mark.parametrize("workers", [1, 2])
def test_connections_refused_at_accept(sluice_factory, nginx, workers):
    proxy, admin = metrics_proxy(sluice_factory, workers, limits={"max_connections": 1})
    held: list[socket.socket] = []

    def take_the_one_place() -> bool:
        # The start-up check's connection may still hold the place for a moment: its 503s
        # come before the count this test makes.
        c = socket.create_connection((HOST, proxy.port), timeout=10)
        c.sendall(b"GET " + nginx.url("/1k").encode() + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        if c.recv(12).startswith(b"HTTP/1.1 200"):
            held.append(c)
            return True
        c.close()
        return False
    assert wait_until(take_the_one_place, 5)
    try:
        before = value(scrape(admin), "sluice_connections_refused_total", reason="max_connections")
        own = value(scrape(admin), "sluice_own_responses_total", kind="too_many_connections")
        for _ in range(2):
            extra = socket.create_connection((HOST, proxy.port), timeout=10)
            assert extra.recv(12).startswith(b"HTTP/1.1 503")
            extra.close()
        settled(admin, "sluice_connections_refused_total", before + 2, reason="max_connections")
        settled(admin, "sluice_own_responses_total", own + 2, kind="too_many_connections")
    finally:
        held[0].close()


@pytest.mark.parametrize("workers", [1, 2])
def test_streamed_from_disk(sluice_factory, origin, tmp_path, workers):
    """A body larger than the memory tier keeps (1/8 of `memory`) is stored on disk and its
    hits are streamed from there: one miss, then hits, every byte counted once."""
    proxy, admin = metrics_proxy(sluice_factory, workers, cache_store={
        "memory": "1MiB", "disk": {"path": str(tmp_path / "cache"), "size": "64MiB"}, "max_object_size": "16MiB"})
    body = os.urandom(512 * 1024)
    url = origin.set("/big", headers={"Cache-Control": "max-age=60"}, body=body)
    statuses = []
    with requests.Session() as s:
        for _ in range(3):
            r = s.get(url, proxies={"http": proxy.url}, timeout=20)
            assert r.status_code == 200 and r.content == body
            statuses.append(r.headers.get("Cache-Status", ""))
    assert "detail=disk" in statuses[1] and "detail=disk" in statuses[2], statuses
    assert origin.count("/big") == 1
    m = settled(admin, "sluice_cache_total", 2, event="hit")
    assert {dict(k)["event"]: v for (n, k), v in m.items() if n == "sluice_cache_total" and v} == \
        {"lookup": 3, "miss": 1, "stored": 1, "hit": 2}
    assert value(m, "sluice_response_body_bytes_total") == 3 * len(body)
    assert value(m, "sluice_requests_total", policy="default", method="GET", status_class="2xx") == 3
    assert value(m, "sluice_upstream_total_seconds_count") == 1  # only the miss went upstream
    assert value(m, "sluice_cache_disk_write_failures_total") == 0


@pytest.mark.parametrize("workers", [1, 2])
def test_upgraded_websocket(sluice_factory, workers):
    """A WebSocket upgrade is one exchange (status 101, counted when the tunnel closes) and one
    tunnel; the bytes relayed after the handshake are the tunnel's, not a response body's."""
    from test_websocket import EchoServer, echo_many, via_absolute_form
    echo = EchoServer()
    try:
        proxy, admin = metrics_proxy(sluice_factory, workers)
        with via_absolute_form(proxy.port, f"ws://{HOST}:{echo.port}/echo") as ws:
            assert echo_many(ws, 20) == 20
        assert len(echo.upgrades()) == 1
        m = settled(admin, "sluice_requests_total", 1, policy="default", method="GET", status_class="1xx")
        assert value(m, "sluice_tunnels_total") == 1
        assert sum(v for (n, _), v in m.items() if n == "sluice_requests_total") == 1
        assert value(m, "sluice_upstream_requests_total", protocol="HTTP/1.1", connection="new") == 0
    finally:
        echo.stop()


def https_get(proxy, url: str):
    """An absolute-form https request sent to the proxy in plain text: Sluice itself speaks
    TLS to the origin (a client's own https would be a CONNECT tunnel)."""
    with RawConn(HOST, proxy.port, timeout=20) as c:
        c.send(request_bytes("GET", url))
        return c.read_response(timeout=20)


@pytest.mark.parametrize("workers", [1, 2])
def test_forwarded_over_tls_and_refused_by_a_pin(sluice_factory, nginx, pki, workers):
    """Sluice's own TLS to an origin: each try's connect and handshake are timed once; a pin
    that does not match is one trust failure, by evaluator, and one answer of Sluice's own."""
    proxy, admin = metrics_proxy(sluice_factory, workers, tls={"ca_file": str(pki.ca_pem)}, policies={
        "localhost": {"trust": {"pinned_certificates": [str(pki.dir / "wrong.pem")]}}})
    for i in range(2):
        r = https_get(proxy, nginx.tls_url(f"/1k?i={i}"))
        assert r is not None and r.status == 200 and r.body == nginx.file_1k, r
    r = https_get(proxy, f"https://localhost:{nginx.https_port}/1k")
    assert r is not None and r.status == 502 and b"certificate pin mismatch" in r.body, r
    m = settled(admin, "sluice_trust_failures_total", 1, evaluator="pinned_certificates")
    assert value(m, "sluice_own_responses_total", kind="trust_failure") == 1
    assert value(m, "sluice_requests_total", policy="default", method="GET", status_class="2xx") == 2
    assert value(m, "sluice_requests_total", policy="localhost", method="GET", status_class="5xx") == 1
    # Two answered tries on kept-alive connections per worker: each new connection was timed.
    new = value(m, "sluice_upstream_requests_total", protocol="HTTP/1.1", connection="new")
    reused = value(m, "sluice_upstream_requests_total", protocol="HTTP/1.1", connection="reused")
    assert new + reused == 2 and new >= 1, (new, reused)
    assert value(m, "sluice_upstream_tls_seconds_count") == new
    assert value(m, "sluice_upstream_connect_seconds_count") == new
    # The refused try lasted too (it connected, and its handshake ended in the pin's refusal).
    assert value(m, "sluice_upstream_total_seconds_count") == 3


@pytest.mark.parametrize("workers", [1, 2])
def test_rate_limited_waited_and_rejected(sluice_factory, nginx, workers):
    """`rate_limit` 1 request per minute: the first goes, the second is refused (429), each
    decision counted once; nobody is left waiting."""
    proxy, admin = metrics_proxy(sluice_factory, workers, policies={
        "default": {"rate_limit": {"rate": "1/min", "burst": 1, "on_limit": "reject"}}})
    with requests.Session() as s:
        assert s.get(nginx.url("/1k"), proxies={"http": proxy.url}, timeout=10).status_code == 200
        assert s.get(nginx.url("/1k?again"), proxies={"http": proxy.url}, timeout=10).status_code == 429
    m = settled(admin, "sluice_rate_limit_decisions_total", 1, policy="default", decision="rejected")
    assert value(m, "sluice_rate_limit_decisions_total", policy="default", decision="allowed") == 1
    assert value(m, "sluice_rate_limit_decisions_total", policy="default", decision="waited") == 0
    assert value(m, "sluice_own_responses_total", kind="rate_limited") == 1
    assert value(m, "sluice_rate_limit_waiting", policy="default") == 0
    assert value(m, "sluice_rate_limit_wait_seconds_count") == 0


@pytest.mark.parametrize("workers", [1, 2])
def test_circuit_opened_then_failed_fast(sluice_factory, closed_port, workers):
    proxy, admin = metrics_proxy(sluice_factory, workers, policies={
        HOST: {"health": {"consecutive_failures": 2, "cooldown": "60s"}}})
    with requests.Session() as s:
        for _ in range(2):
            assert s.get(f"http://{HOST}:{closed_port}/", proxies={"http": proxy.url}, timeout=10).status_code == 502
        assert s.get(f"http://{HOST}:{closed_port}/", proxies={"http": proxy.url}, timeout=10).status_code == 503
    origin = f"http://{HOST}:{closed_port}"
    m = settled(admin, "sluice_upstream_circuit_failed_fast_total", 1, origin=origin)
    assert value(m, "sluice_upstream_circuit_opened_total", origin=origin) == 1
    assert value(m, "sluice_upstream_circuit_state", origin=origin) == 1  # docs/metrics.md: 1 = open
    assert value(m, "sluice_own_responses_total", kind="upstream_refused") == 2
    assert value(m, "sluice_own_responses_total", kind="upstream_circuit_open") == 1


@pytest.mark.parametrize("workers", [1, 2])
def test_gauges_and_a_reload(sluice_factory, httpbin, workers):
    """In flight and connected while a slow request runs, none after; a reload moves the
    generation and is counted once."""
    proxy, admin = metrics_proxy(sluice_factory, workers)
    out: dict = {}

    def slow():
        out["status"] = requests.get(httpbin.url + "/delay/2", proxies={"http": proxy.url}, timeout=10).status_code
    t = threading.Thread(target=slow)
    t.start()
    assert wait_until(lambda: sum(v for (n, _), v in scrape(admin).items() if n == "sluice_exchanges_in_flight") == 1, 5)
    during = scrape(admin)
    assert sum(v for (n, _), v in during.items() if n == "sluice_client_connections") == 1
    t.join(10)
    assert out["status"] == 200
    r = requests.post(f"http://{HOST}:{admin}/reload", timeout=10)
    assert r.status_code == 200 and r.json()["applied"] is True
    m = settled(admin, "sluice_config_generation", 2)
    assert value(m, "sluice_config_reloads_total", result="applied") == 1
    assert value(m, "sluice_config_reloads_total", result="failed") == 0
    assert sum(v for (n, _), v in m.items() if n == "sluice_exchanges_in_flight") == 0


@pytest.mark.parametrize("workers", [1, 2])
def test_credential_refreshed(sluice_factory, token_server_factory, bearer_factory, oauth_env, workers):
    """An `oauth2` adapter's grant is one refresh; a token it still holds is not another; a
    token endpoint with the wrong secret is a failed one (the request gets Sluice's 502)."""
    from test_oauth import CLIENT_ID, oauth2
    ts = token_server_factory(client_id=CLIENT_ID, client_secret=oauth_env.secret)
    up = bearer_factory(ts)
    bad = token_server_factory(client_id=CLIENT_ID, client_secret="not-" + oauth_env.secret)
    proxy, admin = metrics_proxy(sluice_factory, workers, policies={
        "127.0.0.1": {"adapters": [oauth2(ts.token_url)]},
        "localhost": {"adapters": [oauth2(bad.token_url)]}})
    with requests.Session() as s:  # one connection: one worker, one token
        for i in range(2):
            assert s.get(f"http://{HOST}:{up.port}/r{i}", proxies={"http": proxy.url}, timeout=10).status_code == 200
        assert s.get(f"http://localhost:{up.port}/r", proxies={"http": proxy.url}, timeout=10).status_code == 502
    m = settled(admin, "sluice_credential_refreshes_total", 1, result="failed")
    assert value(m, "sluice_credential_refreshes_total", result="ok") == 1
    assert ts.grants() == 1
    assert value(m, "sluice_own_responses_total", kind="adapter_failed") == 1


# The metrics whose scenario needs a setup of its own, and the test that asserts their values.
ELSEWHERE = {
    "sluice_lua_calls_total": ("test_lua.py", "def test_calls_are_counted"),
    "sluice_lua_call_duration_seconds": ("test_lua_tools.py", "def test_script_counters_and_call_durations"),
    "sluice_lua_metric_total": ("test_lua_tools.py", "def test_script_counters_and_call_durations"),
    "sluice_lua_states": ("test_lua_tools.py", "def test_states_stay_one_per_script_per_worker_across_reloads"),
    "sluice_lua_memory_bytes": ("test_lua_tools.py", "def test_a_hundred_policies_running_one_script_share_one_state"),
    "sluice_requests_queued_total": ("test_overload.py", "def test_"),
    "sluice_requests_refused_total": ("test_overload.py", "def test_"),
    "sluice_rate_limit_learned_total": ("test_admin.py", "def test_limits_lists_what_the_origin_asked_for"),
    "sluice_rate_limit_keys_evicted_total": ("test_rate_limit.py", "def test_ten_thousand_client_keys_keep_the_table_bounded"),
    "sluice_fleet_instances": ("test_admin.py", "def test_fleet_shows_each_workers_redis_and_the_instances"),
    "sluice_fleet_fallbacks_total": ("test_admin.py", "def test_fleet_shows_each_workers_redis_and_the_instances"),
    "sluice_fleet_cache_members": ("test_fleet_members.py", "def test_three_members_share_the_keys_by_weight"),
    "sluice_peer_requests_total": ("test_fleet_hop.py", "def test_a_dead_peer_is_skipped_and_counted"),
    "sluice_peer_request_duration_seconds": ("test_fleet_hop.py", "def test_a_dead_peer_is_skipped_and_counted"),
    "sluice_download_resumes_total": ("test_resume.py", "def test_the_resume_limit_is_the_policys_retry_limit"),
    "sluice_upstream_tries_total": ("test_resume.py", "def test_a_resume_takes_its_rate_limit_turn_and_is_counted_as_a_try"),
    "sluice_cache_disk_sendfile_bytes_total": (
        "test_cache_disk_sendfile.py", "def test_a_plain_http_disk_hit_is_sent_by_the_kernel_and_verified_once"),
    "sluice_cache_disk_verified_bytes_total": (
        "test_cache_disk_sendfile.py", "def test_a_plain_http_disk_hit_is_sent_by_the_kernel_and_verified_once"),
}


def test_every_documented_metric_has_a_scenario():
    here = Path(__file__).parent
    documented = re.findall(r"^\| `(sluice_[a-z_]+)`", (here.parent.parent / "docs" / "metrics.md").read_text(), re.M)
    source = Path(__file__).read_text().split("ELSEWHERE = {")[0]
    for name in documented:
        if f'"{name}' in source:
            continue
        assert name in ELSEWHERE, f"{name}: no scenario asserts its value"
        file, test = ELSEWHERE[name]
        text = (here / file).read_text()
        assert test in text and name in text.split(test, 1)[1], f"{name}: not asserted in {file} after {test!r}"
