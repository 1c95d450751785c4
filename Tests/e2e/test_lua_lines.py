"""Scripts run on the forwarded request's header lines (`HostPolicy.scriptsOnLines`: a policy
whose once-per-exchange adapters are scripts that never wait, after any header adapters): no
request model is built, and their edits are made as the lines are copied. The origin must get
what the model gave: `set`, `add` and `remove` as on fields, names in any case, the fields
Sluice adds seen by the script, a path or a method changed beside header edits, and a
failed call's edits dropped with `fail_open`."""

from pathlib import Path

import pytest

from faultservers import simple_response
from test_lua import access_log, arrived, get, lua_policy
from test_lua_header_plan import values_named
from test_metric_values import metrics_proxy, settled
from support import HOST

EDITS = ('return { on_request = function(req) local h = req.headers '
         'h:set("X-Seen", h:get("X-Client") or "none") '
         'h:set("X-Lower", h:get("x-client") or "none") '
         'h:set("X-Replaced", "new") '
         'h:add("X-Added", "1") h:add("X-Added", "2") '
         'h:remove("X-Gone") '
         'h:set("X-Id-Seen", h:get("X-Request-Id") or "none") end }')


def test_header_edits_reach_the_origin_as_on_fields(sluice_factory, recorder, tmp_path):
    proxy = sluice_factory(lua_policy({"source": EDITS}, tmp_path))
    r = get(proxy, recorder, "/e", {"X-Client": "c1", "X-Replaced": "old", "X-Gone": "1"})
    assert r.status_code == 200, r.text
    named = values_named(recorder)
    assert named("x-seen") == ["c1"]
    assert named("x-lower") == ["c1"]
    assert named("x-replaced") == ["new"]
    assert named("x-added") == ["1", "2"]
    assert named("x-gone") == []
    assert named("x-client") == ["c1"]
    assert named("x-id-seen") == named("x-request-id") and named("x-request-id") != ["none"]
    assert len(named("via")) == 1
    line = access_log(tmp_path).wait_for(lambda e: e.get("url", "").endswith("/e"))[0]
    # The call succeeded and left no ctx.vars: the line has no `lua` field.
    assert line["status"] == 200 and "lua" not in line, line


def test_a_call_that_succeeds_and_leaves_no_vars_is_counted_but_not_logged(sluice_factory, recorder, tmp_path):
    """The access log's `lua` field is for calls that failed or left `ctx.vars`; one that
    succeeded with none is in `sluice_lua_calls_total` and the duration histogram alone."""
    log = str(tmp_path / "access.log")
    proxy, admin = metrics_proxy(sluice_factory, 1, policies={HOST: {"adapters": [{"lua": {"source": EDITS}}]}},
                                 monitors=[{"metrics": {}}, {"access_log": {"path": log}}])
    assert get(proxy, recorder, "/quiet", {"X-Client": "c1"}).status_code == 200
    line = access_log(tmp_path).wait_for(lambda e: e.get("url", "").endswith("/quiet"))[0]
    assert line["status"] == 200 and "lua" not in line, line
    samples = settled(admin, "sluice_lua_calls_total", 1, script="source.lua", hook="on_request", outcome="ok")
    count = [v for (name, labels), v in samples.items()
             if name == "sluice_lua_call_duration_seconds_count" and ("hook", "on_request") in labels]
    assert count == [1.0], count


def test_a_field_read_after_an_edit_and_each_see_the_edits(sluice_factory, recorder, tmp_path):
    script = ('return { on_request = function(req) local h = req.headers '
              'h:set("X-A", "1") h:add("X-A", "2") h:set("X-Read", h:get("X-A")) '
              'local n = 0 for k, v in h:each() do if k:lower() == "x-a" then n = n + 1 end end '
              'h:set("X-Count", tostring(n)) h:remove("X-Client") end }')
    proxy = sluice_factory(lua_policy({"source": script}, tmp_path))
    assert get(proxy, recorder, "/r", {"X-Client": "c2", "X-A": "0"}).status_code == 200
    named = values_named(recorder)
    assert named("x-read") == ["1, 2"] and named("x-count") == ["2"]
    assert named("x-a") == ["1", "2"] and named("x-client") == []


def test_a_path_or_method_change_goes_with_the_header_edits(sluice_factory, recorder, tmp_path):
    script = ('return { on_request = function(req) req.headers:set("X-Seen", req.headers:get("X-Client") or "none") '
              'if req.path == "/old" then req.path = "/new"; req.query = "v=2" end '
              'if req.method == "DELETE" then req.method = "GET" end end }')
    proxy = sluice_factory(lua_policy({"source": script}, tmp_path))
    assert get(proxy, recorder, "/old?v=1", {"X-Client": "c3"}).status_code == 200
    a = arrived(recorder)
    assert a["target"] == "/new?v=2" and a["headers"]["x-seen"] == "c3"
    assert get(proxy, recorder, "/m", {"X-Client": "c4"}, method="DELETE").status_code == 200
    a = arrived(recorder)
    assert a["method"] == "GET" and a["target"] == "/m" and a["headers"]["x-seen"] == "c4"


def test_a_bad_path_with_fail_open_drops_every_edit(sluice_factory, recorder, tmp_path):
    script = 'return { on_request = function(req) req.headers:set("X-Edited", "1"); req.path = "/a b" end }'
    proxy = sluice_factory(lua_policy({"source": script, "on_error": "fail_open"}, tmp_path))
    assert get(proxy, recorder, "/keep").status_code == 200
    a = arrived(recorder)
    assert a["target"] == "/keep" and "x-edited" not in a["headers"]
    closed = sluice_factory(lua_policy({"source": script}, tmp_path))
    assert get(closed, recorder, "/refused").status_code == 502
    assert arrived(recorder)["target"] == "/keep"


@pytest.mark.parametrize("path", ["/\\xc3\\xbc", "/caf\\xe9", "/ok?q=\\xff"])
def test_a_path_or_query_past_ascii_fails_the_call(sluice_factory, recorder, tmp_path, path):
    # Raw, such bytes would reach the origin as each engine spells them (or as U+FFFD); the
    # parser refuses them from a client, and a script is told to percent-encode them.
    target, _, query = path.partition("?")
    edit = f'req.path = "{target}"' + (f'; req.query = "{query}"' if query else "")
    proxy = sluice_factory(lua_policy({"source": f"return {{ on_request = function(req) {edit} end }}"}, tmp_path))
    assert get(proxy, recorder, "/x").status_code == 502
    assert not recorder.requests()
    line = access_log(tmp_path).wait_for(lambda e: e.get("status") == 502)[0]
    assert "visible ASCII only" in line["lua"]["error"], line


@pytest.mark.parametrize("declared,key,expected", [
    ("", False, "none"),  # once per exchange, in the list's order: before the `headers` entry
    ("every_try = true, ", False, "1"),  # the script asks to run on every try: after it
    ("", True, "1"),  # the YAML key alike
])
def test_every_try_runs_after_the_once_per_exchange_adapters(sluice_factory, recorder, tmp_path: Path,
                                                             declared, key, expected):
    """docs/scripting.md, `every_try`: a hook on every try runs after the adapters that run once
    per exchange, whatever the list's order, like the signers; a script may ask for it in its
    hooks table (`every_try = true`) as the YAML key does."""
    source = (f'return {{ {declared}on_request = function(req) '
              'req.headers:set("X-Saw", req.headers:get("X-Later") or "none") end }')
    entry = {"source": source, **({"every_try": True} if key else {})}
    proxy = sluice_factory({"policies": {HOST: {"adapters": [{"lua": entry}, {"headers": {"set": {"X-Later": "1"}}}]}}})
    assert get(proxy, recorder, "/order").status_code == 200
    seen = arrived(recorder)["headers"]
    assert seen["x-later"] == "1" and seen["x-saw"] == expected, seen


def test_a_policy_that_retries_runs_the_script_before_every_try(sluice_factory, recorder, tmp_path: Path):
    """A retry adapts the request again (such a policy keeps the model): the script runs once
    per try, sharing `ctx`."""
    script = ('return { on_request = function(req, ctx) ctx.vars.tries = (ctx.vars.tries or 0) + 1 '
              'req.headers:set("X-Try", tostring(ctx.vars.tries)) end }')
    count = {"n": 0}

    def busy_once(req):
        count["n"] += 1
        return simple_response(503 if count["n"] == 1 else 200, b"done", [], "OK")
    recorder.response = busy_once
    cfg = lua_policy({"source": script}, tmp_path)
    cfg["policies"][next(iter(cfg["policies"]))]["retry"] = {"limit": 2, "backoff": {"scale": "1ms"}}
    proxy = sluice_factory(cfg)
    assert get(proxy, recorder, "/retry").status_code == 200
    tries = [dict((k.lower(), v) for k, v in r["headers"])["x-try"] for r in recorder.requests()]
    assert tries == ["1", "2"], tries


@pytest.mark.parametrize("every_try", [False, True])
def test_a_scripts_method_is_the_method_sent_on_every_try_too(sluice_factory, recorder, tmp_path, every_try):
    """`req.method` goes upstream whether the hook runs once per exchange or on every try
    (where the try's request is built again from the model: its method went missing)."""
    entry = {"source": 'return { on_request = function(req) req.method = "POST" end }',
             **({"every_try": True} if every_try else {})}
    proxy = sluice_factory(lua_policy(entry, tmp_path))
    assert get(proxy, recorder, "/m").status_code == 200
    assert arrived(recorder)["method"] == "POST"


@pytest.mark.parametrize("sent,made", [("HEAD", "GET"), ("GET", "HEAD"), ("GET", "head"), ("GET", "CONNECT")])
def test_a_method_cannot_change_to_or_from_head(sluice_factory, recorder, tmp_path, sent, made):
    """The client frames the answer by the method it sent: a GET made HEAD would wait for a
    body that never comes, a HEAD made GET would read the body as its next response. Such an
    edit (and CONNECT) fails the call: 502 with fail_closed, nothing sent."""
    proxy = sluice_factory(lua_policy({"source": f'return {{ on_request = function(req) req.method = "{made}" end }}'},
                                      tmp_path))
    r = get(proxy, recorder, "/h", method=sent)
    assert r.status_code == 502, r.text
    assert recorder.requests() == []
    line = access_log(tmp_path).wait_for(lambda e: e.get("url", "").endswith("/h"))[0]
    assert f"req.method cannot change {sent} to {made}" in line["lua"]["error"], line
