"""Gateway routes (docs/configuration.md, "Gateway routes"): a listener that takes
origin-form requests and forwards them to a base URL with the path appended, through the
policy of the upstream's host; Host is replaced; CONNECT and absolute-form get 400."""

import json

from faultservers import pick_port
from policy_support import AccessLog, header_values, monitors
from rawhttp import RawConn, request_bytes
from support import HOST, port_open, session_via, wait_until


def route_proxy(sluice_factory, upstream: str, extra: dict | None = None):
    rport = pick_port()
    cfg = {"routes": [{"listen": f"{HOST}:{rport}", "upstream": upstream}]}
    cfg.update(extra or {})
    proxy = sluice_factory(cfg)
    assert wait_until(lambda: port_open(rport), 5), f"route listener {rport} not open"
    return proxy, rport




def route_request(rport: int, method: str, target: str, headers=None, body: bytes = b""):
    with RawConn(HOST, rport, timeout=15) as c:
        c.send(request_bytes(method, target, headers, body=body, host=f"{HOST}:{rport}"))
        return c.read_response(method=method)


def test_route_forwards_origin_form_to_base_url(sluice_factory, httpbin):
    _, rport = route_proxy(sluice_factory, httpbin.url)
    r = route_request(rport, "GET", "/get?x=1")
    assert r is not None and r.status == 200, r
    j = json.loads(r.body)
    assert j["args"] == {"x": "1"}, j
    assert j["url"] == httpbin.url + "/get?x=1", j
    assert j["headers"]["Host"] == f"127.0.0.1:{httpbin.port}", "the client's Host must be replaced"


def test_route_base_path_prefix_is_kept(sluice_factory, httpbin):
    _, rport = route_proxy(sluice_factory, httpbin.url + "/anything/base")
    r = route_request(rport, "GET", "/users?id=1")
    assert r is not None and r.status == 200, r
    assert json.loads(r.body)["url"] == httpbin.url + "/anything/base/users?id=1"
    r = route_request(rport, "POST", "/items/7", {"Content-Type": "text/plain"}, body=b"route body")
    j = json.loads(r.body)
    assert j["url"] == httpbin.url + "/anything/base/items/7" and j["method"] == "POST"
    assert j["data"] == "route body", j


def test_route_keepalive_serves_several_requests(sluice_factory, httpbin):
    _, rport = route_proxy(sluice_factory, httpbin.url)
    with RawConn(HOST, rport, timeout=15) as c:
        for i in range(3):
            c.send(request_bytes("GET", f"/get?i={i}", host=f"{HOST}:{rport}"))
            r = c.read_response()
            assert r.status == 200 and json.loads(r.body)["args"] == {"i": str(i)}, r


def test_route_uses_policy_of_upstream_host(sluice_factory, httpbin, tmp_path):
    log = AccessLog(tmp_path / "access.log")
    _, rport = route_proxy(sluice_factory, httpbin.url, {
        "monitors": monitors(access=log.path),
        "policies": {
            "default": {"adapters": [{"headers": {"set": {"X-Default": "d"}}}]},
            HOST: {"adapters": [{"headers": {"add": {"X-Route-Policy": "upstream-host"}}},
                                {"bearer": "route-token"}]},
            "localhost": {"adapters": [{"headers": {"set": {"X-Wrong": "localhost-policy"}}}]},
        }})
    r = route_request(rport, "GET", "/headers")
    assert r.status == 200, r
    h = json.loads(r.body)["headers"]
    assert h.get("X-Default") == "d" and h.get("X-Route-Policy") == "upstream-host", h
    assert h.get("Authorization") == "Bearer route-token", h
    assert "X-Wrong" not in h
    e = log.wait_for()[0]
    assert e["policy"] == HOST, e
    assert e["url"] == httpbin.url + "/headers", e


def test_route_to_localhost_uses_localhost_policy(sluice_factory, httpbin, recorder):
    _, rport = route_proxy(sluice_factory, f"http://localhost:{recorder.port}/base", {"policies": {
        "localhost": {"adapters": [{"headers": {"set": {"X-P": "localhost"}}}]},
        HOST: {"adapters": [{"headers": {"set": {"X-P": "ip"}}}]},
    }})
    r = route_request(rport, "GET", "/path?q=1", [("X-Client", "c")])
    assert r.status == 200 and r.body == b"recorded", r
    (q,) = recorder.requests()
    assert q["target"] == "/base/path?q=1", q["raw_head"]
    assert header_values(q["headers"], "Host") == [f"localhost:{recorder.port}"], q["raw_head"]
    assert header_values(q["headers"], "X-P") == ["localhost"], q["raw_head"]
    assert header_values(q["headers"], "X-Client") == ["c"], q["raw_head"]


def test_connect_on_route_listener_is_400(sluice_factory, httpbin, recorder):
    _, rport = route_proxy(sluice_factory, recorder.url)
    with RawConn(HOST, rport, timeout=10) as c:
        c.send(f"CONNECT {HOST}:{httpbin.port} HTTP/1.1\r\nHost: {HOST}:{httpbin.port}\r\n\r\n".encode())
        r = c.read_response(method="CONNECT")
    assert r is not None and r.status == 400, r
    assert r.body.startswith(b"sluice: "), r
    assert recorder.connection_count() == 0


def test_absolute_form_on_route_listener_is_400(sluice_factory, httpbin, recorder):
    _, rport = route_proxy(sluice_factory, recorder.url)
    with RawConn(HOST, rport, timeout=10) as c:
        c.send(request_bytes("GET", f"{httpbin.url}/get"))
        r = c.read_response()
    assert r is not None and r.status == 400, r
    assert r.body.startswith(b"sluice: "), r
    assert recorder.connection_count() == 0


def test_forward_listener_still_proxies_with_routes(sluice_factory, httpbin):
    proxy, _ = route_proxy(sluice_factory, httpbin.url + "/anything")
    r = session_via(proxy.url).get(httpbin.url + "/get?fwd=1", timeout=10)
    assert r.status_code == 200 and r.json()["args"] == {"fwd": "1"}
    # and origin-form on the forward listener is still 400 (docs/errors.md)
    with RawConn(HOST, proxy.port, timeout=10) as c:
        c.send(request_bytes("GET", "/get", host=f"{HOST}:{httpbin.port}"))
        r = c.read_response()
    assert r is not None and r.status == 400, r


def test_route_to_https_upstream(sluice_factory, nginx):
    """Plain HTTP in, TLS to the origin, verified against tls.ca_file (the test CA)."""
    _, rport = route_proxy(sluice_factory, nginx.tls_url(""))
    r = route_request(rport, "GET", "/1k")
    assert r is not None and r.status == 200, r
    assert r.body == nginx.file_1k


def test_route_honours_allow_clients(sluice_factory, httpbin, recorder):
    """access.allow_clients applies to routes: a client outside it is closed at accept."""
    rport = pick_port()
    sluice_factory({"access": {"allow_clients": ["10.0.0.0/8"]},
                    "routes": [{"listen": f"{HOST}:{rport}", "upstream": recorder.url}]})
    assert wait_until(lambda: port_open(rport), 5)
    with RawConn(HOST, rport, timeout=5) as c:
        try:
            c.send(request_bytes("GET", "/x", host=f"{HOST}:{rport}"))
        except OSError:
            pass
        try:
            r = c.read_response(timeout=5)
        except (OSError, TimeoutError) as e:
            r = e
        assert r is None, f"a client outside allow_clients got {r!r}"
    assert recorder.connection_count() == 0


# ---- Forwarded headers (routes[].forwarded, routes[].trusted_clients) ----------------------

FORGED = {"X-Forwarded-For": "6.6.6.6", "X-Forwarded-Proto": "https",
          "X-Forwarded-Host": "forged.example", "Forwarded": "for=6.6.6.6"}


def forwarded_route(sluice_factory, upstream: str, listen_host: str = HOST, **route):
    rport = pick_port()
    shown = f"[{listen_host}]" if ":" in listen_host else listen_host
    proxy = sluice_factory({"routes": [{"listen": f"{shown}:{rport}", "upstream": upstream, **route}],
                            "access": {"allow_clients": ["127.0.0.0/8", "::1/128"]}})
    assert wait_until(lambda: port_open(rport, host=listen_host), 5), f"route listener {rport} not open"
    return proxy, rport


def seen_headers(host: str, rport: int, headers: dict) -> dict:
    with RawConn(host, rport, timeout=15) as c:
        shown = f"[{host}]" if ":" in host else host
        c.send(request_bytes("GET", "/headers?show_env=1", headers, host=f"{shown}:{rport}"))
        r = c.read_response()
    assert r is not None and r.status == 200, r
    return json.loads(r.body)["headers"]


def test_route_x_forwarded_by_default_replaces_forged_fields(sluice_factory, httpbin):
    _, rport = forwarded_route(sluice_factory, httpbin.url)
    seen = seen_headers(HOST, rport, FORGED)
    assert seen.get("X-Forwarded-For") == "127.0.0.1", seen
    assert seen.get("X-Forwarded-Proto") == "http", seen
    assert seen.get("X-Forwarded-Host") == f"{HOST}:{rport}", seen
    assert "Forwarded" not in seen, "an untrusted client's Forwarded must not reach the origin"


def test_route_rfc7239_forwarded(sluice_factory, httpbin):
    _, rport = forwarded_route(sluice_factory, httpbin.url, forwarded="rfc7239")
    seen = seen_headers(HOST, rport, FORGED)
    assert seen.get("Forwarded") == f'for=127.0.0.1;proto=http;host="{HOST}:{rport}"', seen
    assert not [k for k in seen if k.lower().startswith("x-forwarded")], seen


def test_route_rfc7239_ipv6_client_is_bracketed_and_quoted(sluice_factory, httpbin):
    _, rport = forwarded_route(sluice_factory, httpbin.url, listen_host="::1", forwarded="rfc7239")
    seen = seen_headers("::1", rport, {})
    assert seen.get("Forwarded") == f'for="[::1]";proto=http;host="[::1]:{rport}"', seen


def test_route_forwarded_none_adds_nothing_and_strips_forgeries(sluice_factory, httpbin):
    _, rport = forwarded_route(sluice_factory, httpbin.url, forwarded="none")
    seen = seen_headers(HOST, rport, FORGED)
    assert not [k for k in seen if k.lower().startswith("x-forwarded") or k.lower() == "forwarded"], seen


def test_route_trusted_client_chain_is_extended(sluice_factory, httpbin):
    _, rport = forwarded_route(sluice_factory, httpbin.url, trusted_clients=["127.0.0.0/8"])
    seen = seen_headers(HOST, rport, {"X-Forwarded-For": "203.0.113.9", "X-Forwarded-Proto": "https"})
    # Two field lines of one list field: the origin reads them as one list.
    assert seen.get("X-Forwarded-For") == "203.0.113.9,127.0.0.1" or \
        seen.get("X-Forwarded-For") == "203.0.113.9, 127.0.0.1", seen
    assert seen.get("X-Forwarded-Proto") == "https", "a trusted client's first hop is kept"
    # A client outside trusted_clients on the same kind of route is not believed.
    _, other = forwarded_route(sluice_factory, httpbin.url, trusted_clients=["10.0.0.0/8"])
    seen = seen_headers(HOST, other, {"X-Forwarded-For": "203.0.113.9"})
    assert seen.get("X-Forwarded-For") == "127.0.0.1", seen


def test_route_forwarded_bad_value_is_a_located_error(sluice_bin, tmp_path):
    import subprocess
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("routes:\n  - listen: 127.0.0.1:18999\n    upstream: http://127.0.0.1:9\n    forwarded: xff\n")
    r = subprocess.run([sluice_bin, "check", "--config", str(cfg)], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert f"{cfg}:4:16" in r.stderr and "rfc7239, x_forwarded, none" in r.stderr, r.stderr
