"""docs/monitoring/ with Debian's Prometheus: the alert rules pass `promtool check rules` and
their own `promtool test rules`; a running Sluice's /metrics passes `promtool check metrics`;
and a real Prometheus (on loopback, its own storage) scrapes a running Sluice and answers a
query about the traffic that went through it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import requests

from conftest import spawn, stop_process, wait_port
from faultservers import pick_port
from support import HOST, wait_until

MONITORING = Path(__file__).resolve().parents[2] / "docs" / "monitoring"

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None or shutil.which("prometheus") is None,
                                reason="Debian's prometheus package (scripts/install-deps.sh test) is not installed")


def promtool(*args: str, cwd: Path = MONITORING, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], cwd=cwd, input=stdin, capture_output=True, timeout=60)


def test_alert_rules_are_valid_and_their_tests_pass():
    r = promtool("check", "rules", "sluice-alerts.yml")
    assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()
    assert b"SUCCESS: 6 rules found" in r.stdout, r.stdout
    r = promtool("test", "rules", "sluice-alerts.test.yml")
    assert r.returncode == 0 and b"SUCCESS" in r.stdout, r.stdout.decode() + r.stderr.decode()


def test_rule_tests_can_fail(tmp_path):
    """The rule tests see a threshold: raised tenfold, the error-rate alert no longer fires
    and `promtool test rules` says so."""
    for name in ("sluice-alerts.yml", "sluice-alerts.test.yml"):
        shutil.copy(MONITORING / name, tmp_path / name)
    rules = tmp_path / "sluice-alerts.yml"
    rules.write_text(rules.read_text().replace("> 0.05", "> 0.5", 1))
    r = promtool("test", "rules", "sluice-alerts.test.yml", cwd=tmp_path)
    assert r.returncode != 0 and b"SluiceErrorRateHigh" in r.stdout + r.stderr, r.stdout


def dashboard_queries() -> list[str]:
    dash = json.loads((MONITORING / "sluice-grafana.json").read_text())
    return [t["expr"].replace("$__rate_interval", "10s").replace('=~"$instance"', '=~".*"')
            for p in dash["panels"] for t in p["targets"]]


def test_dashboard_and_rules_name_only_documented_metrics():
    documented = set(re.findall(r"^\| `(sluice_[a-z_]+)`", (MONITORING.parent / "metrics.md").read_text(), re.M))
    text = "\n".join(dashboard_queries()) + (MONITORING / "sluice-alerts.yml").read_text()
    used = {re.sub(r"_(bucket|sum|count)$", "", m) for m in re.findall(r"\b(sluice_[a-z_]+)", text)}
    assert used and used <= documented, used - documented


# A script on every request, so that the lua families (calls, durations, a script's own
# counter) are in the scrape too.
COUNTING = 'local seen = sluice.metric("seen") return { on_request = function(req) seen:inc() end }'


def metrics_proxy(sluice_factory, nginx):
    admin = pick_port()
    proxy = sluice_factory({"monitors": [{"metrics": {}}], "admin": {"listen": f"{HOST}:{admin}"},
                            "policies": {"default": {"adapters": [{"lua": {"source": COUNTING}}]}}})
    with requests.Session() as s:
        for i in range(5):
            assert s.get(nginx.url(f"/1k?n={i}"), proxies={"http": proxy.url}, timeout=10).status_code == 200
    return proxy, admin


def test_metrics_pass_promtool_check_metrics(sluice_factory, nginx):
    _, admin = metrics_proxy(sluice_factory, nginx)
    text = requests.get(f"http://{HOST}:{admin}/metrics", timeout=5).content
    assert b'sluice_lua_metric_total{script="source.lua",name="seen"} 5' in text, text
    r = promtool("check", "metrics", stdin=text)
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), r.stdout.decode() + r.stderr.decode()


def test_prometheus_scrapes_sluice_and_answers_a_query(sluice_factory, nginx, tmp_path):
    proxy, admin = metrics_proxy(sluice_factory, nginx)
    port = pick_port()
    (tmp_path / "prometheus.yml").write_text(
        "global: { scrape_interval: 1s, evaluation_interval: 1s }\n"
        f"rule_files: [{MONITORING / 'sluice-alerts.yml'}]\n"
        "scrape_configs:\n"
        f"  - job_name: sluice\n    static_configs: [{{ targets: ['{HOST}:{admin}'] }}]\n")
    log = open(tmp_path / "prometheus.log", "wb")
    proc = spawn(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                  f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address={HOST}:{port}"],
                 stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    try:
        wait_port(port, 30, proc)
        # Prometheus listens before its storage is open, and answers 503 until then.

        def ready() -> bool:
            try:
                return requests.get(f"http://{HOST}:{port}/-/ready", timeout=5).status_code == 200
            except requests.RequestException:
                return False
        assert wait_until(ready, 30), (tmp_path / "prometheus.log").read_text()[-2000:]
        api = f"http://{HOST}:{port}/api/v1"

        def query(q: str) -> list:
            r = requests.get(f"{api}/query", params={"query": q}, timeout=5).json()
            assert r["status"] == "success", r
            return r["data"]["result"]

        # The target is up, and the 5 requests made before the first scrape are in the series.
        q = 'sum(sluice_requests_total{job="sluice",status_class="2xx"})'
        assert wait_until(lambda: query(q) and float(query(q)[0]["value"][1]) == 5, 20), \
            f"{query(q)}\n{(tmp_path / 'prometheus.log').read_text()[-2000:]}"
        # More traffic over a few scrapes: the rate Prometheus computes is above zero.
        with requests.Session() as s:
            for i in range(40):
                assert s.get(nginx.url(f"/1k?m={i}"), proxies={"http": proxy.url}, timeout=10).status_code == 200
                time.sleep(0.1)  # time passing: the requests spread over several 1 s scrapes
        q = 'sum(rate(sluice_requests_total{job="sluice",status_class="2xx"}[10s]))'
        assert wait_until(lambda: query(q) and float(query(q)[0]["value"][1]) > 0, 15), query(q)
        assert wait_until(
            lambda: float(query('sum(sluice_requests_total{job="sluice",status_class="2xx"})')[0]["value"][1]) == 45,
            15)
        # Every chart of the Grafana dashboard is a query Prometheus accepts.
        for expr in dashboard_queries():
            r = requests.get(f"{api}/query", params={"query": expr}, timeout=5).json()
            assert r["status"] == "success", (expr, r)
        # The rules loaded, and none fires on this healthy instance.
        rules = requests.get(f"{api}/rules", timeout=5).json()["data"]["groups"]
        assert {r["name"] for g in rules for r in g["rules"]} >= {"SluiceErrorRateHigh", "SluiceReloadFailed"}
        assert requests.get(f"{api}/alerts", timeout=5).json()["data"]["alerts"] == []
    finally:
        stop_process(proc)
        log.close()
