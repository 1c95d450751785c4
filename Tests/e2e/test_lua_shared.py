"""`sluice.shared` (docs/scripting.md): the count-per-api-key recipe against a recording
origin, its counts shared by every worker (each request on a connection of its own, so the
workers take turns), a key past its limit refused, and the access log's lua.vars; with a fleet,
one count for every instance, kept in its Redis."""

import shutil
from pathlib import Path

import pytest

from policy_support import AccessLog, monitors
from support import HOST, session_via

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "lua"


def fields(request: dict) -> dict:
    return {k.lower(): v for k, v in request["headers"]}


def test_count_per_api_key_recipe_counts_across_workers(sluice_factory, recorder, tmp_path):
    proxy = sluice_factory({
        "workers": 2,
        "policies": {HOST: {"adapters": [{"lua": {
            "file": str(EXAMPLES / "count-per-api-key.lua"),
            "config": {"header": "X-Api-Key", "window": 60, "limit": 3}}}]}},
        "monitors": monitors(access=tmp_path / "access.log"),
    })

    def send(key: str) -> int:
        with session_via(proxy.url) as s:  # a new connection each time
            return s.get(f"http://{HOST}:{recorder.port}/c", headers={"X-Api-Key": key, "Connection": "close"},
                         timeout=10).status_code

    assert [send("a"), send("b"), send("a"), send("a")] == [200, 200, 200, 200]
    # The origin lists requests by connection (one per worker), not by arrival: compare sets.
    seen = sorted((h["x-api-key"], h["x-request-count"]) for h in map(fields, recorder.requests()))
    assert seen == [("a", "1"), ("a", "2"), ("a", "3"), ("b", "1")], seen
    n = len(recorder.requests())
    assert send("a") == 502  # the fourth of key a: over its limit, nothing sent
    assert len(recorder.requests()) == n
    line = AccessLog(tmp_path / "access.log").wait_for(lambda e: e.get("status") == 502)[0]
    assert "key a is over its limit of 3" in line["lua"]["error"], line


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_with_a_fleet_the_count_is_the_fleets(sluice_factory, recorder, tmp_path):
    from test_fleet import Redis
    redis = Redis(tmp_path).start()
    try:
        fleet = {"redis": f"127.0.0.1:{redis.port}", "timeout": "500ms", "heartbeat": "300ms"}
        entry = {"file": str(EXAMPLES / "count-per-api-key.lua"), "config": {"header": "X-Api-Key", "window": 60}}
        proxies = [sluice_factory({"workers": 2, "fleet": fleet, "policies": {HOST: {"adapters": [{"lua": entry}]}}},
                   name=f"lua{i}") for i in range(2)]
        for i in range(4):
            with session_via(proxies[i % 2].url) as s:
                assert s.get(f"http://{HOST}:{recorder.port}/f", headers={"X-Api-Key": "k"}, timeout=10).status_code == 200
        counts = sorted(fields(r)["x-request-count"] for r in recorder.requests())
        assert counts == ["1", "2", "3", "4"], counts  # one count for both instances
        assert redis.cli("GET", "sluice:{lua|count:k}") == "i4"
        ttl = int(redis.cli("PTTL", "sluice:{lua|count:k}"))
        assert 0 < ttl <= 60_000, ttl
    finally:
        redis.stop()


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_over_a_fleet_bytes_come_back_and_big_sums_become_numbers(sluice_factory, recorder, tmp_path):
    # Through Redis as in the process: a raw digest and bytes that are not UTF-8 come back as
    # they were, two keys that differ in a byte stay two; an integer sum past 2^53 (the limit
    # of Redis's Lua) is a number, and the key stays readable.
    from test_fleet import Redis
    redis = Redis(tmp_path).start()
    source = r"""return { on_request = function(req, ctx)
      local sh = sluice.shared
      local d = sluice.sha256("x") .. "\0caf\xe9"
      sh.set("b\xff", d) sh.set("b\xfe", "other")
      ctx.vars.bytes = sh.get("b\xff") == d and sh.get("b\xfe") == "other"
      sh.set("big", math.maxinteger)
      local sum, err = sh.incr("big")
      ctx.vars.big = math.type(sum) .. "," .. tostring(err) .. "," .. math.type(sh.get("big"))
      sh.set("near", 9007199254740990)
      ctx.vars.near = math.type(sh.incr("near", 1)) .. "," .. math.type(sh.incr("near", 1))
    end }"""
    try:
        fleet = {"redis": f"127.0.0.1:{redis.port}", "timeout": "500ms", "heartbeat": "300ms"}
        proxy = sluice_factory({"fleet": fleet, "policies": {HOST: {"adapters": [{"lua": {"source": source}}]}},
                                "monitors": [{"access_log": {"path": str(tmp_path / "access.log")}}]})
        with session_via(proxy.url) as s:
            assert s.get(f"http://{HOST}:{recorder.port}/b", timeout=10).status_code == 200
        line = AccessLog(tmp_path / "access.log").wait_for(lambda e: e.get("url", "").endswith("/b"))[0]
        assert line["lua"]["vars"] == {"bytes": True, "big": "float,nil,float", "near": "integer,float"}, line
    finally:
        redis.stop()
