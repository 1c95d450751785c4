"""Tools around `lua` scripts (docs/scripting.md): the load-time refusal of a hook that writes
a global (`sluice check`, start, reload); `sluice lua test` against messages in files; the
script's own counters (`sluice.metric`) and the call-duration histogram; the host page's last
script errors; and reloads that change a script's content, after which each worker keeps one
state per script (`sluice_lua_states`)."""

import json
import subprocess

from policy_support import sighup, stderr_len, stderr_since
from support import HOST, session_via, wait_until
from test_admin import admin_proxy
from test_lua import access_log, arrived, get, lua_policy
from test_metric_values import metrics_proxy, scrape, settled, value

WRITES_GLOBAL = "return {\n  on_request = function(req)\n    counter = 1\n  end,\n}\n"


def check(sluice_bin, config) -> subprocess.CompletedProcess:
    return subprocess.run([sluice_bin, "check", "--config", str(config)], capture_output=True, text=True, timeout=30)


# ------------------------------------------------------------------------------------------
# Globals written by hooks are refused at load
# ------------------------------------------------------------------------------------------

def test_check_and_start_refuse_a_hook_that_writes_a_global(sluice_bin, tmp_path):
    (tmp_path / "w.lua").write_text(WRITES_GLOBAL)
    config = tmp_path / "s.yaml"
    config.write_text(f"policies:\n  {HOST}:\n    adapters:\n      - lua: {{ file: w.lua }}\n")
    out = check(sluice_bin, config)
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert f"{config}:4:" in text and "w.lua:3: hook writes global 'counter'" in text, text
    run = subprocess.run([sluice_bin, "run", "--config", str(config)], capture_output=True, text=True, timeout=30)
    assert run.returncode != 0 and "w.lua:3: hook writes global 'counter'" in run.stderr, run.stderr
    # The top level may set globals; a local named like one is no global.
    (tmp_path / "w.lua").write_text("limit = 3\nlocal counter = 0\n"
                                    "return { on_request = function(req) counter = counter + limit end }\n")
    assert check(sluice_bin, config).returncode == 0


def test_reload_keeps_the_old_script_when_a_hook_writes_a_global(sluice_factory, recorder, tmp_path):
    script = tmp_path / "tag.lua"
    script.write_text('return { on_request = function(req) req.headers:set("X-Version", "1") end }')
    proxy = sluice_factory(lua_policy({"file": "tag.lua"}, tmp_path))
    assert get(proxy, recorder).status_code == 200
    offset = stderr_len(proxy)
    script.write_text('return { on_request = function(req) req.headers:set("X-Version", "2") seen = true end }')
    sighup(proxy)
    assert wait_until(lambda: "tag.lua:1: hook writes global 'seen'" in stderr_since(proxy, offset), 10), \
        stderr_since(proxy, offset)
    assert get(proxy, recorder).status_code == 200
    assert arrived(recorder)["headers"]["x-version"] == "1"


# ------------------------------------------------------------------------------------------
# sluice lua test
# ------------------------------------------------------------------------------------------

SCRIPT = """
return {
  on_request = function(req, ctx)
    req.headers:set("Authorization", "Bearer " .. ctx.config.tokens[req.headers:get("X-Tenant")])
    req.headers:remove("X-Tenant")
    ctx.vars.tenant = "acme"
  end,
  on_response = function(res, ctx)
    res.headers:set("X-Seen-Status", tostring(res.status))
    res.headers:remove("Server")
  end,
  on_log = function(ctx)
    ctx.vars.done = true
    sluice.log.info("logged", ctx.vars.tenant)
  end,
}
"""


def lua_test(sluice_bin, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sluice_bin, "lua", "test", *map(str, args)], capture_output=True, text=True, timeout=30)


def test_lua_test_runs_every_hook_against_messages_in_files(sluice_bin, tmp_path):
    (tmp_path / "s.lua").write_text(SCRIPT)
    (tmp_path / "req.http").write_bytes(b"GET /v1/items?page=2 HTTP/1.1\r\nHost: api.test\r\nX-Tenant: acme\r\n\r\n")
    (tmp_path / "res.http").write_text("HTTP/1.1 200 OK\nServer: origin/1\nContent-Type: text/plain\n\nhello\n")
    (tmp_path / "config.json").write_text(json.dumps({"tokens": {"acme": "tok-acme"}}))
    out = lua_test(sluice_bin, tmp_path / "s.lua", "--request", tmp_path / "req.http", "--response",
                   tmp_path / "res.http", "--config", tmp_path / "config.json")
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    request = text.split("--- request\n")[1].split("\n--- ")[0]
    assert request.startswith("GET /v1/items?page=2 HTTP/1.1\n"), text
    assert "Authorization: Bearer tok-acme\n" in request and "X-Tenant" not in request, text
    assert request.split("\n")[1] == "Host: api.test", text  # kept aside, as the proxy keeps it
    response = text.split("--- response\n")[1].split("\n--- ")[0]
    assert response.startswith("HTTP/1.1 200\n") and "X-Seen-Status: 200\n" in response, text
    assert "Server:" not in response and response.endswith("\n\nhello"), text
    assert "on_request: ok" in text and "on_response: ok" in text and "on_log: ok" in text, text
    assert "log info s.lua:14: logged acme" in text.split("--- request")[0], text
    logs = [json.loads(line[len("lua: "):]) for line in text.split("--- log\n")[1].splitlines()]
    assert [entry["hook"] for entry in logs] == ["on_request", "on_response", "on_log"], logs
    assert logs[-1]["vars"] == {"tenant": "acme", "done": True} and logs[-1]["outcome"] == "ok", logs


def test_lua_test_fails_on_a_script_error_and_on_bad_files(sluice_bin, tmp_path):
    (tmp_path / "s.lua").write_text(SCRIPT)
    (tmp_path / "req.http").write_text("GET / HTTP/1.1\nX-Tenant: nobody\n\n")
    out = lua_test(sluice_bin, tmp_path / "s.lua", "--request", tmp_path / "req.http")
    assert out.returncode == 1, out.stdout + out.stderr
    # (no --config: ctx.config is empty)
    assert "on_request: error: s.lua:4: attempt to index a nil value (field 'tokens')" in out.stdout, out.stdout
    # As fail_closed in the proxy: a 502, nothing sent upstream, no on_response; on_log runs.
    assert "--- answered by Sluice: 502" in out.stdout and "--- request" not in out.stdout, out.stdout
    (tmp_path / "res.http").write_text("HTTP/1.1 200 OK\nServer: origin/1\n\nhello\n")
    out = lua_test(sluice_bin, tmp_path / "s.lua", "--request", tmp_path / "req.http", "--response",
                   tmp_path / "res.http")
    assert out.returncode == 1 and "on_response: " not in out.stdout.split("--- log")[0], out.stdout
    assert "--- response" not in out.stdout and "on_log: ok" in out.stdout, out.stdout
    (tmp_path / "bad.http").write_text("not a request\n")
    out = lua_test(sluice_bin, tmp_path / "s.lua", "--request", tmp_path / "bad.http")
    assert out.returncode == 1 and "bad.http:1: not a request line" in out.stderr, out.stderr
    (tmp_path / "w.lua").write_text(WRITES_GLOBAL)
    out = lua_test(sluice_bin, tmp_path / "w.lua", "--request", tmp_path / "req.http")
    assert out.returncode == 1 and "w.lua:3: hook writes global 'counter'" in out.stderr, out.stderr


def test_lua_test_decodes_a_chunked_response_and_reframes_it(sluice_bin, tmp_path):
    # As the proxy: res:body() is the decoded body, and the client gets it framed by
    # Content-Length (also after res:set_body).
    (tmp_path / "s.lua").write_text('return { on_response = function(res, ctx) ctx.vars.seen = res:body(); '
                                    'res:set_body(res:body():upper()) end }')
    (tmp_path / "req.http").write_text("GET / HTTP/1.1\nHost: a.test\n\n")
    (tmp_path / "res.http").write_bytes(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                        b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n")
    out = lua_test(sluice_bin, tmp_path / "s.lua", "--request", tmp_path / "req.http", "--response",
                   tmp_path / "res.http")
    assert out.returncode == 0, out.stdout + out.stderr
    response = out.stdout.split("--- response\n")[1].split("\n--- ")[0]
    assert response == "HTTP/1.1 200\nContent-Length: 11\n\nHELLO WORLD", out.stdout
    assert '"vars":{"seen":"hello world"}' in out.stdout, out.stdout
    (tmp_path / "bad.http").write_bytes(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n")
    out = lua_test(sluice_bin, tmp_path / "s.lua", "--request", tmp_path / "req.http", "--response",
                   tmp_path / "bad.http")
    assert out.returncode == 1 and "bad.http: bad chunk size line: zz" in out.stderr, out.stdout + out.stderr
    (tmp_path / "neg.http").write_bytes(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\nhello\r\n0\r\n\r\n")
    out = lua_test(sluice_bin, tmp_path / "s.lua", "--request", tmp_path / "req.http", "--response",
                   tmp_path / "neg.http")
    assert out.returncode == 1 and "neg.http: bad chunk size line: -1" in out.stderr, out.stdout + out.stderr


FETCHES_A_TOKEN = """
return {
  on_request = function(req, ctx)
    local res, err = sluice.http{ url = "http://auth.test/token?for=" .. req.path, headers = { ["X-Ask"] = "1" } }
    if not res then error(err) end
    req.headers:set("Authorization", "Bearer " .. res.body)
    req.headers:set("X-Token-Type", res.headers["content-type"])
    local again, message = sluice.http{ url = "http://auth.test/again", method = "POST", body = "b" }
    req.headers:set("X-Again", again and again.body or message)
  end,
}
"""


def test_lua_test_answers_sluice_http_from_files(sluice_bin, tmp_path):
    (tmp_path / "s.lua").write_text(FETCHES_A_TOKEN)
    (tmp_path / "req.http").write_text("GET /items HTTP/1.1\nHost: api.test\n\n")
    (tmp_path / "token.http").write_text("HTTP/1.1 200 OK\nContent-Type: text/plain\n\ntok-9")
    args = [tmp_path / "s.lua", "--request", tmp_path / "req.http", "--http", tmp_path / "token.http"]
    out = lua_test(sluice_bin, *args, "--allow-host", "auth.test")
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    # Each call is printed as it is made, with the file that answered it; the second call finds
    # no file left and gets nil, message, as a failed sub-request does.
    first = text.split("--- sluice.http #1\n")[1].split("--- ")[0]
    assert first.startswith("GET http://auth.test/token?for=/items\nX-Ask: 1\n"), text
    assert f"(answered by {tmp_path / 'token.http'}: 200)" in first, text
    second = text.split("--- sluice.http #2\n")[1].split("--- ")[0]
    assert second.startswith("POST http://auth.test/again\n") and "\nb\n" in second, text
    assert "(no --http file left" in second, text
    request = text.split("--- request\n")[1].split("\n--- ")[0]
    assert "Authorization: Bearer tok-9\n" in request and "X-Token-Type: text/plain\n" in request, text
    assert "X-Again: sluice.http: no --http file left for this sub-request" in request, text
    # allow_hosts applies as in the proxy: an unlisted host is the script's error.
    out = lua_test(sluice_bin, *args, "--allow-host", "other.test:8080")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "s.lua:4: sluice.http: auth.test is not in this entry's lua.allow_hosts" in out.stdout, out.stdout
    # --http answers nothing without --allow-host: said, not ignored.
    out = lua_test(sluice_bin, *args)
    assert out.returncode == 1 and "--http answers sluice.http, which needs --allow-host" in out.stderr, out.stderr
    out = lua_test(sluice_bin, *args, "--allow-host", "http://auth.test/")
    assert out.returncode == 1 and "--allow-host: 'http://auth.test/' is not a host" in out.stderr, out.stderr


# ------------------------------------------------------------------------------------------
# Metrics: sluice.metric, the call-duration histogram, the states after reloads
# ------------------------------------------------------------------------------------------

COUNTING = """
local hits = sluice.metric("hits")
return { on_request = function(req)
  hits:inc()
  sluice.metric("by_" .. req.method:lower()):inc(2)
  if req.path == "/bad" then sluice.metric("Bad-" .. req.path):inc() end
end }
"""


def test_script_counters_and_call_durations(sluice_factory, recorder):
    proxy, admin = metrics_proxy(sluice_factory, 2, policies={HOST: {"adapters": [
        {"lua": {"source": COUNTING, "on_error": "fail_closed"}}]}})
    for path in ("/a", "/b", "/c"):
        assert get(proxy, recorder, path).status_code == 200
    def counted(name: str, n: int) -> bool:
        # (a label called `name` cannot go through settled()'s keywords)
        return scrape(admin).get(("sluice_lua_metric_total", frozenset({("script", "source.lua"), ("name", name)}))) == n
    assert wait_until(lambda: counted("hits", 3) and counted("by_get", 6), 5), scrape(admin)
    settled(admin, "sluice_lua_call_duration_seconds_count", 3, script="source.lua", hook="on_request")
    # A name made at run time that is not a metric name: the call fails (502), nothing counted.
    assert get(proxy, recorder, "/bad").status_code == 502
    samples = settled(admin, "sluice_lua_calls_total", 1, script="source.lua", hook="on_request", outcome="error")
    assert not [k for k in samples if k[0] == "sluice_lua_metric_total" and ("name", "Bad-/bad") in k[1]]


def test_a_literal_metric_name_is_checked_at_load(sluice_bin, tmp_path):
    (tmp_path / "m.lua").write_text('return { on_log = function()\n  sluice.metric("Requests-Total"):inc()\nend }\n')
    config = tmp_path / "s.yaml"
    config.write_text(f"policies:\n  {HOST}:\n    adapters:\n      - lua: {{ file: m.lua }}\n")
    out = check(sluice_bin, config)
    assert out.returncode != 0
    assert "m.lua:2: metric name 'Requests-Total' is not [a-z_][a-z0-9_]*" in out.stdout + out.stderr, out


def test_states_stay_one_per_script_per_worker_across_reloads(sluice_factory, recorder, tmp_path):
    script = tmp_path / "tag.lua"

    def write(version: int):
        script.write_text(f'return {{ on_request = function(req) req.headers:set("X-Version", "{version}") end }}')
    write(0)
    proxy, admin = metrics_proxy(sluice_factory, 2, policies={HOST: {"adapters": [{"lua": {"file": str(script)}}]}})
    for version in range(1, 7):
        write(version)
        sighup(proxy)

        def served():
            get(proxy, recorder)
            return arrived(recorder)["headers"].get("x-version") == str(version)
        assert wait_until(served, 10)
        for _ in range(4):  # both workers run the new content (each request goes to either)
            assert get(proxy, recorder).status_code == 200
    m = scrape(admin)
    states, memory = value(m, "sluice_lua_states"), value(m, "sluice_lua_memory_bytes")
    # One state per worker for the content now loaded; without the reload's clean-up, one per
    # content each worker ever ran (up to 14). The memory of the dropped states left the
    # gauge with them (a state of this script holds about 44 KiB).
    assert 1 <= states <= 2, states
    assert 0 < memory < states * 128 * 1024, (memory, states)


def test_a_hundred_policies_running_one_script_share_one_state(sluice_factory, recorder, tmp_path):
    """Issue #35 item 8: a state per script content per worker, whatever the number of
    policies that run it. A hundred policies (hosts `p0.localhost` .. `p99.localhost`, which
    the resolver answers with loopback) each run the same file, each with its own `config`;
    every one of them is exercised, one worker holds one state, and what the states hold
    (`sluice_lua_memory_bytes`) stays near one policy's: its `config` tables, not a state
    each. A hundred different scripts (the same text, each with its own comment) take a
    hundred states and a hundred times the memory."""
    body = 'return { on_request = function(req, ctx) req.headers:set("X-Policy", ctx.config.name) end }'

    def run(scripts: list[str], count: int = 100, same_config: bool = False) -> tuple[float, float]:
        paths = []
        for i, text in enumerate(scripts):
            path = tmp_path / f"tag{i}.lua"
            path.write_text(text)
            paths.append(path)
        policies = {f"p{i}.localhost": {"adapters": [{"lua": {"file": str(paths[i % len(paths)]),
                                                             "config": {"name": "p0" if same_config else f"p{i}"}}}]}
                    for i in range(count)}
        proxy, admin = metrics_proxy(sluice_factory, 1, policies=policies)
        with session_via(proxy.url) as s:
            for i in range(count):
                r = s.get(f"http://p{i}.localhost:{recorder.port}/", timeout=10)
                assert r.status_code == 200, (i, r.status_code, r.text)
                assert arrived(recorder)["headers"].get("x-policy") == ("p0" if same_config else f"p{i}")
        m = scrape(admin)
        return value(m, "sluice_lua_states"), value(m, "sluice_lua_memory_bytes")

    # One policy running the script: one state, tens of KiB.
    single_states, single = run([body], count=1)
    assert single_states == 1 and 16 * 1024 < single < 256 * 1024, single
    shared_states, shared = run([body])
    same_states, same = run([body], same_config=True)
    distinct_states, distinct = run([f"-- script {i}\n{body}" for i in range(100)])
    print(f"one policy: {single:.0f} bytes; a hundred policies on one script: {shared:.0f} "
          f"(with one config: {same:.0f}); on a hundred scripts: {distinct:.0f}")
    assert shared_states == 1 and same_states == 1 and distinct_states == 100
    # A hundred policies with one script and one `config`: one state, one `config` table, the
    # memory of one policy (the gauge moves in steps of 16 KiB).
    assert same == single, (same, single)
    # A hundred scripts: a hundred states. A hundred policies on one script: one state, with
    # their `config` tables and what the calls left for the collector (the count is the
    # allocator's, garbage included: Lua's collector lets the heap reach about twice what is
    # live before it finishes a cycle) -- a fraction of a hundred states.
    assert distinct > 80 * single, (distinct, single)
    assert single < shared < 4 * single, (shared, single)


# ------------------------------------------------------------------------------------------
# The dashboard's host page: the last script errors
# ------------------------------------------------------------------------------------------

def test_a_scripts_error_shows_no_secret_anywhere(sluice_factory, recorder, tmp_path):
    # A script's error naming a `${NAME}` of its config: redacted in the access log, the
    # dashboard's host page and a sluice.log line -- also when the 8 KiB cut falls inside it.
    source = """return { on_request = function(req, ctx)
      local pad = string.rep("a", tonumber(req.headers:get("X-Pad")))
      sluice.log.warn(pad .. ctx.config.secret .. " logged")
      error(pad .. ctx.config.secret .. " failed", 0)
    end }"""
    proxy, admin = admin_proxy(sluice_factory, {
        "monitors": [{"metrics": {}}, {"access_log": {"path": str(tmp_path / "access.log")}}],
        "policies": {HOST: {"adapters": [{"lua": {"source": source, "config": {"secret": "${LUA_ERR_SECRET}"}}}]}}},
        token_env={"ADMIN_TOKEN": "admin-token-1234", "LUA_ERR_SECRET": "hunter2supersecret"}, workers=1)
    for pad in (3, 8 * 1024 - 5):
        assert get(proxy, recorder, "/s", {"X-Pad": str(pad)}).status_code == 502
    entries = access_log(tmp_path).wait_for(lambda e: e.get("status") == 502, n=2)
    assert entries[0]["lua"]["error"] == "aaa<redacted> failed", entries[0]
    assert all("hunter" not in e["lua"]["error"] for e in entries), [e["lua"]["error"][-40:] for e in entries]
    def errors():
        return admin.call("GET", "/dashboard/host?host=" + HOST, spec_path="/dashboard/host")[1]["script_errors"]
    assert wait_until(lambda: len(errors()) == 2, 10), errors()
    errors = errors()
    assert errors[0]["error"].startswith("aaa<redacted> failed"), errors
    assert "hunter" not in json.dumps(errors)
    assert wait_until(lambda: stderr_since(proxy, 0).count(" logged") >= 1, 5)
    text = stderr_since(proxy, 0)
    assert "aaa<redacted> logged" in text and "hunter" not in text, text[-300:]


def test_the_host_page_lists_the_last_script_errors(sluice_factory, recorder, tmp_path):
    source = 'return { on_request = function(req) if req.path ~= "/ok" then error("no " .. req.path) end end }'
    proxy, admin = admin_proxy(sluice_factory, {
        "monitors": [{"metrics": {}}, {"access_log": {"path": str(tmp_path / "access.log")}}],
        "policies": {HOST: {"adapters": [{"lua": {"source": source}}]}}}, workers=1)
    assert get(proxy, recorder, "/ok").status_code == 200
    for i in range(12):
        assert get(proxy, recorder, f"/e{i}").status_code == 502

    def errors():
        return admin.call("GET", "/dashboard/host?host=" + HOST, spec_path="/dashboard/host")[1]["script_errors"]
    assert wait_until(lambda: len(errors()) == 10 and errors()[-1]["error"].endswith("no /e11"), 10), errors()
    listed = errors()
    # The last ten, oldest first, each with the id the 502 named and the access log has.
    assert [e["error"] for e in listed] == [f"source.lua:1: no /e{i}" for i in range(2, 12)], listed
    assert all(e["script"] == "source.lua" and e["hook"] == "on_request" and e["outcome"] == "error" for e in listed)
    logged = {entry["lua"]["error"]: entry["id"]
              for entry in access_log(tmp_path).wait_for(lambda e: e.get("status") == 502, n=12)}
    assert all(logged[e["error"]] == e["id"] for e in listed), (logged, listed)
