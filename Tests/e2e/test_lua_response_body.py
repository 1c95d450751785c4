"""`read_response_body` (docs/scripting.md, "Response bodies") end to end, against a recording
origin, over both upstream engines: `res:body()` reads the body the origin sent (decoded from
chunked), `res:set_body(s)` replaces it and the client gets it with its own Content-Length; a
body over `limits.body` is a 502 with fail_closed and the origin's response, whole, with
fail_open; `res:retry()` after reading the body is a retry; the examples/lua/
drop-json-field.lua recipe; the policy's responses are never stored by the shared cache."""

import gzip
import json
import re

import pytest

from faultservers import simple_response
from policy_support import monitors, run_check
from support import HOST, session_via
from test_lua import EXAMPLES, access_log, get, lua_policy

ENGINES = ["native", "curl"]


def body_policy(entry: dict, tmp_path, engine: str = "native", **policy) -> dict:
    """A config whose policy for HOST runs the script with read_response_body, over `engine`."""
    return {"policies": {HOST: {"adapters": [{"lua": {"read_response_body": True, **entry}}],
                                "upstream": {"engine": engine}, **policy}},
            "monitors": monitors(access=tmp_path / "access.log")}


def chunked(body: bytes, content_type: str = "text/plain", pieces: int = 3) -> bytes:
    """A 200 whose body is sent in `pieces` chunks."""
    head = f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nTransfer-Encoding: chunked\r\n"
    out = head.encode() + b"\r\n"
    step = max(1, len(body) // pieces)
    for i in range(0, len(body), step):
        part = body[i:i + step]
        out += f"{len(part):x}\r\n".encode() + part + b"\r\n"
    return out + b"0\r\n\r\n"


UPPER = """return { on_response = function(res, ctx)
  ctx.vars.read = #res:body()
  res:set_body(res:body():upper() .. "!")
end }"""


@pytest.mark.parametrize("engine", ENGINES)
def test_the_body_is_read_and_replaced(sluice_factory, recorder, tmp_path, engine):
    recorder.response = simple_response(200, b"hello origin", [("X-Origin", "1")])
    proxy = sluice_factory(body_policy({"source": UPPER}, tmp_path, engine))
    r = get(proxy, recorder, "/b")
    assert r.status_code == 200 and r.content == b"HELLO ORIGIN!", r.content
    assert r.headers["Content-Length"] == "13" and "Transfer-Encoding" not in r.headers
    assert r.headers["X-Origin"] == "1" and "Via" in r.headers
    line = access_log(tmp_path).wait_for(lambda e: e.get("url", "").endswith("/b"))[0]
    assert line["lua"]["vars"] == {"read": 12}, line
    assert line["upstream_engine"] == engine and line["bytes_out"] == 13, line


@pytest.mark.parametrize("engine", ENGINES)
def test_a_chunked_body_is_read_decoded(sluice_factory, recorder, tmp_path, engine):
    body = b"0123456789" * 50
    recorder.response = chunked(body)
    source = 'return { on_response = function(res, ctx) ctx.vars.ok = res:body() == string.rep("0123456789", 50) end }'
    proxy = sluice_factory(body_policy({"source": source}, tmp_path, engine))
    r = get(proxy, recorder, "/c")
    assert r.status_code == 200 and r.content == body
    assert r.headers["Content-Length"] == "500" and "Transfer-Encoding" not in r.headers
    line = access_log(tmp_path).wait_for(lambda e: e.get("url", "").endswith("/c"))[0]
    assert line["lua"]["vars"] == {"ok": True}, line


def test_a_replaced_body_loses_the_origins_validators(sluice_factory, recorder, tmp_path):
    # A replaced body's ETag is weak and the fields about the origin's bytes go; a body read
    # and left alone keeps them.
    fields = [("ETag", '"v1"'), ("Accept-Ranges", "bytes"), ("Content-MD5", "x"), ("Repr-Digest", "sha-256=:x:"),
              ("Last-Modified", "Mon, 30 Nov 2026 00:00:00 GMT")]
    recorder.response = simple_response(200, b"body", fields)
    source = 'return { on_response = function(res) if res.status == 200 and res:body() == "body" and ' \
             'res.headers:get("X-Keep") == nil then res:set_body("BODY") end end }'
    proxy = sluice_factory(body_policy({"source": source}, tmp_path))
    r = get(proxy, recorder, "/v")
    assert r.status_code == 200 and r.content == b"BODY", r.content
    assert r.headers["ETag"] == 'W/"v1"' and r.headers["Last-Modified"].startswith("Mon"), r.headers
    assert not {"Accept-Ranges", "Content-MD5", "Repr-Digest"} & set(r.headers), r.headers
    recorder.response = simple_response(200, b"body", fields + [("X-Keep", "1")])
    r = get(proxy, recorder, "/k")
    assert r.content == b"body" and r.headers["ETag"] == '"v1"' and r.headers["Accept-Ranges"] == "bytes", r.headers


@pytest.mark.parametrize("engine", ENGINES)
def test_trailer_fields_are_not_made_header_fields(sluice_factory, recorder, tmp_path, engine):
    # A chunked body's trailer is dropped by both engines: the script's res.headers and the
    # client's head are the head's fields only.
    recorder.response = chunked(b"t" * 30).replace(b"Transfer-Encoding: chunked\r\n",
                                                   b"Transfer-Encoding: chunked\r\nTrailer: X-T\r\n")
    recorder.response = recorder.response[:-2] + b"X-T: v\r\n\r\n"
    source = """return { on_response = function(res, ctx)
      local names = {}
      for name in res.headers:each() do names[#names + 1] = name:lower() end
      ctx.vars.names = table.concat(names, ",")
    end }"""
    proxy = sluice_factory(body_policy({"source": source}, tmp_path, engine))
    r = get(proxy, recorder, "/trailer")
    assert r.status_code == 200 and r.content == b"t" * 30, r.content
    assert "X-T" not in r.headers and r.headers["Content-Length"] == "30", r.headers
    line = access_log(tmp_path).wait_for(lambda e: e.get("url", "").endswith("/trailer"))[0]
    assert line["lua"]["vars"] == {"names": "content-type,transfer-encoding,trailer"}, line


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_a_body_over_the_limit_fails_the_call(sluice_factory, recorder, tmp_path, engine, framing):
    body = bytes(range(256)) * 400  # 100 KiB, over a 1 KiB limit
    recorder.response = simple_response(200, body) if framing == "length" else chunked(body, pieces=7)
    entry = {"source": UPPER, "limits": {"body": "1KiB"}}
    proxy = sluice_factory(body_policy(entry, tmp_path, engine))
    r = get(proxy, recorder, "/big")
    assert r.status_code == 502, r.status_code
    assert r.text.startswith("sluice: script source.lua failed on request "), r.text
    line = access_log(tmp_path).wait_for(lambda e: e.get("url", "").endswith("/big"))[0]
    assert line["lua"]["outcome"] == "limit", line
    assert "the response body" in line["lua"]["error"] and "over limits.body (1024)" in line["lua"]["error"], line

    # fail_open: the response goes on as the origin sent it, whole.
    proxy = sluice_factory(body_policy({**entry, "on_error": "fail_open"}, tmp_path, engine), name="open")
    r = get(proxy, recorder, "/big-open")
    assert r.status_code == 200 and r.content == body, (r.status_code, len(r.content))
    if framing == "length":
        assert r.headers["Content-Length"] == str(len(body))
    # The connection carries on to the next request.
    with session_via(proxy.url) as s:
        for path in ("/1", "/2"):
            assert s.get(f"http://{HOST}:{recorder.port}{path}", timeout=10).content == body


@pytest.mark.parametrize("engine", ENGINES)
def test_res_retry_after_reading_the_body(sluice_factory, recorder, tmp_path, engine):
    count = {"n": 0}

    def answer(req):
        count["n"] += 1
        return simple_response(200, b"busy" if count["n"] == 1 else b"done")
    recorder.response = answer
    source = 'return { on_response = function(res) if res:body() == "busy" then res:retry() end end }'
    proxy = sluice_factory(body_policy({"source": source}, tmp_path, engine,
                                       retry={"limit": 2, "backoff": {"scale": "1ms"}}))
    r = get(proxy, recorder, "/r")
    assert r.status_code == 200 and r.content == b"done", r.content
    assert len(recorder.requests()) == 2
    line = access_log(tmp_path).wait_for(lambda e: e.get("url", "").endswith("/r"))[0]
    assert [x["reason"] for x in line["retries"]] == ["lua"] and line["attempts"] == 2, line


def test_head_and_204_have_no_body(sluice_factory, recorder, tmp_path):
    source = 'return { on_response = function(res, ctx) ctx.vars.len = #res:body() end }'
    recorder.response = simple_response(204, b"")
    proxy = sluice_factory(body_policy({"source": source}, tmp_path))
    r = get(proxy, recorder, "/none")
    assert r.status_code == 204 and r.content == b""
    line = access_log(tmp_path).wait_for(lambda e: e.get("url", "").endswith("/none"))[0]
    assert line["lua"]["vars"] == {"len": 0}, line
    recorder.response = simple_response(200, b"abc")
    r = get(proxy, recorder, "/head", method="HEAD")
    assert r.status_code == 200 and r.headers["Content-Length"] == "3"


def test_set_body_without_the_key_fails_the_call(sluice_factory, recorder, tmp_path):
    source = 'return { on_response = function(res) res:set_body("x") end }'
    proxy = sluice_factory(lua_policy({"source": source}, tmp_path))
    r = get(proxy, recorder, "/nokey")
    assert r.status_code == 502
    line = access_log(tmp_path).wait_for(lambda e: e.get("status") == 502)[0]
    assert "res:set_body needs read_response_body: true" in line["lua"]["error"], line


def test_the_key_needs_on_response(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("policies:\n  h.test:\n    adapters:\n      - lua:\n          source: |\n"
                   "            return { on_request = function(req) end }\n          read_response_body: true\n")
    out = run_check(cfg)
    assert out.returncode != 0
    assert re.search(re.escape(str(cfg)) + r":[56]:\d+:", out.stderr + out.stdout), out.stderr + out.stdout
    assert "read_response_body is for on_response" in out.stderr + out.stdout


@pytest.mark.parametrize("engine", ENGINES)
def test_drop_json_field_recipe(sluice_factory, recorder, tmp_path, engine):
    doc = {"id": 7, "internal_id": "x-99", "user": {"name": "ann", "ssn": "123-45-6789"}, "tags": ["a", "b"]}
    recorder.response = chunked(json.dumps(doc).encode(), "application/json; charset=utf-8")
    proxy = sluice_factory(body_policy({"file": str(EXAMPLES / "drop-json-field.lua"),
                                        "config": {"fields": ["internal_id", "user.ssn", "absent.x"]}},
                                       tmp_path, engine))
    r = get(proxy, recorder, "/user/7")
    assert r.status_code == 200, r.text
    assert r.json() == {"id": 7, "user": {"name": "ann"}, "tags": ["a", "b"]}, r.text
    assert r.headers["Content-Length"] == str(len(r.content))
    assert "123-45-6789" not in r.text
    line = access_log(tmp_path).wait_for(lambda e: e.get("url", "").endswith("/user/7"))[0]
    assert line["lua"]["vars"] == {"dropped": 2}, line

    # Not JSON, or compressed: unchanged.
    recorder.response = simple_response(200, b'{"internal_id": 1}')
    assert get(proxy, recorder, "/text").content == b'{"internal_id": 1}'
    packed = gzip.compress(b'{"internal_id": 1}')
    recorder.response = (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
                         f"Content-Length: {len(packed)}\r\n\r\n").encode() + packed
    r = get(proxy, recorder, "/gz")
    assert r.status_code == 200 and r.json() == {"internal_id": 1}
    assert r.headers["Content-Length"] == str(len(packed))


def test_the_policy_bypasses_the_shared_cache(sluice_factory, recorder, tmp_path):
    recorder.response = simple_response(200, b"fresh", [("Cache-Control", "max-age=600")])
    cfg = body_policy({"source": UPPER}, tmp_path)
    cfg["cache_store"] = {"memory": "4MiB"}
    proxy = sluice_factory(cfg)
    for _ in range(3):
        r = get(proxy, recorder, "/cached")
        assert r.content == b"FRESH!" and "Cache-Status" not in r.headers
    assert len(recorder.requests()) == 3, "every request went to the origin: nothing was stored"


REFUSES_WITHOUT_KEY = 'return { on_request = function(req) if req.headers:get("X-Key") ~= "good" then ' \
                      'req:respond(403, {}, "no key") end end }'


def test_a_scripted_policy_never_answers_from_the_cache(sluice_factory, recorder, tmp_path):
    # The cache answers before the adapters: a policy whose scripts see the request or the
    # response bypasses it, so that a hit never skips a refusal, nor serves one client's
    # rewrite or edits to another. A script with on_log alone leaves the cache as it is.
    recorder.response = simple_response(200, b"secret page", [("Cache-Control", "public, max-age=600")])
    cfg = {"policies": {HOST: {"adapters": [{"lua": {"source": REFUSES_WITHOUT_KEY}}]}},
           "cache_store": {"memory": "4MiB"}}
    proxy = sluice_factory(cfg)
    assert get(proxy, recorder, "/g").status_code == 403
    r = get(proxy, recorder, "/g", {"X-Key": "good"})
    assert r.status_code == 200 and r.content == b"secret page"
    r = get(proxy, recorder, "/g")
    assert r.status_code == 403 and r.content == b"no key" and "Cache-Status" not in r.headers, r.headers
    assert len(recorder.requests()) == 1
    # on_log alone: stored and served as a hit.
    logging = {"policies": {HOST: {"adapters": [{"lua": {"source": "return { on_log = function(ctx) end }"}}]}},
               "cache_store": {"memory": "4MiB"}}
    proxy = sluice_factory(logging, name="logonly")
    n = len(recorder.requests())
    for _ in range(2):
        assert get(proxy, recorder, "/l").content == b"secret page"
    assert len(recorder.requests()) == n + 1, "the second was a hit"


def test_a_tunnel_runs_no_on_log(sluice_factory, recorder, tmp_path):
    # A CONNECT Sluice does not intercept carries what no script sees: its end runs no hook.
    import socket
    from support import connect_through
    source = "return { on_log = function(ctx) ctx.vars.logged = true end }"
    proxy = sluice_factory({"policies": {HOST: {"adapters": [{"lua": {"source": source}}]}},
                            "access": {"connect_ports": [recorder.port]},
                            "monitors": [{"access_log": {"path": str(tmp_path / "access.log")}}]})
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        assert b" 200 " in connect_through(s, f"{HOST}:{recorder.port}")
        s.sendall(f"GET /through HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data and (chunk := s.recv(65536)):
            data += chunk
        assert data.startswith(b"HTTP/1.1 200"), data[:100]
    entry = access_log(tmp_path).wait_for(lambda e: e.get("outcome") == "tunnel")[0]
    assert "lua" not in entry, entry
    assert get(proxy, recorder, "/plain").status_code == 200
    plain = access_log(tmp_path).wait_for(lambda e: e.get("url", "").endswith("/plain"))[0]
    assert plain["lua"]["vars"] == {"logged": True}, plain
