"""The admin listener (docs/operations.md, "Admin API"; docs/admin-api.yaml): every answer of
the running server is validated against the OpenAPI document's schema for its path, method
and status; health and readiness (503 while draining); the exchanges in flight with redacted
URLs; cancellation by id, host and all (the client gets 503, the upstream connection is
closed within a second, a response already streaming is cut off); the effective
configuration without secrets; reload with located errors; the bearer token; and the
configuration rules (loopback unless a token, no shared address)."""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import jsonschema
import pytest
import requests
import yaml

from conftest import REPO
from faultservers import HOST, Reader, ThreadedServer, pick_port
from policy_support import run_check, stderr_len, stderr_since, write_config_text
from rawhttp import RawConn, request_bytes
from support import port_open, session_via, wait_until

SPEC = yaml.safe_load((REPO / "docs" / "admin-api.yaml").read_text())
SEEN: set[tuple[str, str, str]] = set()
# Every test of this module runs on one xdist worker (`--dist loadgroup`, Makefile), in file
# order, so that the last one can check what all of them exercised.
pytestmark = pytest.mark.xdist_group("admin-api")


def schema_for(path: str, method: str, status: int) -> dict:
    op = SPEC["paths"][path][method.lower()]
    response = op["responses"].get(str(status))
    assert response is not None, f"{method} {path} answered {status}, which docs/admin-api.yaml does not list"
    if "$ref" in response:
        response = SPEC["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
    return response["content"]["application/json"]["schema"]


def validate(schema: dict, value) -> None:
    root = dict(copy.deepcopy(schema), components=SPEC["components"])
    jsonschema.Draft202012Validator(root).validate(value)


class Admin:
    def __init__(self, port: int, token: str | None = None):
        self.base = f"http://{HOST}:{port}"
        self.token = token
        self.session = requests.Session()
        self.session.trust_env = False

    def call(self, method: str, path: str, body=None, token: str | None = "default", spec_path: str | None = None):
        headers = {}
        token = self.token if token == "default" else token
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        r = self.session.request(method, self.base + path, headers=headers, timeout=10,
                                 data=None if body is None else (body if isinstance(body, (bytes, str)) else json.dumps(body)))
        assert r.headers.get("Content-Type") == "application/json", r.headers
        data = r.json()
        p = spec_path or path
        if method.lower() in SPEC["paths"].get(p, {}):
            validate(schema_for(p, method, r.status_code), data)
            SEEN.add((p, method.lower(), str(r.status_code)))
        else:
            # an undocumented path or method: 404 or 405, in the error form
            assert r.status_code in (404, 405), (method, path, r.status_code)
            validate({"$ref": "#/components/schemas/Error"}, data)
        return r.status_code, data, r


def admin_proxy(sluice_factory, extra: dict | None = None, token_env: dict | None = None, workers: int = 2):
    port = pick_port()
    admin = {"listen": f"{HOST}:{port}"}
    if token_env:
        admin["token"] = "${ADMIN_TOKEN}"
    cfg = {"admin": admin, "workers": workers}
    cfg.update(extra or {})
    proxy = sluice_factory(cfg, env=token_env)
    assert wait_until(lambda: port_open(port), 10), "the admin listener did not open"
    return proxy, Admin(port, token_env["ADMIN_TOKEN"] if token_env else None)


def in_flight(admin: Admin, pred, timeout: float = 10.0) -> list[dict]:
    found: list[dict] = []

    def ok():
        status, data, _ = admin.call("GET", "/requests")
        assert status == 200 and data["complete"], data
        found[:] = [e for e in data["requests"] if pred(e)]
        return bool(found)

    assert wait_until(ok, timeout, 0.05), "no matching exchange in GET /requests"
    return found


def background_get(proxy_url: str, url: str, out: dict, timeout: float = 30):
    def run():
        try:
            r = session_via(proxy_url).get(url, timeout=timeout)
            out["status"], out["body"], out["at"] = r.status_code, r.text, time.monotonic()
        except Exception as e:  # noqa: BLE001
            out["error"], out["at"] = repr(e), time.monotonic()

    t = threading.Thread(target=run)
    t.start()
    return t


# ------------------------------------------------------------------------------------------

def test_health_readiness_config_and_errors(sluice_factory, httpbin, monkeypatch):
    monkeypatch.setenv("BEARER_SECRET", "s3cr3t-bearer-value")
    proxy, admin = admin_proxy(sluice_factory, {
        "policies": {"default": {"adapters": [{"bearer": "${BEARER_SECRET}"}]}},
        "routes": [{"listen": f"{HOST}:{pick_port()}", "upstream": httpbin.url}]})
    assert admin.call("GET", "/healthz")[:2] == (200, {"status": "alive"})
    status, ready, _ = admin.call("GET", "/readyz")
    assert status == 200 and ready == {"ready": True, "listeners": True, "configuration_generation": 1,
                                       "workers": 2, "workers_ready": 2}
    status, config, r = admin.call("GET", "/config")
    assert status == 200
    assert "s3cr3t-bearer-value" not in r.text, "a secret reached GET /config"
    assert config["source"] == str(proxy.config_path)
    assert config["server"]["listen"] == [f"{HOST}:{proxy.port}"] and config["server"]["workers"] == "2"
    assert config["server"]["routes"][0]["upstream"] == httpbin.url
    default = next(p for p in config["policies"] if p["name"] == "default")
    assert any("bearer: <redacted> (${BEARER_SECRET})" in line for line in default["description"]), default
    # errors: unknown path, wrong method, bad cancel body
    assert admin.call("GET", "/nope")[0] == 404
    status, _, r = admin.call("POST", "/healthz")
    assert status == 405 and r.headers["Allow"] == "GET"
    status, _, r = admin.call("GET", "/requests/cancel")
    assert status == 405 and r.headers["Allow"] == "POST"
    for body in (b"", b"{}", b"not json", {"all": True, "host": "x"}, {"all": False}, {"id": "seven"}):
        assert admin.call("POST", "/requests/cancel", body)[0] == 400, body


def test_bearer_token_is_required_and_never_shown(sluice_factory, tmp_path):
    token = "adm1n-t0ken-" + os.urandom(4).hex()
    proxy, admin = admin_proxy(sluice_factory, token_env={"ADMIN_TOKEN": token})
    for bad in (None, "wrong", token + "x", token[:-1]):
        status, data, r = admin.call("GET", "/healthz", token=bad, spec_path="/healthz")
        assert status == 401 and r.headers["WWW-Authenticate"].startswith("Bearer"), (bad, data)
    assert admin.call("GET", "/healthz")[0] == 200
    status, config, r = admin.call("GET", "/config")
    assert status == 200 and token not in r.text
    assert config["server"]["admin"]["token"] == "<redacted> (${ADMIN_TOKEN})"
    assert token not in proxy.stderr()


def test_config_rules_for_the_admin_listener(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("listen: [127.0.0.1:3128]\nadmin:\n  listen: 0.0.0.0:9901\n")
    p = run_check(bad)
    assert p.returncode != 0 and f"{bad}:3:11:" in p.stdout + p.stderr and "admin.token" in p.stdout + p.stderr, \
        p.stdout + p.stderr
    shared = tmp_path / "shared.yaml"
    shared.write_text("listen: [127.0.0.1:3128]\nadmin: { listen: 127.0.0.1:3128 }\n")
    p = run_check(shared)
    assert p.returncode != 0 and "used twice" in p.stdout + p.stderr, p.stdout + p.stderr
    ok = tmp_path / "ok.yaml"
    ok.write_text("listen: [127.0.0.1:3128]\nadmin: { listen: '[::1]:9901' }\n")
    p = run_check(ok)
    assert p.returncode == 0, p.stdout + p.stderr


def test_requests_shows_in_flight_exchanges_and_cancel_by_id_stops_the_upstream(sluice_factory, stall_server):
    proxy, admin = admin_proxy(sluice_factory, {"redact_query": ["sig"]})
    out: dict = {}
    t = background_get(proxy.url, stall_server.url + "/slow?sig=TOPSECRET&x=1", out)
    [e] = in_flight(admin, lambda e: "/slow" in e["url"])
    assert "TOPSECRET" not in e["url"] and "sig=<redacted>" in e["url"], e
    assert e["method"] == "GET" and e["state"] == "trying" and e["attempt"] == 1 and e["status"] == 0, e
    assert e["policy"] == "default" and e["host"] == HOST and e["client"].startswith(HOST + ":"), e
    assert wait_until(lambda: stall_server.connection_count() == 1, 5)
    t0 = time.monotonic()
    status, result, _ = admin.call("POST", "/requests/cancel", {"id": e["id"]})
    assert status == 200 and result == {"cancelled": 1, "complete": True}
    t.join(10)
    assert out.get("status") == 503 and "request cancelled by the proxy's operator" in out["body"], out
    rec = stall_server.connections[0]
    assert wait_until(lambda: rec.closed_at is not None, 1.0), "the upstream connection was not closed within 1 s"
    assert rec.closed_at - t0 < 1.0
    assert admin.call("GET", "/requests")[1]["requests"] == []
    # an id that is not in flight cancels nothing
    assert admin.call("POST", "/requests/cancel", {"ids": [e["id"], 12345]})[1]["cancelled"] == 0


def test_cancel_by_host_and_all_and_a_streaming_response_is_cut_off(sluice_factory, stall_server,
                                                                    slow_forever_server):
    proxy, admin = admin_proxy(sluice_factory)
    waiting = [({}, None) for _ in range(3)]
    threads = []
    for out, _ in waiting:
        threads.append(background_get(proxy.url, stall_server.url + "/wait", out))
    in_flight(admin, lambda e: "/wait" in e["url"])
    assert wait_until(lambda: len(admin.call("GET", "/requests")[1]["requests"]) == 3, 10)
    # a host that matches nothing, then the right host (case-insensitive)
    assert admin.call("POST", "/requests/cancel", {"host": "example.invalid"})[1]["cancelled"] == 0
    assert admin.call("POST", "/requests/cancel", {"host": HOST.upper()})[1]["cancelled"] == 3
    for t in threads:
        t.join(10)
    assert [out.get("status") for out, _ in waiting] == [503, 503, 503], waiting

    # a response that already streams: the client sees a truncated message, never a complete one
    with RawConn(HOST, proxy.port, timeout=10) as c:
        c.send(request_bytes("GET", slow_forever_server.url + "/big", {}))
        head = c.read_head()
        assert head is not None and head.status == 200, head
        [e] = in_flight(admin, lambda e: "/big" in e["url"])
        assert e["state"] == "streaming" and e["status"] == 200 and e["bytes_out"] >= 0, e
        assert admin.call("POST", "/requests/cancel", {"all": True})[1]["cancelled"] == 1
        body = c.read_body(head, deadline=time.monotonic() + 10, allow_truncated=True, max_body=2 << 30)
        assert not body.complete and len(body.body) < (1 << 30), "the cancelled response must not complete"
    rec = slow_forever_server.connections[-1]
    assert wait_until(lambda: rec.closed_at is not None, 2.0), "the upstream kept streaming"


def test_reload_through_the_admin_api(sluice_factory, httpbin):
    proxy, admin = admin_proxy(sluice_factory)
    cfg = yaml.safe_load(proxy.config_path.read_text())
    cfg["policies"] = {"default": {"adapters": [{"headers": {"set": {"X-Gen": "2"}}}]}}
    write_config_text(proxy, yaml.safe_dump(cfg))
    status, result, _ = admin.call("POST", "/reload")
    assert status == 200 and result == {"applied": True, "errors": [], "configuration_generation": 2}
    assert session_via(proxy.url).get(httpbin.url + "/headers", timeout=10).json()["headers"].get("X-Gen") == "2"
    write_config_text(proxy, yaml.safe_dump(cfg) + "bogus_key: 1\n")
    status, result, _ = admin.call("POST", "/reload")
    assert status == 422 and not result["applied"] and result["configuration_generation"] == 2, result
    assert any(f"{proxy.config_path}:" in e and "bogus_key" in e for e in result["errors"]), result
    assert admin.call("GET", "/config")[1]["configuration_generation"] == 2
    assert session_via(proxy.url).get(httpbin.url + "/headers", timeout=10).json()["headers"].get("X-Gen") == "2"


def test_readyz_is_503_while_draining(sluice_factory, stall_server):
    proxy, admin = admin_proxy(sluice_factory, {"timeouts": {"drain": "10s"}})
    out: dict = {}
    t = background_get(proxy.url, stall_server.url + "/hold", out)
    in_flight(admin, lambda e: "/hold" in e["url"])
    proxy.signal(signal.SIGTERM)
    assert wait_until(lambda: admin.call("GET", "/readyz")[0] == 503, 5)
    status, ready, _ = admin.call("GET", "/readyz")
    assert ready["ready"] is False and ready["workers_ready"] == 0, ready
    assert admin.call("GET", "/healthz")[0] == 200  # alive while it drains
    # the drain waits for the held request; cancelling it lets the process exit
    assert admin.call("POST", "/requests/cancel", {"all": True})[1]["cancelled"] == 1
    assert proxy.wait(10) == 0
    proxy.expected_exit = True
    t.join(5)
    assert out.get("status") == 503


def scrape(admin: Admin) -> dict[str, float]:
    r = admin.session.get(admin.base + "/metrics", timeout=10,
                          headers={"Authorization": f"Bearer {admin.token}"} if admin.token else {})
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    SEEN.add(("/metrics", "get", "200"))
    values = {}
    for line in r.text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def documented_column(index: int) -> dict[str, str]:
    """docs/metrics.md's metric table: each metric's cell in column `index` (2: type, 4: help)."""
    rows = {}
    for line in (REPO / "docs" / "metrics.md").read_text().splitlines():
        if line.startswith("| `sluice_"):
            cells = [c.strip() for c in line.split("|")]
            rows[cells[1].strip("`")] = cells[index]
    return rows


def test_metrics_follow_traffic_and_match_the_docs(sluice_factory, httpbin, closed_port):
    proxy, admin = admin_proxy(sluice_factory, {"monitors": [{"metrics": {}}],
                                                "policies": {"localhost": {"retry": {"limit": 1, "backoff": {"scale": "1ms"}}}}})
    before = scrape(admin)
    s = session_via(proxy.url)
    for _ in range(5):
        assert s.get(httpbin.url + "/bytes/1000", timeout=10).status_code == 200
    assert s.post(httpbin.url + "/post", data=b"x" * 300, timeout=10).status_code == 200
    assert s.get(f"http://127.0.0.1:{closed_port}/", timeout=10).status_code == 502
    assert s.get(f"http://localhost:{httpbin.port}/status/503", timeout=10).status_code == 503
    # a request held in flight shows in the per-worker gauges
    out: dict = {}
    t = background_get(proxy.url, httpbin.url + "/delay/2", out)
    in_flight(admin, lambda e: "/delay/2" in e["url"])
    during = scrape(admin)
    t.join(10)
    after = scrape(admin)

    def delta(name):
        return after.get(name, 0) - before.get(name, 0)

    assert delta('sluice_requests_total{policy="default",method="GET",status_class="2xx"}') == 6
    assert delta('sluice_requests_total{policy="default",method="POST",status_class="2xx"}') == 1
    assert delta('sluice_requests_total{policy="default",method="GET",status_class="5xx"}') == 1
    assert delta('sluice_requests_total{policy="localhost",method="GET",status_class="5xx"}') == 1
    assert delta('sluice_retries_total{reason="status 503"}') == 1, {k: v for k, v in after.items() if "retr" in k}
    assert delta("sluice_request_body_bytes_total") == 300
    assert delta("sluice_response_body_bytes_total") >= 5000
    assert delta("sluice_upstream_total_seconds_count") == 9  # 7 answered, the refused try, the 503's second try
    # Every try is counted, the 503's first one too.
    assert delta('sluice_upstream_tries_total{kind="request"}') == 10
    assert delta("sluice_upstream_first_byte_seconds_count") >= 8
    assert sum(v for k, v in during.items() if k.startswith("sluice_exchanges_in_flight{")) == 1, during
    assert sum(v for k, v in during.items() if k.startswith("sluice_client_connections{")) >= 1, during
    assert sum(v for k, v in after.items() if k.startswith("sluice_exchanges_in_flight{")) == 0
    assert after["sluice_config_generation"] == 1
    # every documented metric is served (the labelled ones once they have a value), with its type
    r = admin.session.get(admin.base + "/metrics", timeout=10)
    types = dict(line.split()[2:4] for line in r.text.splitlines() if line.startswith("# TYPE "))
    documented = documented_column(2)
    for name, kind in types.items():
        assert documented.get(name) == kind, f"{name} ({kind}) is served but docs/metrics.md says {documented.get(name)}"
    # each # TYPE line follows its metric's # HELP line, with the help text docs/metrics.md gives
    lines = r.text.splitlines()
    helps = documented_column(4)
    for i, line in enumerate(lines):
        if line.startswith("# TYPE "):
            name = line.split()[2]
            assert i > 0 and lines[i - 1] == f"# HELP {name} {helps[name]}", (lines[i - 1], line)
    unseen = set(documented) - set(types)
    assert unseen <= {"sluice_retries_stopped_total", "sluice_trust_failures_total",
                      "sluice_credential_refreshes_total", "sluice_config_reloads_total",
                      # per origin with `health:` (test_health.py serves them)
                      "sluice_upstream_circuit_state", "sluice_upstream_circuit_opened_total",
                      "sluice_upstream_circuit_failed_fast_total",
                      "sluice_cache_total",
                      # a disk tier that cannot write (test_cache_disk.py, on a full tmpfs)
                      "sluice_cache_disk_write_failures_total",
                      # per policy with `rate_limit` (test_limits_lists_what_the_origin_asked_for)
                      "sluice_rate_limit_decisions_total", "sluice_rate_limit_waiting",
                      "sluice_rate_limit_learned_total", "sluice_rate_limit_keys_evicted_total",
                      # with a fleet only (test_fleet_shows_each_workers_redis_and_the_instances)
                      "sluice_fleet_fallbacks_total", "sluice_fleet_instances",
                      # with fleet.cache only (test_fleet_members.py)
                      "sluice_fleet_cache_members",
                      # per peer, once a miss asked one (test_fleet_hop.py)
                      "sluice_peer_requests_total", "sluice_peer_request_duration_seconds",
                      # only once a download broke (test_resume.py)
                      "sluice_download_resumes_total",
                      # per script, once a lua hook ran (test_lua.py, test_lua_tools.py)
                      "sluice_lua_calls_total", "sluice_lua_call_duration_seconds", "sluice_lua_metric_total",
                      }, unseen  # (no cache_store here: test_cache.py has it)
    # a reload is counted by result
    status, _, _ = admin.call("POST", "/reload")
    assert status == 200
    assert scrape(admin)['sluice_config_reloads_total{result="applied"}'] >= 1


def test_dashboard_page_data_and_events(sluice_factory, httpbin):
    proxy, admin = admin_proxy(sluice_factory, {"monitors": [{"metrics": {}}]},
                               token_env={"ADMIN_TOKEN": "dash-" + os.urandom(4).hex()})
    # the page itself needs no token (it holds no data)
    r = admin.session.get(admin.base + "/", timeout=10)
    assert r.status_code == 200 and r.headers["Content-Type"] == "text/html; charset=utf-8"
    assert "/dashboard/events" in r.text and "<script" in r.text
    SEEN.add(("/", "get", "200"))
    # its charting library: same origin, no token, and page and library together under 300 KB
    lib = admin.session.get(admin.base + "/dashboard/chart.js", timeout=10)
    assert lib.status_code == 200 and lib.headers["Content-Type"].startswith("text/javascript"), lib.status_code
    assert b"Chart" in lib.content[:2000] and len(r.content) + len(lib.content) < 300_000, len(lib.content)
    SEEN.add(("/dashboard/chart.js", "get", "200"))
    assert session_via(proxy.url).get(httpbin.url + "/get", timeout=10).status_code == 200
    status, data, _ = admin.call("GET", "/dashboard/data")
    assert status == 200 and data["recording"] is True and data["requests"] >= 1, data
    assert any(h["host"] == HOST for h in data["hosts"]), data
    assert admin.call("GET", "/dashboard/events", token=None, spec_path="/dashboard/events")[0] == 401
    # the stream: two events, a second apart, each a valid payload
    events = []
    with admin.session.get(admin.base + "/dashboard/events", stream=True, timeout=10,
                           headers={"Authorization": f"Bearer {admin.token}"}) as r:
        assert r.status_code == 200 and r.headers["Content-Type"] == "text/event-stream"
        for line in r.iter_lines():
            if line.startswith(b"data: "):
                events.append(json.loads(line[6:]))
                if len(events) == 2:
                    break
    SEEN.add(("/dashboard/events", "get", "200"))
    for e in events:
        validate({"$ref": "#/components/schemas/DashboardPayload"}, e)
    assert 500 <= events[1]["time_ms"] - events[0]["time_ms"] <= 3000, events


def test_dashboard_history_keeps_a_sample_a_second(sluice_factory, httpbin):
    """The last 15 minutes at one sample a second, kept with no page open: the counters grow
    with the traffic, the samples are a second apart, and the ring's size is stated."""
    proxy, admin = admin_proxy(sluice_factory, {"monitors": [{"metrics": {}}]})
    s = session_via(proxy.url)
    for _ in range(3):
        assert s.get(httpbin.url + "/bytes/100", timeout=10).status_code == 200

    def sampled_after_traffic():
        data = admin.call("GET", "/dashboard/history")[1]
        return data if data["requests"] and data["requests"][-1] == 3 and len(data["time_ms"]) >= 3 else None
    assert wait_until(sampled_after_traffic, 10), admin.call("GET", "/dashboard/history")[1]
    data = sampled_after_traffic()
    n = len(data["time_ms"])
    assert all(len(data[k]) == n for k in ("requests", "errors", "origin_5xx", "refusals", "failures", "retries",
                                           "quota_waits", "resumes", "cache_lookups", "cache_served", "bytes_out",
                                           "bytes_from_cache", "bytes_from_origin", "in_flight", "connections",
                                           "p50_ms", "p99_ms")), data
    assert data["bytes_from_origin"][-1] == 300 and data["bytes_from_cache"][-1] == 0 and data["refusals"][-1] == 0
    steps = [b - a for a, b in zip(data["time_ms"], data["time_ms"][1:])]
    assert all(500 <= d <= 2500 for d in steps), steps
    assert data["requests"] == sorted(data["requests"]) and data["requests"][0] <= 3
    assert data["bytes_out"][-1] == 300 and data["errors"][-1] == 0
    assert data["p50_ms"][-1] is not None and data["p50_ms"][-1] > 0
    assert data["capacity"] == 900 and data["interval_ms"] == 1000
    # The ring and the one host's ring; at most the ring, every kind's column and 200 hosts' rings.
    assert 100_000 < data["memory_bytes"] <= 200_000, data["memory_bytes"]
    assert data["memory_bytes"] < data["maximum_bytes"] <= 3_500_000, data["maximum_bytes"]
    assert data["refusals_by_kind"] == {}


def test_dashboard_host_has_its_seconds_policy_and_failures(sluice_factory, httpbin, closed_port):
    """GET /dashboard/host: a host's own seconds, its policy as `sluice check --host` prints
    it, and its failed exchanges with their kind (the query left out)."""
    proxy, admin = admin_proxy(sluice_factory, {"monitors": [{"metrics": {}}], "policies": {
        "localhost": {"retry": {"limit": 1, "errors": ["refused"], "backoff": {"scale": "1ms"}}}}})
    s = session_via(proxy.url)
    assert s.get(httpbin.url + "/status/500", timeout=10).status_code == 500
    assert s.get(f"http://localhost:{closed_port}/gone?key=s3cret", timeout=10).status_code == 502
    assert s.get(httpbin.url + "/bytes/10", timeout=10).status_code == 200

    def host(name: str):
        return admin.call("GET", "/dashboard/host?host=" + name, spec_path="/dashboard/host")
    assert wait_until(lambda: len(host("localhost")[1]["failures"]) == 1 and host(HOST)[1]["history"] is not None, 10)
    status, local, _ = host("localhost")
    assert status == 200 and local["host"] == "localhost"
    assert local["policy"].startswith("policy for localhost: localhost") and "retry: limit 1" in local["policy"]
    (f,) = local["failures"]
    assert f["kind"] == "upstream_refused" and f["status"] == 502 and f["attempts"] == 2, f
    assert f["url"] == f"http://localhost:{closed_port}/gone?…" and "refused" in f["error"], f
    status, mine, _ = host(HOST)
    (f,) = mine["failures"]
    assert f["kind"] == "origin_5xx" and f["status"] == 500 and f["url"].endswith("/status/500") and "error" not in f
    h = mine["history"]
    assert sum(h["requests"]) == 2 and sum(h["errors"]) == 1 and sum(h["bytes_out"]) == 10, h
    assert len(h["time_ms"]) == len(h["requests"]) == len(h["mean_ms"])
    assert any(m is not None and m > 0 for m in h["mean_ms"]), h
    # a host with no traffic: its policy, no history, no failures
    status, quiet, _ = host("quiet.example")
    assert status == 200 and quiet["history"] is None and quiet["failures"] == []
    assert quiet["policy"].startswith("policy for quiet.example: default")
    assert admin.call("GET", "/dashboard/host", spec_path="/dashboard/host")[0] == 400


def test_upstreams_lists_every_circuit(sluice_factory, closed_port):
    proxy, admin = admin_proxy(sluice_factory, {"policies": {"127.0.0.1": {"health": {"consecutive_failures": 1, "cooldown": "30s"}}}})
    status, data, _ = admin.call("GET", "/upstreams")
    assert status == 200 and data == {"upstreams": [], "pools": [], "complete": True}, data
    s = session_via(proxy.url)
    assert s.get(f"http://127.0.0.1:{closed_port}/", timeout=10).status_code == 502  # refused: opens it
    r = s.get(f"http://127.0.0.1:{closed_port}/", timeout=10)
    assert r.status_code == 503 and "circuit is open" in r.text, r.text
    status, data, _ = admin.call("GET", "/upstreams")
    assert status == 200, data
    (up,) = data["upstreams"]
    assert up["origin"] == f"http://127.0.0.1:{closed_port}" and up["state"] == "open", up
    assert up["opens"] == 1 and up["failed_fast"] == 1 and up["failure_threshold"] == 1 and up["cooldown_ms"] == 30000, up
    assert up["probe"] is None and 0 <= up["opened_ms_ago"] < 30000, up


def test_upstreams_lists_the_pooled_connections(sluice_factory, nginx):
    """The native transport's keep-alive pools by origin: a connection carried a request and
    waits idle for the next; both workers' pools are counted."""
    proxy, admin = admin_proxy(sluice_factory)
    s = session_via(proxy.url)
    for i in range(4):
        assert s.get(nginx.url(f"/1k?i={i}"), timeout=10).status_code == 200
    origin = f"http://{HOST}:{nginx.http_port}"

    def pool():
        data = admin.call("GET", "/upstreams")[1]
        return next((p for p in data["pools"] if p["origin"] == origin), None)
    assert wait_until(lambda: pool() is not None and pool()["idle"] >= 1, 5), admin.call("GET", "/upstreams")[1]
    # One client connection: one worker, whose one upstream connection carried the four.
    assert pool() == {"origin": origin, "open": 1, "idle": 1}, pool()


class ClosesWhenIdle(ThreadedServer):
    """Answers one request per connection with a keep-alive 200, then closes it a second
    later, as an origin's short keep-alive timeout does."""

    def handle(self, conn, rec):
        Reader(conn, record=rec.data).read_head()
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        time.sleep(1.0)  # server behaviour: the origin's keep-alive timeout


def test_upstreams_pool_forgets_a_connection_the_origin_closed(sluice_factory):
    """An idle pooled connection the origin closes leaves the pool and its count."""
    origin_server = ClosesWhenIdle()
    try:
        proxy, admin = admin_proxy(sluice_factory)
        assert session_via(proxy.url).get(origin_server.url + "/x", timeout=10).status_code == 200
        origin = f"http://{HOST}:{origin_server.port}"

        def pool():
            return next((p for p in admin.call("GET", "/upstreams")[1]["pools"] if p["origin"] == origin), None)
        assert pool() == {"origin": origin, "open": 1, "idle": 1}, pool()  # within the origin's second
        assert wait_until(lambda: pool() is None, 5), pool()
    finally:
        origin_server.stop()


def test_a_try_waiting_for_its_rate_limit_turn_is_listed_and_cancellable(sluice_factory, httpbin):
    """`rate_limit: 1/min`: the first request takes the minute's place, the second waits for
    the next and shows as `rate_limited` in GET /requests (no try started yet); cancelling it
    answers 503 at once."""
    proxy, admin = admin_proxy(sluice_factory, {
        "policies": {"default": {"rate_limit": {"rate": "1/min", "max_wait": "2m"}}}})
    url = httpbin.url + "/get"
    assert session_via(proxy.url).get(url, timeout=10).status_code == 200
    out: dict = {}
    t = background_get(proxy.url, url + "?second=1", out)
    [e] = in_flight(admin, lambda e: "second=1" in e["url"])
    assert e["state"] == "rate_limited" and e["attempt"] == 0, e
    status, result, _ = admin.call("POST", "/requests/cancel", {"id": e["id"]})
    assert status == 200 and result["cancelled"] == 1, result
    t.join(10)
    assert out.get("status") == 503 and "request cancelled by the proxy's operator" in out["body"], out
    assert admin.call("GET", "/requests")[1]["requests"] == []


def test_limits_lists_what_the_origin_asked_for(sluice_factory, httpbin):
    """An origin's `X-RateLimit-Remaining: 0` with `X-RateLimit-Reset: 30` (httpbin echoes the
    fields it is asked for): GET /limits shows the hold on the host with its time left and
    where it was read, the next request is refused (reject mode) and counted, and /metrics
    has the counters."""
    proxy, admin = admin_proxy(sluice_factory, {
        "policies": {"default": {"rate_limit": {"rate": "100/s", "burst": 10, "on_limit": "reject"}}}})
    session = session_via(proxy.url)
    r = session.get(httpbin.url + "/response-headers?X-RateLimit-Remaining=0&X-RateLimit-Reset=30", timeout=10)
    assert r.status_code == 200
    refused = session.get(httpbin.url + "/get", timeout=10)
    assert refused.status_code == 429 and "asked for no more requests" in refused.text, refused.text
    status, data, _ = admin.call("GET", "/limits")
    assert status == 200, data
    [policy] = data["policies"]
    assert policy["policy"] == "default" and policy["limits"] == ["100/s (burst 10)"], policy
    assert policy["on_limit"] == "reject" and policy["learn"] is True and "max_concurrent" not in policy, policy
    assert policy["allowed"] == 1 and policy["rejected"] == 1 and policy["learned"] == 1, policy
    [hold] = policy["holds"]
    assert hold["key"] == "127.0.0.1" and 25_000 < hold["remaining_ms"] <= 30_000, hold
    assert hold["reason"] == "X-RateLimit-Remaining: 0, X-RateLimit-Reset: 30", hold
    text = admin.session.get(admin.base + "/metrics", timeout=10).text
    assert 'sluice_rate_limit_learned_total{policy="default"} 1' in text, text
    assert 'sluice_rate_limit_decisions_total{policy="default",decision="rejected"} 1' in text, text
    assert 'sluice_rate_limit_waiting{policy="default"} 0' in text, text


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_fleet_shows_each_workers_redis_and_the_instances(sluice_factory, httpbin, tmp_path):
    """GET /fleet: 404 without a fleet; with one (a real redis-server), every worker is
    `ready` with round-trip figures once a request went through, and the heartbeat counts this
    instance; with Redis gone the workers say so and the fallbacks are counted."""
    from test_fleet import Redis
    _, plain = admin_proxy(sluice_factory)
    status, data, _ = plain.call("GET", "/fleet")
    assert status == 404 and "no fleet is configured" in data["error"], data
    redis = Redis(tmp_path).start()
    try:
        proxy, admin = admin_proxy(sluice_factory, {
            "fleet": {"redis": f"127.0.0.1:{redis.port}", "heartbeat": "200ms"},
            "policies": {"default": {"rate_limit": {"rate": "100/s", "burst": 10}}}})
        session = session_via(proxy.url)
        for _ in range(4):
            assert session.get(httpbin.url + "/get", timeout=10).status_code == 200
        assert wait_until(lambda: admin.call("GET", "/fleet")[1]["instances_alive"] == 1, 5)
        status, data, _ = admin.call("GET", "/fleet")
        assert status == 200 and data["redis"] == f"127.0.0.1:{redis.port}" and data["fallbacks"] == 0, data
        assert [w["state"] for w in data["workers"]] == ["ready", "ready"], data
        assert sum(w["commands"] for w in data["workers"]) >= 4, data
        dashboard = admin.call("GET", "/dashboard/data")[1]
        assert dashboard["fleet"] == {"instances_alive": 1, "fallbacks": 0}, dashboard
        assert "sluice_fleet_instances 1" in admin.session.get(admin.base + "/metrics", timeout=10).text
        redis.kill()
        for _ in range(4):
            assert session.get(httpbin.url + "/get", timeout=10).status_code == 200  # local_share
        status, data, _ = admin.call("GET", "/fleet")
        assert data["fallbacks"] >= 1 and "connecting" in [w["state"] for w in data["workers"]], data
        # Reconnecting fails three times in a row within a second: an episode.
        assert wait_until(lambda: admin.call("GET", "/fleet")[1]["fallback_episodes"] >= 1, 5), data
        metrics = admin.session.get(admin.base + "/metrics", timeout=10).text
        assert 'sluice_fleet_fallbacks_total{mode="local_share"}' in metrics, metrics
    finally:
        redis.stop()


def test_every_documented_answer_was_seen():
    """Runs last in this file (the module is one xdist group, so on one worker): every path and
    method in docs/admin-api.yaml was exercised."""
    documented = {(p, m) for p, ops in SPEC["paths"].items() for m in ops}
    exercised = {(p, m) for p, m, _ in SEEN}
    assert documented <= exercised, f"not exercised: {sorted(documented - exercised)}"

