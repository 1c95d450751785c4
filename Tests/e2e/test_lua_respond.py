"""`req:respond` and `req:set_body` (docs/scripting.md) end to end, against a recording origin:
a script's answer reaches the client (status, fields, body, Sluice's Content-Length) and nothing
reaches the origin, in a hook run once per exchange and in one run on every try; an answer with
a bad or framing field is refused (502); a body a script sets (`read_body: true`) reaches the
origin with its length, and each retry starts from the body the client sent; a body over
`limits.body`, or set without `read_body`, is refused (502) with the reason in the access log."""

import json

from faultservers import simple_response
from test_lua import access_log, arrived, get, lua_policy

DENY = """return { on_request = function(req, ctx)
  if req.headers:get("X-Key") ~= "k1" then
    ctx.vars.denied = true
    req:respond(403, { ["Content-Type"] = "application/json", ["Set-Cookie"] = { "a=1", "b=2" } },
                '{"error":"no key"}')
  end
end }"""


def test_respond_answers_the_client_and_sends_nothing(sluice_factory, recorder, tmp_path):
    proxy = sluice_factory(lua_policy({"source": DENY}, tmp_path))
    r = get(proxy, recorder, "/deny")
    assert r.status_code == 403, r.text
    assert r.content == b'{"error":"no key"}'
    assert r.headers["Content-Type"] == "application/json"
    assert r.headers["Content-Length"] == str(len(r.content))
    assert r.raw.headers.getlist("Set-Cookie") == ["a=1", "b=2"]
    assert not recorder.requests()
    line = access_log(tmp_path).wait_for(lambda e: e.get("url", "").endswith("/deny"))[0]
    assert line["status"] == 403 and line["outcome"] == "ok", line
    assert line["lua"]["outcome"] == "ok" and line["lua"]["vars"] == {"denied": True}, line
    # The connection stays open and the next request goes upstream.
    assert get(proxy, recorder, "/allow", {"X-Key": "k1"}).status_code == 200
    assert arrived(recorder)["target"].endswith("/allow")


def test_respond_on_every_try_and_to_head(sluice_factory, recorder, tmp_path):
    proxy = sluice_factory(lua_policy({"source": DENY, "every_try": True}, tmp_path))
    r = get(proxy, recorder, "/deny")
    assert r.status_code == 403 and r.content == b'{"error":"no key"}', r.text
    r = get(proxy, recorder, "/head", method="HEAD")
    assert r.status_code == 403 and r.content == b"", r.content
    assert r.headers["Content-Length"] == str(len(b'{"error":"no key"}'))
    assert not recorder.requests()


def test_a_205_answer_has_no_content(sluice_factory, recorder, tmp_path):
    # RFC 9110 §15.3.6: a 205 carries no content; the keep-alive connection stays in step.
    source = 'return { on_request = function(req) if req.path == "/reset" then req:respond(205, {}, "hello") end end }'
    proxy = sluice_factory(lua_policy({"source": source}, tmp_path))
    from support import session_via, HOST
    with session_via(proxy.url) as s:
        r = s.get(f"http://{HOST}:{recorder.port}/reset", timeout=10)
        assert r.status_code == 205 and r.content == b"" and r.headers["Content-Length"] == "0", r.headers
        assert s.get(f"http://{HOST}:{recorder.port}/next", timeout=10).status_code == 200
    assert [q["target"] for q in recorder.requests()][-1].endswith("/next")


def test_respond_with_a_bad_field_is_refused(sluice_factory, recorder, tmp_path):
    cases = {
        "/crlf": 'req:respond(200, { ["X-A"] = "v\\r\\nX-Evil: 1" }, "x")',
        "/name": 'req:respond(200, { ["X A"] = "v" }, "x")',
        "/length": 'req:respond(200, { ["Content-Length"] = "99" }, "x")',
        "/interim": 'req:respond(103)',
    }
    source = "return { on_request = function(req)\n" + "\n".join(
        f'  if req.path == "{path}" then {call} end' for path, call in cases.items()) + "\nend }"
    proxy = sluice_factory(lua_policy({"source": source}, tmp_path))
    for path, why in [("/crlf", "contains CR, LF or NUL"), ("/name", "invalid header name"),
                      ("/length", "cannot set 'Content-Length'"), ("/interim", "a final status from 200 to 599")]:
        r = get(proxy, recorder, path)
        assert r.status_code == 502, (path, r.text)
        assert "X-Evil" not in r.headers
        line = access_log(tmp_path).wait_for(lambda e, p=path: e.get("url", "").endswith(p))[0]
        assert why in line["lua"]["error"], line
    assert not recorder.requests()


REWRITE = """return { on_request = function(req, ctx)
  local t = sluice.json.decode(req:body())
  t.rewritten = true
  t.attempt = (t.attempt or 0) + 1
  req:set_body(sluice.json.encode(t))
end }"""


def test_set_body_reaches_the_origin_with_its_length(sluice_factory, recorder, tmp_path):
    proxy = sluice_factory(lua_policy({"source": REWRITE, "read_body": True}, tmp_path))
    r = get(proxy, recorder, "/json", {"Content-Type": "application/json"}, method="POST", data=b'{"a": 1}')
    assert r.status_code == 200, r.text
    got = arrived(recorder)
    assert json.loads(got["body"]) == {"a": 1, "rewritten": True, "attempt": 1}
    assert got["headers"]["content-length"] == str(len(got["body"]))
    # A chunked client body is sent with the new body's length too.
    r = get(proxy, recorder, "/chunked", {"Content-Type": "application/json"}, method="POST",
            data=iter([b'{"b":', b' 2}']))
    assert r.status_code == 200, r.text
    got = arrived(recorder)
    assert json.loads(got["body"]) == {"b": 2, "rewritten": True, "attempt": 1}
    assert got["headers"]["content-length"] == str(len(got["body"]))
    assert "transfer-encoding" not in got["headers"]


def test_each_retry_starts_from_the_body_the_client_sent(sluice_factory, recorder, tmp_path):
    count = {"n": 0}

    def busy_once(req):
        count["n"] += 1
        return simple_response(503 if count["n"] == 1 else 200, b"done", [], "OK")
    recorder.response = busy_once
    cfg = lua_policy({"source": REWRITE, "read_body": True}, tmp_path)
    cfg["policies"][next(iter(cfg["policies"]))]["retry"] = {"limit": 2, "backoff": {"scale": "1ms"}}
    proxy = sluice_factory(cfg)
    r = get(proxy, recorder, "/retry", method="PUT", data=b'{"a": 1}')
    assert r.status_code == 200, r.text
    bodies = [json.loads(bytes(q["body"])) for q in recorder.requests()]
    # The script ran on each try's copy of the client's body: never on its own earlier edit.
    assert bodies == [{"a": 1, "rewritten": True, "attempt": 1}] * 2, bodies
    assert all(dict((k.lower(), v) for k, v in q["headers"])["content-length"] == str(len(bytes(q["body"])))
               for q in recorder.requests())


def test_set_body_over_limits_body_is_refused(sluice_factory, recorder, tmp_path):
    source = 'return { on_request = function(req) req:set_body(string.rep("x", 2048)) end }'
    proxy = sluice_factory(lua_policy({"source": source, "read_body": True, "limits": {"body": 1024}}, tmp_path))
    r = get(proxy, recorder, "/big", method="POST", data=b"small")
    assert r.status_code == 502, r.text
    assert not recorder.requests()
    line = access_log(tmp_path).wait_for(lambda e: e.get("url", "").endswith("/big"))[0]
    assert line["lua"]["outcome"] == "limit" and "over limits.body (1024)" in line["lua"]["error"], line


def test_set_body_without_read_body_is_refused(sluice_factory, recorder, tmp_path):
    source = 'return { on_request = function(req) req:set_body("new") end }'
    proxy = sluice_factory(lua_policy({"source": source}, tmp_path))
    r = get(proxy, recorder, "/unread", method="POST", data=b"old")
    assert r.status_code == 502, r.text
    assert not recorder.requests()
    line = access_log(tmp_path).wait_for(lambda e: e.get("url", "").endswith("/unread"))[0]
    assert "req:set_body needs read_body: true" in line["lua"]["error"], line
