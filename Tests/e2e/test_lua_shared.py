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
