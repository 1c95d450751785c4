"""BENCHMARKS.md's tables and the chart from a small sample result file."""

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
    assert "| direct | 1000 | 1.00 | ok | – | 0 % |  |" in text
    assert "| sluice-pipeline | 85,250,666 | 251,876,490 | 83,313 |" in text


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
