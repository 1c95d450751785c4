"""Header adapters before a `lua` script (`HostPolicy.modelHeaderPlan`): their edits are made as
the request model's fields are built, and only the script runs on the model. The script must
see, and the origin get, what running each adapter on the model gave: replaced fields replaced
(never doubled), removed ones gone, added ones beside the client's, the generated
`X-Request-Id` unless an adapter sets it; a failing script still fails closed or open."""

from pathlib import Path

from test_lua import access_log, arrived, get
from policy_support import monitors
from support import HOST

# Copies what the script sees into headers the origin records.
SEES = ('return { on_request = function(req, ctx) '
        'local h = req.headers '
        'h:set("X-Saw-Auth", h:get("Authorization") or "none") '
        'h:set("X-Saw-Debug", h:get("X-Debug") or "none") '
        'h:set("X-Saw-By", h:get("X-Forwarded-By") or "none") '
        'h:set("X-Saw-Trace", table.concat(h:get_all("X-Trace"), "|")) '
        'h:set("X-Saw-Id", h:get("X-Request-Id") or "none") '
        'h:remove("X-Drop-Me") end }')

HEADER_ADAPTERS = [
    {"headers": {"set": {"X-Forwarded-By": "sluice", "X-Drop-Me": "set"}, "remove": ["X-Debug"],
                 "add": {"X-Trace": "adapter"}}},
    {"bearer": "tok-123"},
    {"api_key": {"header": "X-Api-Key", "value": "key-456"}},
]


def policy(tmp_path: Path, lua: dict, adapters: list | None = None) -> dict:
    return {"policies": {HOST: {"adapters": (HEADER_ADAPTERS if adapters is None else adapters) + [{"lua": lua}]}},
            "monitors": monitors(access=tmp_path / "access.log")}


def values_named(recorder):
    """name -> every value of that field in the last request the origin got, in order."""
    raw = recorder.requests()[-1]["headers"]
    return lambda name: [v for k, v in raw if k.lower() == name]


def test_the_script_sees_and_the_origin_gets_the_header_adapters_edits(sluice_factory, recorder, tmp_path):
    proxy = sluice_factory(policy(tmp_path, {"source": SEES}))
    r = get(proxy, recorder, "/p", {"Authorization": "Basic Y2xpZW50", "X-Debug": "1", "X-Forwarded-By": "client",
                                    "X-Trace": "client", "X-Client": "c1"})
    assert r.status_code == 200, r.text
    named = values_named(recorder)
    assert named("authorization") == ["Bearer tok-123"]
    assert named("x-forwarded-by") == ["sluice"]
    assert named("x-debug") == [] and named("x-drop-me") == []
    assert named("x-api-key") == ["key-456"]
    assert named("x-trace") == ["client", "adapter"]
    assert named("x-client") == ["c1"]
    h = arrived(recorder)["headers"]
    assert h["x-saw-auth"] == "Bearer tok-123"
    assert h["x-saw-debug"] == "none" and h["x-saw-by"] == "sluice"
    assert h["x-saw-trace"] == "client|adapter"
    assert h["x-saw-id"] != "none" and named("x-request-id") == [h["x-saw-id"]]
    line = access_log(tmp_path).wait_for(lambda e: e.get("url", "").endswith("/p"))[0]
    # The call succeeded and left no ctx.vars: the line has no `lua` field (the metrics count it).
    assert "lua" not in line and line["request_id"] == h["x-saw-id"], line


def test_an_adapter_that_sets_the_request_id_wins_over_the_generated_one(sluice_factory, recorder, tmp_path):
    adapters = [{"headers": {"set": {"X-Request-Id": "from-adapter"}}}]
    proxy = sluice_factory(policy(tmp_path, {"source": SEES}, adapters))
    assert get(proxy, recorder, "/id").status_code == 200
    assert values_named(recorder)("x-request-id") == ["from-adapter"]
    assert arrived(recorder)["headers"]["x-saw-id"] == "from-adapter"


def test_a_failing_script_after_header_adapters_fails_closed_or_open(sluice_factory, recorder, tmp_path):
    failing = 'return { on_request = function(req) req.headers:set("X-Edited", "1"); error("boom") end }'
    closed = sluice_factory(policy(tmp_path, {"source": failing}))
    assert get(closed, recorder, "/c").status_code == 502
    assert not recorder.requests()
    opened = sluice_factory(policy(tmp_path, {"source": failing, "on_error": "fail_open"}))
    assert get(opened, recorder, "/o", {"X-Debug": "1"}).status_code == 200
    h = arrived(recorder)["headers"]
    assert "x-edited" not in h and "x-debug" not in h
    assert h["authorization"] == "Bearer tok-123" and h["x-forwarded-by"] == "sluice"
