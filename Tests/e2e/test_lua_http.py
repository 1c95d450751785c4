"""`sluice.http` (docs/scripting.md, "Sub-requests"): a script's sub-request waits without
holding the worker, goes through the target host's own policy (here a header adapter the
audit origin sees), only to hosts in `lua.allow_hosts` and never to the admin listener, at
most `limits.subrequests` per call, at most `LuaSubrequest.maxDepth` deep; `limits.wall`
covers the wait and a slow origin gets 502 within it while the worker serves on; a wait
across a C boundary is a script error, not a crash. The audit origin is a small recording
server of this module, reached as `localhost` so that it has its own policy."""

import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from faultservers import pick_port
from policy_support import AccessLog, monitors
from support import HOST, session_via, wait_until

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "lua"


class AuditServer:
    """Records each request (method, path, headers, body) and answers `status` after `delay`
    seconds; the first requests get `first` (one status each) instead, and a 200 carries
    `cache_control` when it is set."""

    def __init__(self, status: int = 200, delay: float = 0.0, first: tuple[int, ...] = (), cache_control: str = ""):
        self.status, self.delay, self.cache_control = status, delay, cache_control
        self.first = list(first)
        self.seen: list[dict] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def handle_one(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                with outer.lock:
                    outer.seen.append({"method": self.command, "path": self.path, "body": body,
                                       "headers": {k.lower(): v for k, v in self.headers.items()}})
                if outer.delay:
                    time.sleep(outer.delay)  # server behaviour: a slow origin the script waits on
                payload = b'{"ok": true}'
                with outer.lock:
                    status = outer.first.pop(0) if outer.first else outer.status
                self.send_response(status)
                if status == 200 and outer.cache_control:
                    self.send_header("Cache-Control", outer.cache_control)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = handle_one

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((HOST, pick_port()), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def requests(self) -> list[dict]:
        with self.lock:
            return list(self.seen)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def audit():
    servers: list[AuditServer] = []

    def make(**kw) -> AuditServer:
        servers.append(AuditServer(**kw))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def config(tmp_path: Path, entry: dict, audit_policy: dict | None = None, **more) -> dict:
    policies = {HOST: {"adapters": [{"lua": entry}]}}
    if audit_policy is not None:
        policies["localhost"] = audit_policy
    cfg = {"policies": policies, "monitors": monitors(access=tmp_path / "access.log")}
    cfg.update(more)
    return cfg


def get(proxy, recorder, path: str = "/t", headers: dict | None = None, timeout: float = 10):
    with session_via(proxy.url) as s:
        return s.get(f"http://{HOST}:{recorder.port}{path}", headers=headers, timeout=timeout)


def lua_line(tmp_path: Path, status: int) -> dict:
    """The `lua` field of the first access log line with `status` that has one (a sub-request's
    own line, through a policy without a script, has none)."""
    return AccessLog(tmp_path / "access.log").wait_for(lambda e: e.get("status") == status and "lua" in e)[0]["lua"]


def test_audit_summary_recipe_goes_through_the_audit_hosts_policy(sluice_factory, recorder, audit, tmp_path):
    sink = audit()
    proxy = sluice_factory(config(tmp_path, {
        "file": str(EXAMPLES / "audit-summary.lua"),
        "allow_hosts": [f"localhost:{sink.port}"],
        "config": {"url": f"http://localhost:{sink.port}/events", "header": "X-Client-Id"},
    }, audit_policy={"adapters": [{"headers": {"set": {"X-Audit-Policy": "seen"}}}]}))
    r = get(proxy, recorder, "/orders?id=7", {"X-Client-Id": "c-42"})
    assert r.status_code == 200, r.text
    (event,) = sink.requests()
    assert event["method"] == "POST" and event["path"] == "/events"
    assert json.loads(event["body"]) == {"method": "GET", "path": "/orders", "X-Client-Id": "c-42"}
    assert event["headers"]["content-type"] == "application/json"
    assert event["headers"]["x-audit-policy"] == "seen", event  # the audit host's own policy ran
    assert "sluice-lua-depth" not in event["headers"], event  # the depth stays in Sluice
    assert recorder.requests()[-1]["target"].endswith("/orders?id=7")
    assert lua_line(tmp_path, 200)["vars"] == {"audit": 200}


def test_a_sub_request_carries_only_the_fields_the_script_wrote(sluice_factory, recorder, audit, tmp_path):
    # libcurl's own `Accept: */*` and form `Content-Type` stay out; what the script sets goes.
    sink = audit()
    source = f"""return {{ on_request = function(req, ctx)
      local a = sluice.http{{ method = "POST", url = "http://localhost:{sink.port}/a", headers = {{ ["X-S"] = "1" }},
                             body = "hi" }}
      local b = sluice.http{{ url = "http://localhost:{sink.port}/b", headers = {{ Accept = "text/plain" }} }}
      ctx.vars.statuses = a.status .. "," .. b.status
    end }}"""
    proxy = sluice_factory(config(tmp_path, {"source": source, "allow_hosts": [f"localhost:{sink.port}"]}))
    assert get(proxy, recorder, "/f").status_code == 200
    first, second = sink.requests()
    assert first["method"] == "POST" and first["body"] == b"hi" and first["headers"]["x-s"] == "1", first
    assert "content-type" not in first["headers"] and "accept" not in first["headers"], first
    assert "expect" not in first["headers"], first
    assert second["headers"]["accept"] == "text/plain", second
    assert lua_line(tmp_path, 200)["vars"] == {"statuses": "200,200"}


def test_a_sub_request_is_retried_and_cached_by_its_hosts_policy(sluice_factory, recorder, audit, tmp_path):
    """A sub-request goes through the target host's whole pipeline, not only its adapters: that
    host's `retry` turns a 503 into a second try (the script sees its 200), and the cache
    answers the next scripts' calls (the origin sees two requests for three calls)."""
    sink = audit(first=(503,), cache_control="max-age=60")
    source = f"""return {{ on_request = function(req, ctx)
        local res = sluice.http{{url = "http://localhost:{sink.port}/token"}}
        ctx.vars.sub = res.status
    end }}"""
    proxy = sluice_factory(config(
        tmp_path, {"source": source, "allow_hosts": [f"localhost:{sink.port}"]},
        audit_policy={"retry": {"limit": 1, "backoff": {"scale": "1ms"}}},
        cache_store={"memory": "16MiB", "max_object_size": "1MiB"}))
    for i in range(3):
        assert get(proxy, recorder, f"/t{i}").status_code == 200
    assert [(r["method"], r["path"]) for r in sink.requests()] == [("GET", "/token")] * 2
    log = AccessLog(tmp_path / "access.log")
    assert [line["lua"]["vars"] for line in log.wait_for(lambda e: "lua" in e, n=3)] == [{"sub": 200}] * 3
    # The sub-requests' own lines (each worker's buffer is written in turn: not in time order).
    subs = log.wait_for(lambda e: e.get("url", "").endswith("/token"), n=3)
    (tried,) = [line for line in subs if line["attempts"] > 0]
    assert tried["attempts"] == 2 and tried["retries"][0]["reason"].startswith("status 503"), tried
    assert tried["cache"] == "fwd=uri-miss; stored", tried
    hits = [line for line in subs if line["cache"].startswith("hit") and line["attempts"] == 0]
    assert len(hits) == 2, subs


def test_an_unlisted_host_is_refused(sluice_factory, recorder, audit, tmp_path):
    sink = audit()
    source = f'return {{ on_request = function(req) sluice.http{{url = "http://localhost:{sink.port}/x"}} end }}'
    proxy = sluice_factory(config(tmp_path, {"source": source, "allow_hosts": ["audit.invalid"]}))
    assert get(proxy, recorder).status_code == 502
    assert not sink.requests() and not recorder.requests()
    assert f"localhost:{sink.port} is not in this entry's lua.allow_hosts" in lua_line(tmp_path, 502)["error"]


def test_the_admin_listener_is_refused_even_when_listed(sluice_factory, recorder, tmp_path):
    admin = pick_port()
    source = f'return {{ on_request = function(req) sluice.http{{url = "http://{HOST}:{admin}/metrics"}} end }}'
    proxy = sluice_factory(config(tmp_path, {"source": source, "allow_hosts": [HOST, f"{HOST}:{admin}"]},
                                  admin={"listen": f"{HOST}:{admin}"}))
    assert get(proxy, recorder).status_code == 502
    assert "is refused: it is this Sluice's admin listener" in lua_line(tmp_path, 502)["error"]
    assert not recorder.requests()


def test_the_subrequest_past_the_cap_is_an_error(sluice_factory, recorder, audit, tmp_path):
    sink = audit()
    source = (f'return {{ on_request = function(req) for i = 1, 3 do '
              f'sluice.http{{url = "http://localhost:{sink.port}/n" .. i}} end end }}')
    proxy = sluice_factory(config(tmp_path, {"source": source, "allow_hosts": ["localhost"],
                                             "limits": {"subrequests": 2}}))
    assert get(proxy, recorder).status_code == 502
    assert [e["path"] for e in sink.requests()] == ["/n1", "/n2"]
    assert "limits.subrequests (2) reached" in lua_line(tmp_path, 502)["error"]


def test_the_wall_limit_stops_a_script_waiting_on_a_slow_origin(sluice_factory, recorder, audit, tmp_path):
    slow = audit(delay=5.0)
    source = (f'return {{ on_request = function(req) if req.path == "/slow" then '
              f'sluice.http{{url = "http://localhost:{slow.port}/"}} end end }}')
    proxy = sluice_factory(config(tmp_path, {"source": source, "allow_hosts": ["localhost"],
                                             "limits": {"wall": "500ms"}}, workers=1))
    t0 = time.monotonic()
    r = get(proxy, recorder, "/slow")
    took = time.monotonic() - t0
    assert r.status_code == 502, r.text
    assert 0.4 < took < 1.5, took
    lua = lua_line(tmp_path, 502)
    assert lua["outcome"] == "limit" and "wall-clock limit reached while waiting" in lua["error"], lua
    # The one worker serves the next request at once, with the same script.
    t0 = time.monotonic()
    assert get(proxy, recorder, "/fast").status_code == 200
    assert time.monotonic() - t0 < 1.0


def test_requests_are_served_while_a_script_waits(sluice_factory, recorder, audit, tmp_path):
    slow = audit(delay=1.0)
    source = (f'return {{ on_request = function(req) if req.path == "/slow" then '
              f'local r = sluice.http{{url = "http://localhost:{slow.port}/"}}; '
              f'req.headers:set("X-Audit", tostring(r.status)) end end }}')
    proxy = sluice_factory(config(tmp_path, {"source": source, "allow_hosts": ["localhost"],
                                             "limits": {"wall": "3s"}}, workers=1))
    result = {}
    waiting = threading.Thread(target=lambda: result.update(r=get(proxy, recorder, "/slow")))
    waiting.start()
    assert wait_until(lambda: slow.requests(), 5)
    t0 = time.monotonic()
    assert get(proxy, recorder, "/fast").status_code == 200
    assert time.monotonic() - t0 < 0.8  # not queued behind the waiting script
    waiting.join(10)
    assert result["r"].status_code == 200
    assert headers_of(recorder, "/slow")["x-audit"] == "200"


def test_a_call_waiting_across_a_reload_or_a_limit_ends_in_its_own_state(sluice_factory, recorder, audit, tmp_path):
    # A call waits on a slow sub-request while (a) a reload replaces its script, (b) another
    # request's runaway loop poisons its state: it ends well in its state, its on_log sees the
    # ctx its on_request filled, and the worker keeps one state per script it runs.
    from policy_support import sighup
    from test_metric_values import scrape, value
    slow = audit(delay=1.2)
    script = tmp_path / "w.lua"
    text = (f'return {{ on_request = function(req, ctx) if req.path == "/loop" then while true do end end '
            f'ctx.vars.tag = req.path; local r = sluice.http{{url = "http://localhost:{slow.port}/"}}; '
            f'req.headers:set("X-Audit", tostring(r.status)) end, '
            f'on_log = function(ctx) ctx.vars.logged = ctx.vars.tag or "none" end }}')
    script.write_text(text)
    admin = pick_port()
    cfg = config(tmp_path, {"file": str(script), "allow_hosts": ["localhost"], "limits": {"wall": "4s"}}, workers=1)
    cfg["monitors"].append({"metrics": {}})
    cfg["admin"] = {"listen": f"{HOST}:{admin}"}
    proxy = sluice_factory(cfg)
    log = AccessLog(tmp_path / "access.log")
    for case in ("reload", "limit"):
        result = {}
        waiting = threading.Thread(target=lambda: result.update(r=get(proxy, recorder, f"/{case}")))
        waiting.start()
        assert wait_until(lambda: len(slow.requests()) >= (1 if case == "reload" else 2), 5)
        if case == "reload":
            script.write_text(text + "\n-- edited")
            sighup(proxy)
        else:
            assert get(proxy, recorder, "/loop").status_code == 502
        waiting.join(10)
        assert result["r"].status_code == 200, result["r"].text
        assert headers_of(recorder, f"/{case}")["x-audit"] == "200"
        entry = log.wait_for(lambda e: e.get("url", "").endswith(f"/{case}"))[0]
        assert entry["lua"]["vars"] == {"tag": f"/{case}", "logged": f"/{case}"}, entry
    # One state: the edited script's, rebuilt after the limit (the retired and the poisoned
    # ones went with their last calls).
    assert get(proxy, recorder, "/after").status_code == 200
    assert value(scrape(admin), "sluice_lua_states") == 1


def headers_of(recorder, path: str) -> dict:
    """The header fields, by lower-case name, of the last request for `path` the origin got."""
    last = [r for r in recorder.requests() if r["target"].endswith(path)][-1]
    return {k.lower(): v for k, v in last["headers"]}


@pytest.mark.parametrize("body", [
    'table.sort({3, 2, 1}, function(a, b) sluice.http{url = URL}; return a < b end)',
    'string.gsub("ab", ".", function(c) sluice.http{url = URL} end)',
])
def test_waiting_across_a_c_boundary_is_a_script_error(sluice_factory, recorder, audit, tmp_path, body):
    sink = audit()
    source = (f'local URL = "http://localhost:{sink.port}/"\n'
              f'return {{ on_request = function(req) {body} end }}')
    proxy = sluice_factory(config(tmp_path, {"source": source, "allow_hosts": ["localhost"]}, workers=1))
    assert get(proxy, recorder).status_code == 502
    assert "sluice.http cannot wait here" in lua_line(tmp_path, 502)["error"]
    assert not sink.requests()
    with session_via(proxy.url) as s:  # alive, and serving
        assert s.get(f"http://localhost:{recorder.port}/next", timeout=5).status_code == 200


def test_pcall_can_wait(sluice_factory, recorder, audit, tmp_path):
    sink = audit(status=201)
    source = (f'return {{ on_request = function(req) local ok, r = pcall(sluice.http, '
              f'{{url = "http://localhost:{sink.port}/p"}}); req.headers:set("X-Audit", tostring(r.status)) end }}')
    proxy = sluice_factory(config(tmp_path, {"source": source, "allow_hosts": ["localhost"]}))
    assert get(proxy, recorder).status_code == 200
    assert headers_of(recorder, "/t")["x-audit"] == "201"


def test_scripts_that_call_themselves_stop_at_the_depth_limit(sluice_factory, recorder, tmp_path):
    # Each request's script calls the same host again: the client's (depth 0) and the first
    # sub-request's (depth 1) may; the second sub-request's script may not, and its 502 is
    # what the first sub-request's script reads.
    source = (f'return {{ on_request = function(req) '
              f'local r = sluice.http{{url = "http://{HOST}:{recorder.port}/again"}}; '
              f'req.headers:set("X-Sub", tostring(r.status)) end }}')
    proxy = sluice_factory(config(tmp_path, {"source": source, "allow_hosts": [HOST], "limits": {"wall": "3s"}}))
    r = get(proxy, recorder, "/t")
    assert r.status_code == 200, r.text
    outer, inner = headers_of(recorder, "/t"), headers_of(recorder, "/again")
    assert outer["x-sub"] == "200" and inner["x-sub"] == "502", (outer, inner)
    assert "sluice-lua-depth" not in outer and "sluice-lua-depth" not in inner, (outer, inner)


@pytest.mark.parametrize("claimed", ["2", "2 0123456789abcdef0123456789abcdef", "1"])
def test_a_clients_depth_header_neither_skips_the_audit_nor_reaches_the_origin(
        sluice_factory, recorder, audit, tmp_path, claimed):
    """A client that claims to be a sub-request (`Sluice-Lua-Depth`, with no token or a guessed
    one) is a client: with `fail_open`, a depth it could claim would make `sluice.http` fail and
    the request go on unaudited. The audit is sent, and neither the origin nor the audit sees
    the header."""
    sink = audit()
    proxy = sluice_factory(config(tmp_path, {
        "file": str(EXAMPLES / "audit-summary.lua"),
        "allow_hosts": [f"localhost:{sink.port}"], "on_error": "fail_open",
        "config": {"url": f"http://localhost:{sink.port}/events", "header": "X-Client-Id", "required": True},
    }))
    r = get(proxy, recorder, "/orders", {"X-Client-Id": "c-7", "Sluice-Lua-Depth": claimed})
    assert r.status_code == 200, r.text
    (event,) = sink.requests()
    assert json.loads(event["body"]) == {"method": "GET", "path": "/orders", "X-Client-Id": "c-7"}
    assert "sluice-lua-depth" not in event["headers"], event
    assert "sluice-lua-depth" not in headers_of(recorder, "/orders")
    assert lua_line(tmp_path, 200)["vars"] == {"audit": 200}


@pytest.mark.parametrize("entry,message", [
    ({"allow_hosts": ["http://audit.test"]}, "allow_hosts: 'http://audit.test' is not a host or host:port"),
    ({"allow_hosts": ["audit.test:0"]}, "allow_hosts: 'audit.test:0' is not a host or host:port"),
    ({"allow_hosts": ["audit.test"], "every_try": True}, "allow_hosts (sluice.http) is for a hook that runs once"),
])
def test_check_reports_bad_allow_hosts_at_their_place(sluice_bin, tmp_path, entry, message):
    cfg = {"policies": {HOST: {"adapters": [{"lua": {"source": "return {on_request = function(req) end}", **entry}}]}}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    out = subprocess.run([sluice_bin, "check", "--config", str(path)], capture_output=True, text=True, timeout=30)
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert f"{path}:" in text and message in text, text


def test_an_https_sub_request_goes_through_a_tunnel_and_carries_no_depth(sluice_factory, recorder, nginx, tmp_path):
    """An `https://` sub-request is a CONNECT through the listener, which this Sluice answers
    and libcurl reads only after a real poll (it waited for `limits.wall` before); the policy
    of the target does not intercept, so what libcurl sends inside the tunnel reaches the
    origin as it is — without the depth header and its token. The target is named by the
    other name its certificate has, so that the CONNECT is not this script's policy's."""
    url = f"https://localhost:{nginx.https_port}/echo/lua-depth"
    source = (f'return {{ on_request = function(req) local r = sluice.http{{url = "{url}"}}; '
              f'req.headers:set("X-Echo", r.status .. " " .. r.body) end }}')
    proxy = sluice_factory(config(tmp_path, {"source": source, "allow_hosts": [f"localhost:{nginx.https_port}"]}))
    r = get(proxy, recorder, "/tunnel")
    assert r.status_code == 200, lua_line(tmp_path, r.status_code)
    assert headers_of(recorder, "/tunnel")["x-echo"] == "200 []"
