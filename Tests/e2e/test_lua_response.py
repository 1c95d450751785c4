"""`lua` on the response's way back (docs/scripting.md, "on_response" and "on_log") end to
end, against a recording origin: a header edit reaches the client; `res:retry()` is a retry the
policy's `retry` counts (and, retries exhausted or none configured, the answer goes to the
client as it is); `on_log`'s `ctx.vars` in the access log beside `on_request`'s; an error or a
limit in `on_response` answers 502 with the request id and the worker serves on; a header
injection is refused; every hook call counted."""

import time

from faultservers import simple_response
from support import HOST, session_via
from test_lua import access_log, get, lua_policy
from test_metric_values import metrics_proxy, settled


def busy_then_ok(busy: int):
    """An origin answer that is `busy` times `X-Busy: 1`, then plain."""
    count = {"n": 0}

    def answer(req):
        count["n"] += 1
        extra = [("X-Busy", "1")] if count["n"] <= busy else []
        return simple_response(200, f"answer {count['n']}".encode(), extra, "OK")
    return answer


RETRY_BUSY = 'return { on_response = function(res, ctx) if res.headers:get("X-Busy") then res:retry() end end }'


def test_a_header_edit_reaches_the_client(sluice_factory, recorder, tmp_path):
    recorder.response = simple_response(200, b"hello", [("Server", "origin/1.0"), ("X-Upstream", "a"),
                                                       ("X-Upstream", "b")])
    source = """return { on_response = function(res, ctx)
      res.headers:set("X-Status-Seen", tostring(res.status))
      res.headers:remove("Server")
      res.headers:add("X-Upstream", "c")
      ctx.vars.upstreams = #res.headers:get_all("X-Upstream")
    end }"""
    proxy = sluice_factory(lua_policy({"source": source}, tmp_path))
    r = get(proxy, recorder, "/h")
    assert r.status_code == 200 and r.text == "hello", r.text
    assert r.headers["X-Status-Seen"] == "200"
    assert "Server" not in r.headers
    assert r.headers["X-Upstream"] == "a, b, c"
    assert r.headers["Content-Length"] == "5"
    line = access_log(tmp_path).wait_for(lambda e: e.get("url", "").endswith("/h"))[0]
    assert line["lua"]["hook"] == "on_response" and line["lua"]["vars"] == {"upstreams": 3}, line


def test_an_edit_keeps_the_bytes_of_a_value_that_is_not_utf8(sluice_factory, recorder, tmp_path):
    # An obs-text value (a Latin-1 filename) reaches the script as its bytes, and the client as
    # the origin sent it when the script edits another field, not with U+FFFD in its place.
    recorder.response = simple_response(200, b"hello", [("Content-Disposition", 'attachment; filename="caf\xe9.txt"')])
    source = """return { on_response = function(res, ctx)
      local v = res.headers:get("Content-Disposition")
      ctx.vars.length = #v
      ctx.vars.byte = string.byte(v, #v - 5)
      res.headers:set("X-Edited", "1")
    end }"""
    proxy = sluice_factory(lua_policy({"source": source}, tmp_path))
    r = get(proxy, recorder, "/latin1")
    assert r.status_code == 200 and r.text == "hello", r.text
    assert r.headers["X-Edited"] == "1"
    # http.client reads header bytes as Latin-1: one byte 0xE9 is "é"; U+FFFD would be three.
    assert r.headers["Content-Disposition"] == 'attachment; filename="caf\xe9.txt"', r.headers
    line = access_log(tmp_path).wait_for(lambda e: e.get("url", "").endswith("/latin1"))[0]
    assert line["lua"]["vars"] == {"length": 31, "byte": 0xE9}, line


def test_res_retry_is_counted_by_the_retry_policy(sluice_factory, recorder, tmp_path):
    recorder.response = busy_then_ok(1)
    proxy = sluice_factory(lua_policy({"source": RETRY_BUSY}, tmp_path, policies={
        HOST: {"adapters": [{"lua": {"source": RETRY_BUSY}}], "retry": {"limit": 2, "backoff": {"scale": "1ms"}}}}))
    r = get(proxy, recorder, "/r")
    assert r.status_code == 200 and r.text == "answer 2", r.text
    assert "X-Busy" not in r.headers
    assert len(recorder.requests()) == 2
    line = access_log(tmp_path).wait_for(lambda e: e.get("url", "").endswith("/r"))[0]
    assert [x["reason"] for x in line["retries"]] == ["lua"], line
    assert line["attempts"] == 2, line


def test_retries_exhausted_send_the_answer_as_it_is(sluice_factory, recorder, tmp_path):
    recorder.response = busy_then_ok(10)
    proxy = sluice_factory(lua_policy({"source": RETRY_BUSY}, tmp_path, policies={
        HOST: {"adapters": [{"lua": {"source": RETRY_BUSY}}], "retry": {"limit": 1, "backoff": {"scale": "1ms"}}}}))
    r = get(proxy, recorder, "/x")
    assert r.status_code == 200 and r.text == "answer 2", r.text
    assert r.headers["X-Busy"] == "1"
    assert len(recorder.requests()) == 2
    line = access_log(tmp_path).wait_for(lambda e: e.get("url", "").endswith("/x"))[0]
    assert line["retry_stopped"] == "limit", line
    # No retry policy: the first answer goes to the client.
    proxy = sluice_factory(lua_policy({"source": RETRY_BUSY}, tmp_path), name="noretry")
    n = len(recorder.requests())
    r = get(proxy, recorder, "/y")
    assert r.status_code == 200 and r.headers["X-Busy"] == "1"
    assert len(recorder.requests()) == n + 1


def test_retries_are_in_the_metrics(sluice_factory, recorder):
    recorder.response = busy_then_ok(1)
    proxy, admin = metrics_proxy(sluice_factory, 1, policies={
        HOST: {"adapters": [{"lua": {"source": RETRY_BUSY}}], "retry": {"limit": 2, "backoff": {"scale": "1ms"}}}})
    assert get(proxy, recorder, "/m").status_code == 200
    settled(admin, "sluice_retries_total", 1, reason="lua")
    settled(admin, "sluice_lua_calls_total", 2, script="source.lua", hook="on_response", outcome="ok")


def test_on_log_vars_are_in_the_access_log(sluice_factory, recorder, tmp_path):
    source = """return {
      on_request = function(req, ctx) ctx.vars.path = req.path end,
      on_response = function(res, ctx) ctx.vars.status = res.status end,
      on_log = function(ctx) ctx.vars.summary = ctx.vars.path .. " " .. ctx.vars.status end,
    }"""
    proxy, admin = metrics_proxy(sluice_factory, 1, policies={HOST: {"adapters": [{"lua": {"source": source}}]}},
                                 monitors=[{"metrics": {}}, {"access_log": {"path": str(tmp_path / "access.log")}}])
    assert get(proxy, recorder, "/logged").status_code == 200
    line = access_log(tmp_path).wait_for(lambda e: e.get("url", "").endswith("/logged"))[0]
    lua = line["lua"]
    assert lua["hook"] == "on_log" and lua["outcome"] == "ok", lua
    assert lua["vars"] == {"path": "/logged", "status": 200, "summary": "/logged 200"}, lua
    for hook in ("on_request", "on_response", "on_log"):
        settled(admin, "sluice_lua_calls_total", 1, script="source.lua", hook=hook, outcome="ok")


def test_an_error_in_on_response_answers_502_with_the_request_id(sluice_factory, recorder, tmp_path):
    source = 'return { on_response = function(res) res.headers:set("X-A", "1"); error("secret detail 7") end }'
    proxy = sluice_factory(lua_policy({"source": source}, tmp_path))
    r = get(proxy, recorder, "/e")
    assert r.status_code == 502, r.text
    assert r.text.startswith("sluice: script source.lua failed on request "), r.text
    assert "secret detail" not in r.text and "X-A" not in r.headers
    assert len(recorder.requests()) == 1, "the origin was asked once: an error is not retried"
    line = access_log(tmp_path).wait_for(lambda e: e.get("status") == 502)[0]
    assert str(line["id"]) in r.text, (line, r.text)
    assert line["lua"]["hook"] == "on_response" and line["lua"]["error"] == "source.lua:1: secret detail 7", line
    # fail_open: the answer goes on as the origin sent it.
    proxy = sluice_factory(lua_policy({"source": source, "on_error": "fail_open"}, tmp_path), name="open")
    r = get(proxy, recorder, "/o")
    assert r.status_code == 200 and "X-A" not in r.headers


def test_a_runaway_on_response_gets_502_within_a_second_and_the_worker_serves_on(sluice_factory, recorder,
                                                                                 tmp_path):
    source = "return { on_response = function() while true do end end }"
    proxy = sluice_factory(lua_policy({"source": source}, tmp_path, workers=1))
    t0 = time.monotonic()
    r = get(proxy, recorder, "/loop")
    assert r.status_code == 502, r.text
    assert time.monotonic() - t0 < 1.0
    line = access_log(tmp_path).wait_for(lambda e: e.get("status") == 502)[0]
    assert line["lua"]["outcome"] == "limit" and line["lua"]["hook"] == "on_response", line
    with session_via(proxy.url) as s:
        assert s.get(f"http://localhost:{recorder.port}/next", timeout=5).status_code == 200


def test_response_header_injection_and_framing_edits_are_refused(sluice_factory, recorder, tmp_path):
    source = """return { on_response = function(res, ctx)
      if ctx.config.edit == "inject" then res.headers:set("X-A", "v\\r\\nX-Injected: 1")
      else res.headers:set("Content-Length", "1") end
    end }"""
    proxy = sluice_factory(lua_policy({"source": source, "config": {"edit": "inject"}}, tmp_path))
    r = get(proxy, recorder, "/inj")
    assert r.status_code == 502 and "X-Injected" not in r.headers
    line = access_log(tmp_path).wait_for(lambda e: e.get("status") == 502)[0]
    assert "X-A" in line["lua"]["error"], line

    proxy = sluice_factory(lua_policy({"source": source, "config": {"edit": "length"}}, tmp_path), name="framing")
    r = get(proxy, recorder, "/len")
    assert r.status_code == 502
