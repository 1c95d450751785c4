"""`sluice.shared` (docs/scripting.md): the count-per-api-key recipe against a recording
origin, its counts shared by every worker (each request on a connection of its own, so the
workers take turns), a key past its limit refused, and the access log's lua.vars."""

from pathlib import Path

from policy_support import AccessLog, monitors
from support import HOST, session_via

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "lua"


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
    counts = [dict((k.lower(), v) for k, v in r["headers"])["x-request-count"] for r in recorder.requests()]
    assert counts == ["1", "1", "2", "3"], counts
    assert "x-api-key" in dict((k.lower(), v) for k, v in recorder.requests()[-1]["headers"])
    n = len(recorder.requests())
    assert send("a") == 502  # the fourth of key a: over its limit, nothing sent
    assert len(recorder.requests()) == n
    line = AccessLog(tmp_path / "access.log").wait_for(lambda e: e.get("status") == 502)[0]
    assert "key a is over its limit of 3" in line["lua"]["error"], line
