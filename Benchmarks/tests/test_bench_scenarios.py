"""Every scenario of scenarios.toml loads, and overrides reach it."""

import pytest

from bench import runner
from bench.servers import PORT_OFFSETS, SLUICE_TARGETS, STARTERS


@pytest.mark.parametrize("name", list(runner.scenario_names()))
def test_scenario_loads_with_known_targets_and_measures(name):
    scenario = runner.load_scenario(name, [])
    assert all(t == "direct" or t in STARTERS for t in scenario["targets"])
    assert set(scenario["measures"]) <= set(runner.measures.MEASURES)
    assert scenario["base_port"] + max(PORT_OFFSETS.values()) < 32768
    assert not 20000 <= scenario["base_port"] <= 30000   # the e2e suite's ports
    assert set(scenario["references"]) <= {"direct", *STARTERS}
    # callgrind measures Sluice's targets, and the nginx peers it knows how to run alone.
    measurable = SLUICE_TARGETS | set(runner.measures.CALLGRIND_NGINX_TARGETS)
    assert set(scenario["callgrind"].get("targets", [])) <= set(scenario["targets"]) & measurable
    assert {"n1", "n2"} <= set(scenario["callgrind"])


def test_ratelimit_compares_the_pipeline_with_and_without_a_limit():
    scenario = runner.load_scenario("ratelimit", [])
    assert scenario["targets"] == ["sluice-pipeline", "sluice-ratelimit"]
    assert scenario["references"] == ["sluice-pipeline"]
    assert scenario["measures"] == ["throughput", "callgrind"]
    assert scenario["loads"] == [{"body": "1k", "connections": [64]}]
    assert (scenario["rounds"], scenario["duration"], scenario["origin"]) == (5, 5, "plain")
    # The scenario's callgrind table names the targets; n1 and n2 come from [defaults].
    assert scenario["callgrind"] == {"n1": 200, "n2": 2200, "targets": ["sluice-pipeline", "sluice-ratelimit"]}


def test_fleet_compares_the_limit_in_redis_with_the_limit_in_process():
    scenario = runner.load_scenario("fleet", [])
    assert scenario["targets"] == ["sluice-ratelimit", "sluice-fleet"]
    assert scenario["references"] == ["sluice-ratelimit"]
    assert scenario["measures"] == ["throughput", "callgrind"]
    assert scenario["loads"] == [{"body": "1k", "connections": [64]}]
    assert (scenario["rounds"], scenario["duration"], scenario["origin"]) == (5, 5, "plain")
    assert set(scenario["callgrind"]["targets"]) == {"sluice-ratelimit", "sluice-fleet"}
    assert scenario["description"] == "A fleet limit in Redis far above the load against the same limit in-process"
    # The scenarios follow each other in the file: [fleet] right after [ratelimit].
    names = list(runner.scenario_names())
    assert names.index("fleet") == names.index("ratelimit") + 1


def test_overrides():
    scenario = runner.load_scenario("headline", ["duration=2", "idle_clients.hold=3", 'targets=["direct", "nginx"]'])
    assert scenario["duration"] == 2
    assert scenario["idle_clients"] == {"clients": 1000, "batch": 1000, "sources": 1, "hold": 3}
    assert scenario["targets"] == ["direct", "nginx"]


def test_unknown_scenario_or_target():
    with pytest.raises(SystemExit):
        runner.load_scenario("nope", [])
    with pytest.raises(SystemExit):
        runner.load_scenario("quick", ['targets=["direct", "varnish"]'])
