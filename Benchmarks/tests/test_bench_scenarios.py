"""Every scenario of scenarios.toml loads, and overrides reach it."""

import pytest

from bench import runner
from bench.servers import PORT_OFFSETS, STARTERS


@pytest.mark.parametrize("name", list(runner.scenario_names()))
def test_scenario_loads_with_known_targets_and_measures(name):
    scenario = runner.load_scenario(name, [])
    assert all(t == "direct" or t in STARTERS for t in scenario["targets"])
    assert set(scenario["measures"]) <= set(runner.measures.MEASURES)
    assert scenario["base_port"] + max(PORT_OFFSETS.values()) < 32768
    assert not 20000 <= scenario["base_port"] <= 30000   # the e2e suite's ports


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
