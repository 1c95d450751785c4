"""The fleetcache measure's configurations, workload and table (bench/fleetcache.py)."""

from pathlib import Path

import pytest

from bench import fleetcache, report
from bench.servers import Lab


@pytest.fixture
def lab(tmp_path):
    return Lab(tmp=tmp_path, base_port=31080, sluice_bin=Path("/nonexistent/sluice"), nofile=4096, is_root=False)


def test_each_instance_lists_all_three_as_its_static_members(lab):
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load(fleetcache.instance_yaml(lab, "fleet-b", True, "s" * 32))
    assert config["listen"] == ["127.0.0.1:31111"] and config["workers"] == 1
    assert config["fleet"]["cache"]["advertise"] == "127.0.0.1:31111"
    assert [p["address"] for p in config["fleet"]["cache"]["peers"]] == [
        "127.0.0.1:31110", "127.0.0.1:31111", "127.0.0.1:31112"]
    alone = yaml.safe_load(fleetcache.instance_yaml(lab, "fleet-b", False, "s" * 32))
    assert "fleet" not in alone and alone["cache_store"] == config["cache_store"]


class _Bench:
    def __init__(self, lab):
        self.lab = lab
        self.scenario = {"fleetcache": {"urls": 1000, "requests": 5000, "zipf": 1.0}}


def test_the_zipf_workload_is_the_same_for_both_runs_and_skewed(lab):
    a, b = fleetcache.zipf_urls(_Bench(lab), "shared"), fleetcache.zipf_urls(_Bench(lab), "local")
    assert len(a) == 5000 and [u.replace("/local/", "/shared/") for u in b] == a
    top = a.count(f"http://{lab.origin_host}/fleet/shared/1")
    # Rank 1 of 1,000 with exponent 1: 1 / H(1000) ≈ 13 % of the draws.
    assert 500 < top < 800, top


def test_the_table_gives_origin_requests_per_distinct_url():
    run = lambda origin: {"requests": 5000, "distinct_urls": 800, "origin_requests": origin,
                          "statuses": {"200": 5000}, "seconds": 1.0}
    m = lambda rps, a, b: {"rps": rps, "p50_us": 500, "p99_us": 900, "cpu_us_a": a, "cpu_us_b": b, "other_load_pct": 1}
    result = {"scenario": {"rounds": 3, "fleetcache": {"connections": 64, "urls": 1000, "requests": 5000,
                                                       "zipf": 1.0, "clients": 16}},
              "fleetcache": {"hop": {"median": {"owner": m(40000, 0.5, 20.0), "non_owner": m(20000, 30.0, 22.0)}},
                             "shared": run(800), "local": run(1900)}}
    text = report.fleetcache_section(result)
    assert "| one cache across the fleet | 5,000 | 800 | 800 | 1.00 |" in text
    assert "| each instance its own | 5,000 | 800 | 1,900 | 2.38 |" in text
    assert "| through a non-owner (A, asking B) | 20,000 |" in text and "0.50 of the owner's req/s" in text
