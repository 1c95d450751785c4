"""BENCHMARKS.md's tables and the chart from a small sample result file."""

import copy
from pathlib import Path

import pytest

from bench import report

SAMPLE = Path(__file__).with_name("sample-result.json")


@pytest.fixture
def result():
    return report.load(SAMPLE)


def test_ratios_come_from_the_median_rounds(result):
    # Medians: direct 84,000, sluice-pipeline 42,000, haproxy 52,500 req/s.
    assert report.throughput_ratio(result, "sluice-pipeline", "direct", "1k", 64) == 0.5
    assert report.throughput_ratio(result, "sluice-pipeline", "haproxy", "1k", 64) == 0.8
    assert report.throughput_ratio(result, "trafficserver", "direct", "1k", 64) is None


def test_summary_has_one_row_per_measured_proxy(result):
    text = report.summary_section(result)
    assert "| sluice-pipeline | 0.50 | 0.80 | 24.0 µs | 1.50 | ok | 1.0 MiB | 33.2 MiB | +5.0 MiB | 83,313 |" in text
    assert "| haproxy | 0.62 | 1.00 | 16.8 µs |" in text
    assert "trafficserver" not in text and "| direct |" not in text


def test_markdown_names_the_machine_the_sources_and_what_was_not_measured(result):
    text = report.markdown(result, "Benchmarks/results/x.json", "Benchmarks/results/x.png")
    assert "2 × Test CPU" in text and "commit abc1234" in text
    assert "[Benchmarks/results/x.json](Benchmarks/results/x.json)" in text
    assert "![headline run](Benchmarks/results/x.png)" in text
    assert "trafficserver (traffic_server is not installed)" in text
    assert "| sluice-pipeline | 64 | 42000 | 900 µs | 3.10 ms | 0.50 | 0.80 | 24.0 µs | 1 % | 0 | 40000 / 42000 / 46000 |" in text
    assert "| direct | 1000 | 1000 | 1.00 | ok | – | 0 % |  |" in text
    assert "| sluice-pipeline | 85,250,666 | 251,876,490 | 83,313 |" in text
    assert "difference to" not in text   # direct, the first reference, has no instruction count


def ratelimit_result() -> dict:
    """The ratelimit scenario's shape: two Sluice targets, the first the reference of both measures."""
    def cell(target, *rps):
        rounds = [{"round": i + 1, "rps": v, "p50_us": 900, "p99_us": 3100, "cpu_us": 20.0, "origin_cpu_us": 5.0,
                   "other_load_pct": 0, "errors": {}} for i, v in enumerate(rps)]
        return {"target": target, "body": "1k", "connections": 64, "rounds": rounds,
                "median": sorted(rounds, key=lambda r: r["rps"])[len(rounds) // 2]}
    targets = ["sluice-pipeline", "sluice-ratelimit"]
    return {
        "scenario": {"name": "ratelimit", "origin": "plain", "targets": targets, "references": ["sluice-pipeline"],
                     "loads": [{"body": "1k", "connections": [64]}], "cpu_connections": 64,
                     "callgrind": {"n1": 200, "n2": 2200, "targets": targets}},
        "throughput": [cell("sluice-pipeline", 40000, 50000, 45000, 48000, 42000),
                       cell("sluice-ratelimit", 44000, 39000, 49000, 44100, 47000)],
        "callgrind": {"sluice-pipeline": {"n1": 200, "n2": 2200, "ir_n1": 1, "ir_n2": 2, "per_request": 80000},
                      "sluice-ratelimit": {"n1": 200, "n2": 2200, "ir_n1": 1, "ir_n2": 2, "per_request": 81200}},
        "targets": {t: {"status": "ok", "rss_idle_kib": 10240} for t in targets},
    }


def test_ratelimit_is_reported_against_the_pipeline():
    result = ratelimit_result()
    assert report.references(result) == ["sluice-pipeline"]
    assert report.throughput_ratio(result, "sluice-ratelimit", "sluice-pipeline", "1k", 64) == 0.98
    summary = report.summary_section(result)
    assert "| sluice-ratelimit | 0.98 | 20.0 µs | 10.0 MiB | 81,200 |" in summary
    assert "| sluice-pipeline |" not in summary
    assert "| sluice-ratelimit | 64 | 44100 |" in report.throughput_sections(result)[0]
    assert report.instruction_delta(result, "sluice-ratelimit", "sluice-pipeline") == (1200, 1.5)
    text = report.callgrind_section(result)
    assert "| instructions per request | difference to sluice-pipeline |" in text
    assert "| sluice-pipeline | 1 | 2 | 80,000 | – |" in text
    assert "| sluice-ratelimit | 1 | 2 | 81,200 | +1,200 (+1.5 %) |" in text


def test_replace_block_keeps_what_is_around_it():
    text = "intro\n<!-- bench:begin headline -->\nold\n<!-- bench:end headline -->\nhistory\n"
    new = report.replace_block(text, "headline", "new")
    assert new == "intro\n<!-- bench:begin headline -->\nnew\n<!-- bench:end headline -->\nhistory\n"
    with pytest.raises(SystemExit):
        report.replace_block("no markers", "headline", "new")


def test_chart_is_a_png(result, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "chart.png"
    report.chart(result, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def fleet_result() -> dict:
    """The fleet scenario's shape: sluice-ratelimit, the reference, and sluice-fleet with the figures
    of its Redis in every round."""
    result = ratelimit_result()
    targets = ["sluice-ratelimit", "sluice-fleet"]
    result["scenario"].update(name="fleet", targets=targets, references=["sluice-ratelimit"],
                              callgrind={"n1": 200, "n2": 2200, "targets": targets})
    reference, fleet = result["throughput"]
    reference["target"], fleet["target"] = targets
    for r in fleet["rounds"]:
        r.update(cpu_us=24.0, redis_cpu_us=6.5, redis_round_trips=1.002,
                 redis_calls={"evalsha": 100200, "eval": 0, "script_load": 0, "round_trips": 100200, "failed": 0})
    result["callgrind"] = {"sluice-ratelimit": {"n1": 200, "n2": 2200, "ir_n1": 1, "ir_n2": 2, "per_request": 81200},
                           "sluice-fleet": {"n1": 200, "n2": 2200, "ir_n1": 1, "ir_n2": 2, "per_request": 90000,
                                            "redis_round_trips_per_run": [214, 2230]}}
    result["targets"] = {t: {"status": "ok", "rss_idle_kib": 10240} for t in targets}
    return result


def test_fleet_shows_the_redis_round_trips_and_the_added_cpu():
    result = fleet_result()
    assert report.has_redis(result) and not report.has_redis(ratelimit_result())
    summary = report.summary_section(result)
    assert "| CPU/req 1 KiB c64 | Redis CPU/req | Redis round trips/req | idle RSS | instructions/req |" in summary
    assert "| sluice-fleet | 0.98 | 24.0 µs | 6.5 µs | 1.00 | 10.0 MiB | 90,000 |" in summary
    assert ("sluice-fleet (1 KiB c64): Redis round trips per request: 1.00 (EVALSHA + EVAL calls / requests of the "
            "median run); CPU per request 24.0 µs Sluice + 6.5 µs Redis = 30.5 µs, +10.5 µs (+52 %) over "
            "sluice-ratelimit's 20.0 µs.") in summary
    detail = report.throughput_sections(result)[0]
    assert "| proxy CPU/req | Redis CPU/req | Redis round trips/req | other load |" in detail
    assert "| sluice-fleet | 64 | 44100 | 900 µs | 3.10 ms | 0.98 | 24.0 µs | 6.5 µs | 1.00 | 0 % |" in detail
    assert "| sluice-ratelimit | 64 | 45000 | 900 µs | 3.10 ms | 1.00 | 20.0 µs | – | – | 0 % |" in detail
    assert "sluice-fleet 214 / 2,230." in report.callgrind_section(result)
    # Without a fleet target nothing about Redis appears.
    assert "Redis" not in report.summary_section(ratelimit_result())
    assert "Redis" not in report.throughput_sections(ratelimit_result())[0]


def test_fleet_chart(tmp_path):
    pytest.importorskip("matplotlib")
    result = fleet_result()
    result.update(commit={"id": "abc1234"}, started_utc="2025-01-01T00:00:00Z", machine={"cores": 2})
    result["scenario"].update(rounds=5, duration=5)
    report.chart(result, tmp_path / "fleet.png")
    assert (tmp_path / "fleet.png").stat().st_size > 0


def test_reload_soak_shows_the_reloads_and_rss_before_and_after():
    result = {"scenario": {"reload_soak": {"duration": 120, "interval": 0.5, "rate": 0, "connections": 64,
                                           "warmup": 5, "settle": 5, "sample": 5}},
              "reload_soak": {"target": "sluice-reload", "requests": 2111237, "errors": {}, "p99_us": 36512,
                              "reloads_sent": 236, "reloads_applied": 235, "rss_start_kib": 37208,
                              "rss_end_kib": 39316, "rss_growth_kib": 2108, "rss_max_kib": 44948, "fds_start": 87,
                              "fds_end": 86, "fds_max": 151, "passed": True}}
    text = report.reload_soak_section(result)
    assert "| 235 / 236 | 2,111,237 |" in text and "| 87 / 86 / 151 | pass |" in text
    assert report.reload_soak_section({"scenario": {}}) is None


def test_the_baseline_section_compares_each_target_with_its_twin(result):
    assert report.baseline_section(result) is None            # a run without --baseline
    twin = copy.deepcopy(next(c for c in result["throughput"] if c["target"] == "sluice-pipeline"))
    twin["target"] = "sluice-pipeline@base"
    twin["median"] = {**twin["median"], "rps": 40000, "cpu_us": 30.0}
    result["throughput"].append(twin)
    result["scenario"]["targets"].append("sluice-pipeline@base")
    result["targets"]["sluice-pipeline@base"] = {"status": "ok"}
    result["callgrind"]["sluice-pipeline@base"] = {"per_request": 100000}
    result["baseline"] = {"binary": "/old/sluice", "version": "0.1.0", "sha256": "0123456789abcdef",
                          "built_utc": "2026-11-26T02:00:00Z"}
    text = report.baseline_section(result)
    # 42,000 req/s at 24 µs against the baseline's 40,000 at 30 µs; 83,313 instructions against 100,000.
    assert "| sluice-pipeline | 1 KiB c64 | 40,000 → 42,000 | 1.05 | 30.0 µs → 24.0 µs | 0.80 |" in text
    assert "| sluice-pipeline | instructions per request | 100,000 → 83,313 | 0.83 |" in text
    assert "`/old/sluice`" in report.header_section(result, "x.json", None)
