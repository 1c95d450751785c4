"""`lua` adapters (docs/scripting.md) end to end: each recipe of examples/lua/ against a
recording origin that checks what arrived; fail_closed's 502 (request id, never the script's
message) and fail_open; limits (a runaway loop, a memory bomb) answered within a second while
the worker keeps serving; header injection refused; a reload that swaps a script file, and a
bad script on reload that keeps the old one; the access log's `lua` field and
`sluice_lua_calls_total`."""

import hashlib
import hmac
import subprocess
import time
from pathlib import Path

import pytest
import requests

from conftest import SLUICE_BIN
from policy_support import AccessLog, monitors, sighup, stderr_len, stderr_since
from support import HOST, session_via, wait_until
from test_metric_values import metrics_proxy, settled

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "lua"


def lua_policy(entry: dict, tmp_path: Path, **more) -> dict:
    """A config whose policy for HOST runs the script, with an access log in tmp_path."""
    cfg = {"policies": {HOST: {"adapters": [{"lua": entry}]}}, "monitors": monitors(access=tmp_path / "access.log")}
    cfg.update(more)
    return cfg


def get(proxy, recorder, path: str = "/", headers: dict | None = None, method: str = "GET",
        data: bytes | None = None) -> requests.Response:
    with session_via(proxy.url) as s:
        return s.request(method, f"http://{HOST}:{recorder.port}{path}", headers=headers, data=data, timeout=10)


def arrived(recorder) -> dict:
    reqs = recorder.requests()
    assert reqs, "nothing reached the origin"
    last = reqs[-1]
    return {"target": last["target"], "method": last["method"], "body": bytes(last["body"]),
            "headers": {k.lower(): v for k, v in last["headers"]}}


def access_log(tmp_path: Path) -> AccessLog:
    return AccessLog(tmp_path / "access.log")


# ------------------------------------------------------------------------------------------
# The recipes
# ------------------------------------------------------------------------------------------

def test_choose_token_by_header(sluice_factory, recorder, tmp_path):
    # The tokens as the recipe's comment writes them: `${NAME}` references, read from the
    # environment, never printed.
    proxy = sluice_factory(lua_policy({
        "file": str(EXAMPLES / "choose-token-by-header.lua"),
        "config": {"header": "X-Tenant", "tokens": {"acme": "${ACME_TOKEN}", "globex": "${GLOBEX_TOKEN}"}}}, tmp_path),
        env={"ACME_TOKEN": "tok-acme-7f3a", "GLOBEX_TOKEN": "tok-globex-9c1e"})
    r = get(proxy, recorder, "/t", {"X-Tenant": "globex"})
    assert r.status_code == 200, r.text
    h = arrived(recorder)["headers"]
    assert h["authorization"] == "Bearer tok-globex-9c1e"
    assert "x-tenant" not in h
    check = subprocess.run([SLUICE_BIN, "check", "--config", str(proxy.config_path), "--host", HOST],
                           capture_output=True, text=True, timeout=30,
                           env={"PATH": "/usr/bin:/bin", "ACME_TOKEN": "tok-acme-7f3a", "GLOBEX_TOKEN": "tok-globex-9c1e"})
    assert check.returncode == 0 and "config keys header, tokens" in check.stdout, check.stdout + check.stderr
    assert "tok-" not in check.stdout + check.stderr
    # An unknown tenant: fail_closed, nothing sent.
    n = len(recorder.requests())
    r = get(proxy, recorder, "/t", {"X-Tenant": "initech"})
    assert r.status_code == 502 and "initech" not in r.text, r.text
    assert len(recorder.requests()) == n
    line = access_log(tmp_path).wait_for(lambda e: e.get("status") == 502)[0]
    assert "no token for tenant initech" in line["lua"]["error"], line
    assert "tok-" not in (tmp_path / "access.log").read_text() + stderr_since(proxy, 0)


def test_a_script_that_logs_a_secret_has_it_redacted(sluice_factory, recorder, tmp_path):
    # `sluice.log` lines pass through the running configuration's redactor: a `${NAME}` of
    # `config` and the bearer token an adapter set before the script are not printed, in the
    # diagnostics log nor (through ctx.vars) in the access log.
    source = """return { on_request = function(req, ctx)
      sluice.log.info("key=" .. ctx.config.key .. " auth=" .. req.headers:get("Authorization"))
      ctx.vars.key = ctx.config.key
    end }"""
    proxy = sluice_factory({
        "policies": {HOST: {"adapters": [{"bearer": "bearer-secret-5d2e"},
                                         {"lua": {"source": source, "config": {"key": "${LUA_SECRET_KEY}"}}}]}},
        "monitors": monitors(access=tmp_path / "access.log")}, env={"LUA_SECRET_KEY": "cfg-secret-8b4f"})
    offset = stderr_len(proxy)
    assert get(proxy, recorder, "/s").status_code == 200
    assert arrived(recorder)["headers"]["authorization"] == "Bearer bearer-secret-5d2e"
    assert wait_until(lambda: "key=" in stderr_since(proxy, offset), 5), stderr_since(proxy, offset)
    line = [x for x in stderr_since(proxy, offset).splitlines() if "key=" in x][0]
    assert "key=<redacted> auth=Bearer <redacted>" in line, line
    entry = access_log(tmp_path).wait_for(lambda e: e.get("url", "").endswith("/s"))[0]
    assert entry["lua"]["vars"] == {"key": "<redacted>"}, entry
    assert "secret-" not in (tmp_path / "access.log").read_text() + stderr_since(proxy, 0)


def test_rewrite_path_by_config(sluice_factory, recorder, tmp_path):
    proxy = sluice_factory(lua_policy({
        "file": str(EXAMPLES / "rewrite-path-by-config.lua"),
        "config": {"rules": [{"from": "/api/v1/", "to": "/v2/"}, {"from": "/legacy/", "to": "/archive/"}]}},
        tmp_path))
    assert get(proxy, recorder, "/api/v1/users?id=3").status_code == 200
    assert arrived(recorder)["target"].endswith("/v2/users?id=3")
    assert get(proxy, recorder, "/other/x").status_code == 200
    assert arrived(recorder)["target"].endswith("/other/x")
    line = access_log(tmp_path).wait_for(lambda e: e.get("url", "").endswith("/api/v1/users?id=3"))[0]
    assert line["lua"]["vars"] == {"rule": "/api/v1/"}, line


def test_sign_body_hmac(sluice_factory, recorder, tmp_path):
    key = "s3cret-key"
    proxy = sluice_factory(lua_policy({
        "file": str(EXAMPLES / "sign-body-hmac.lua"), "read_body": True, "config": {"key": key}}, tmp_path))
    body = b'{"amount": 42}'
    r = get(proxy, recorder, "/pay", {"Content-Type": "application/json"}, method="POST", data=body)
    assert r.status_code == 200, r.text
    got = arrived(recorder)
    assert got["body"] == body
    at = got["headers"]["x-signed-at"]
    assert abs(int(at) - time.time()) < 60
    expected = hmac.new(key.encode(), at.encode() + b"\n" + body, hashlib.sha256).hexdigest()
    assert got["headers"]["x-body-signature"] == expected


def test_a_signer_listed_before_an_every_try_script_signs_what_the_script_sent(sluice_factory, recorder, tmp_path):
    # Signers run after every other adapter whatever the list's order: the signature covers
    # the body and the field the script set, not the client's.
    source = """return { on_request = function(req, ctx)
      req:set_body("NEW-" .. req:body()) req.headers:set("X-Late", "1") end }"""
    proxy = sluice_factory(lua_policy({"source": source, "read_body": True}, tmp_path, policies={HOST: {"adapters": [
        {"aws_sigv4": {"service": "s3", "region": "us-east-1",
                       "credentials": {"access_key_id": "AKIDEXAMPLE", "secret_access_key": "secret-key-1"}}},
        {"lua": {"source": source, "read_body": True}}]}}))
    r = get(proxy, recorder, "/signed", {"Content-Type": "text/plain"}, method="POST", data=b"orig")
    assert r.status_code == 200, r.text
    got = arrived(recorder)
    assert got["body"] == b"NEW-orig"
    assert got["headers"]["x-amz-content-sha256"] == hashlib.sha256(b"NEW-orig").hexdigest(), got["headers"]
    assert "x-late" in got["headers"]["authorization"].split("SignedHeaders=")[1].split(",")[0].split(";"), got


# ------------------------------------------------------------------------------------------
# Failures and limits
# ------------------------------------------------------------------------------------------

FAILING = 'return { on_request = function(req) req.headers:set("X-Edited", "1"); error("secret detail 42") end }'


def test_fail_closed_answers_502_with_the_request_id_and_not_the_message(sluice_factory, recorder, tmp_path):
    proxy = sluice_factory(lua_policy({"source": FAILING}, tmp_path))
    r = get(proxy, recorder, "/x")
    assert r.status_code == 502
    assert r.text.startswith("sluice: script source.lua failed on request "), r.text
    assert "secret detail" not in r.text
    assert not recorder.requests()
    line = access_log(tmp_path).wait_for(lambda e: e.get("status") == 502)[0]
    assert str(line["id"]) in r.text, (line, r.text)
    lua = line["lua"]
    assert lua["script"] == "source.lua" and lua["hook"] == "on_request" and lua["outcome"] == "error"
    assert lua["error"] == "source.lua:1: secret detail 42", lua


def test_fail_open_goes_on_without_the_edits(sluice_factory, recorder, tmp_path):
    proxy = sluice_factory(lua_policy({"source": FAILING, "on_error": "fail_open"}, tmp_path))
    assert get(proxy, recorder, "/x").status_code == 200
    assert "x-edited" not in arrived(recorder)["headers"]


@pytest.mark.parametrize("source,kind", [
    ("return { on_request = function() while true do end end }", "limit"),
    ("return { on_request = function() local t = {} for i = 1, 1e9 do t[i] = string.rep('x', 1024) .. i end end }",
     "limit"),
])
def test_a_runaway_script_gets_502_within_a_second_and_the_worker_serves_on(sluice_factory, recorder, tmp_path,
                                                                            source, kind):
    # The default limits (docs/scripting.md).
    proxy = sluice_factory(lua_policy({"source": source}, tmp_path, workers=1))
    t0 = time.monotonic()
    r = get(proxy, recorder, "/loop")
    assert r.status_code == 502, r.text
    assert time.monotonic() - t0 < 1.0
    line = access_log(tmp_path).wait_for(lambda e: e.get("status") == 502)[0]
    lua = line["lua"]
    assert lua["outcome"] == kind, line
    # What the call took, as docs/scripting.md defines the fields: its wall-clock time, the VM
    # instructions it ran (the loop: the whole default budget) and the state's peak heap (the
    # bomb: up to the default cap of 8 MiB).
    assert 0 < lua["us"] < 1_000_000, lua
    if "while true" in source:
        assert lua["instructions"] == 1_000_000 and 0 < lua["memory"] < 1024 * 1024, lua
    else:
        assert 0 < lua["instructions"] < 1_000_000 and 4 * 1024 * 1024 < lua["memory"] <= 8 * 1024 * 1024 + 65536, lua
    # The same worker (there is one) serves the next request: a plain one, on another host.
    with session_via(proxy.url) as s:
        assert s.get(f"http://localhost:{recorder.port}/next", timeout=5).status_code == 200


def test_a_route_runs_the_script_of_its_upstreams_policy(sluice_factory, recorder, tmp_path):
    """A gateway route (docs/configuration.md) forwards through the policy of its upstream's
    host: a `lua` entry there runs for the route's requests as for the forward proxy's, on the
    path the route made (base path and all), and its refusal is the route's answer."""
    from test_routes import route_proxy, route_request
    source = """return { on_request = function(req)
        if req.path == "/base/deny" then return req:respond(403, {}, "no") end
        req.headers:set("X-Route-Path", req.path)
    end }"""
    _, rport = route_proxy(sluice_factory, f"http://{HOST}:{recorder.port}/base", lua_policy({"source": source}, tmp_path))
    r = route_request(rport, "GET", "/items?id=7")
    assert r is not None and r.status == 200, r
    seen = arrived(recorder)
    assert seen["target"] == "/base/items?id=7" and seen["headers"]["x-route-path"] == "/base/items", seen
    r = route_request(rport, "GET", "/deny")
    assert r is not None and r.status == 403 and r.body == b"no", r
    assert len(recorder.requests()) == 1


def test_header_injection_is_never_sent(sluice_factory, recorder, tmp_path):
    source = 'return { on_request = function(req) req.headers:set("X-A", "v\\r\\nX-Injected: 1") end }'
    proxy = sluice_factory(lua_policy({"source": source}, tmp_path))
    r = get(proxy, recorder, "/inj")
    assert r.status_code == 502
    assert not recorder.requests()
    line = access_log(tmp_path).wait_for(lambda e: e.get("status") == 502)[0]
    assert "X-A" in line["lua"]["error"], line


# ------------------------------------------------------------------------------------------
# Reload, check, metrics
# ------------------------------------------------------------------------------------------

def test_reload_swaps_a_script_and_keeps_the_old_one_when_the_new_does_not_load(sluice_factory, recorder,
                                                                                 tmp_path):
    script = tmp_path / "tag.lua"
    script.write_text('return { on_request = function(req) req.headers:set("X-Version", "1") end }')
    # A relative file: read beside the configuration (the factory writes it into tmp_path).
    proxy = sluice_factory(lua_policy({"file": "tag.lua"}, tmp_path))
    assert get(proxy, recorder).status_code == 200
    assert arrived(recorder)["headers"]["x-version"] == "1"

    script.write_text('return { on_request = function(req) req.headers:set("X-Version", "2") end }')
    sighup(proxy)

    def version_is(v):
        get(proxy, recorder)
        return arrived(recorder)["headers"].get("x-version") == v
    assert wait_until(lambda: version_is("2"), 10)

    offset = stderr_len(proxy)
    script.write_text('return { on_request = function(req) req.headers:set("X-Version", "3" end }')
    sighup(proxy)
    assert wait_until(lambda: "tag.lua:1:" in stderr_since(proxy, offset), 10), stderr_since(proxy, offset)
    assert version_is("2")


def test_check_reports_a_script_that_does_not_load(sluice_bin, tmp_path):
    (tmp_path / "bad.lua").write_text("return {\n  on_request = function(req)\n    x = = 1\n  end,\n}\n")
    config = tmp_path / "s.yaml"
    config.write_text(f"policies:\n  {HOST}:\n    adapters:\n      - lua: {{ file: bad.lua }}\n")
    out = subprocess.run([sluice_bin, "check", "--config", str(config)], capture_output=True, text=True, timeout=30)
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert f"{config}:4:" in text and "bad.lua:3:" in text, text


def test_calls_are_counted(sluice_factory, recorder, tmp_path):
    proxy, admin = metrics_proxy(sluice_factory, 1, policies={HOST: {"adapters": [
        {"lua": {"source": 'return { on_request = function(req) if req.path == "/bad" then error("x") end end }',
                 "on_error": "fail_open"}}]}})
    for path in ("/a", "/b", "/bad"):
        assert get(proxy, recorder, path).status_code == 200
    settled(admin, "sluice_lua_calls_total", 2, script="source.lua", hook="on_request", outcome="ok")
    settled(admin, "sluice_lua_calls_total", 1, script="source.lua", hook="on_request", outcome="error")


def test_the_benchmark_shape_works(sluice_factory, recorder, tmp_path):
    """The `lua` benchmark scenario's YAML and script (Benchmarks/)."""
    script = tmp_path / "seen.lua"
    script.write_text('return { on_request = function(req, ctx) req.headers:set("X-Seen", '
                      'req.headers:get("X-Client") or "none") end }')
    proxy = sluice_factory({"policies": {HOST: {"adapters": [{"lua": {"file": str(script),
                                                                       "on_error": "fail_closed"}}]}}})
    assert get(proxy, recorder, headers={"X-Client": "c7"}).status_code == 200
    assert arrived(recorder)["headers"]["x-seen"] == "c7"
    assert get(proxy, recorder).status_code == 200
    assert arrived(recorder)["headers"]["x-seen"] == "none"
