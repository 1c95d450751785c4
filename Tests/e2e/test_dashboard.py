"""The admin listener's live dashboard (docs/operations.md, "Dashboard"), in a real browser:
headless Chromium (Debian's chromium + chromium-driver, driven by selenium) loads GET / with
the admin token in the URL fragment while traffic flows; the test asserts on the DOM (the
numbers change, a host row appears when a new host gets traffic), and keeps a screenshot in
test-artifacts/dashboard.png. Without the token the page asks for it and shows no data."""

from __future__ import annotations

import os
import re
import shutil
import threading
import time

import pytest

from conftest import REPO
from faultservers import HOST, pick_port
from support import session_via, wait_until

selenium = pytest.importorskip("selenium", reason="selenium (Tests/e2e/requirements.txt) is not installed")
from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

CHROMIUM = shutil.which("chromium")
DRIVER = shutil.which("chromedriver")
ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture
def browser():
    if not CHROMIUM or not DRIVER:
        pytest.skip("chromium and chromium-driver are not installed (scripts/install-deps.sh test installs them)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,900", "--no-proxy-server", "--no-first-run"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(20)
    yield driver
    driver.quit()


def text(driver, element_id: str) -> str:
    return driver.find_element(By.ID, element_id).text


def traffic(proxy_url: str, url: str, stop: threading.Event, seconds: float = 20.0) -> threading.Thread:
    def run():
        s = session_via(proxy_url)
        end = time.monotonic() + seconds
        while not stop.is_set() and time.monotonic() < end:
            try:
                s.get(url, timeout=5)
            except Exception:  # noqa: BLE001 (the load only feeds the page; the asserts are below)
                pass
            time.sleep(0.02)  # server behaviour: the background load sends a request every 20 ms or so

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


CHARTS = ["c-rate", "c-errors", "c-refusals", "c-latency", "c-cache", "c-bytes", "c-retries", "c-load"]
CHART_POINTS = ("return %s.map(id => { const c = Chart.getChart(id); "
                "return c ? Math.min(...c.data.datasets.map(d => d.data.filter(v => v !== null).length)) : -1; })" % CHARTS)
BLANK_CANVASES = ("return %s.filter(id => { const c = document.getElementById(id); const b = document.createElement('canvas'); "
                  "b.width = c.width; b.height = c.height; return c.toDataURL() === b.toDataURL(); })" % CHARTS)


@pytest.mark.deadline(90)
def test_dashboard_in_chromium_follows_traffic_with_the_token(sluice_factory, httpbin, closed_port, browser):
    token = "dash-" + os.urandom(6).hex()
    admin_port = pick_port()
    proxy = sluice_factory({"admin": {"listen": f"{HOST}:{admin_port}", "token": "${ADMIN_TOKEN}"},
                            "monitors": [{"metrics": {}}], "workers": 2, "cache_store": {"memory": "16MiB"}},
                           env={"ADMIN_TOKEN": token})
    stop = threading.Event()
    # Forwarded, cached (a hit after the first), refused by Sluice (502: the port is closed).
    loads = [traffic(proxy.url, httpbin.url + "/get", stop), traffic(proxy.url, httpbin.url + "/cache/60", stop),
             traffic(proxy.url, f"http://{HOST}:{closed_port}/", stop)]
    try:
        browser.get(f"http://{HOST}:{admin_port}/#token={token}")
        html = browser.page_source
        assert "http://" not in html.split("<body>")[0] and "<link" not in html, html[:500]
        # The one thing it loads is its charting library, from the admin listener itself.
        assert re.findall(r'src="([^"]*)"', html) == ["/dashboard/chart.js"], re.findall(r'src="([^"]*)"', html)
        assert wait_until(lambda: text(browser, "status") == "live" and int(text(browser, "ticks")) >= 2, 15), \
            (text(browser, "status"), text(browser, "ticks"))
        assert "token" not in browser.current_url, "the token stays out of the address bar"
        first_total = int(text(browser, "total"))
        assert wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, f'tr[data-host="{HOST}"]'), 10)
        assert not browser.find_elements(By.CSS_SELECTOR, 'tr[data-host="localhost"]')
        # a second host gets traffic: its row appears
        loads.append(traffic(proxy.url, f"http://localhost:{httpbin.port}/get", stop))
        assert wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, 'tr[data-host="localhost"]'), 10), \
            browser.find_element(By.ID, "hosts").get_attribute("outerHTML")
        assert wait_until(lambda: int(text(browser, "total")) > first_total + 20, 10)
        assert wait_until(lambda: text(browser, "rate") not in ("–", "0.0"), 10), text(browser, "rate")
        assert text(browser, "p50") != "–" and float(text(browser, "p50")) > 0
        assert text(browser, "generation") == "1"
        assert int(text(browser, "connections")) >= 1
        row = browser.find_element(By.CSS_SELECTOR, 'tr[data-host="localhost"]')
        assert int(row.find_elements(By.TAG_NAME, "td")[1].text) > 0
        # Every chart has drawn points: its data has them, and its canvas differs from a blank one.
        assert wait_until(lambda: min(browser.execute_script(CHART_POINTS)) >= 3, 10), browser.execute_script(CHART_POINTS)
        assert browser.execute_script(BLANK_CANVASES) == [], "charts with nothing drawn"
        # What the lines say: the refusals chart has the case that happened, the cache hits.
        kinds = browser.execute_script("return Chart.getChart('c-refusals').data.datasets.map(d => d.label)")
        assert kinds == ["upstream_refused"], kinds
        # Each line has a point per label: a kind's first point sits under its own second.
        lengths = browser.execute_script(
            "return %s.map(id => { const c = Chart.getChart(id); "
            "return [c.data.labels.length, ...c.data.datasets.map(d => d.data.length)]; })" % CHARTS)
        assert all(len(set(l)) == 1 for l in lengths), dict(zip(CHARTS, lengths))
        hits = browser.execute_script("return Chart.getChart('c-cache').data.datasets[0].data.filter(v => v !== null)")
        assert hits and max(hits) > 0, hits
        assert float(text(browser, "refusals")) > 0
        ARTIFACTS.mkdir(exist_ok=True)
        assert browser.save_screenshot(str(ARTIFACTS / "dashboard.png"))
    finally:
        stop.set()
        for t in loads:
            t.join(10)


@pytest.mark.deadline(60)
def test_dashboard_upstreams_panel_shows_an_open_circuit(sluice_factory, httpbin, closed_port, browser):
    admin_port = pick_port()
    proxy = sluice_factory({"admin": {"listen": f"{HOST}:{admin_port}"}, "monitors": [{"metrics": {}}],
                            "policies": {HOST: {"health": {"consecutive_failures": 2, "cooldown": "60s"}}}})
    browser.get(f"http://{HOST}:{admin_port}/")
    assert wait_until(lambda: text(browser, "status") == "live", 10), text(browser, "status")
    assert not browser.find_element(By.ID, "upstreamstable").is_displayed()
    s = session_via(proxy.url)
    assert s.get(httpbin.url + "/get", timeout=10).status_code == 200
    for _ in range(2):
        assert s.get(f"http://{HOST}:{closed_port}/", timeout=10).status_code == 502  # refused twice: it opens
    assert s.get(f"http://{HOST}:{closed_port}/", timeout=10).status_code == 503      # then fails fast
    down = f'tr[data-origin="http://{HOST}:{closed_port}"]'
    assert wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, down), 10), \
        browser.find_element(By.ID, "upstreams").get_attribute("outerHTML")
    cells = [c.text for c in browser.find_element(By.CSS_SELECTOR, down).find_elements(By.TAG_NAME, "td")]
    assert cells[1] == "open" and cells[2].endswith(" of 2") and cells[3].endswith("s ago") and cells[5] == "1", cells
    healthy = f'tr[data-origin="http://{HOST}:{httpbin.port}"]'
    assert browser.find_element(By.CSS_SELECTOR, healthy).find_elements(By.TAG_NAME, "td")[1].text == "closed"
    ARTIFACTS.mkdir(exist_ok=True)
    assert browser.save_screenshot(str(ARTIFACTS / "dashboard-upstreams.png"))


def test_dashboard_without_the_token_asks_for_it(sluice_factory, browser):
    admin_port = pick_port()
    sluice_factory({"admin": {"listen": f"{HOST}:{admin_port}", "token": "${ADMIN_TOKEN}"}},
                   env={"ADMIN_TOKEN": "secret-" + os.urandom(4).hex()})
    browser.get(f"http://{HOST}:{admin_port}/")
    assert wait_until(lambda: text(browser, "status") == "token needed", 10), text(browser, "status")
    assert browser.find_element(By.ID, "login").is_displayed()
    assert text(browser, "total") == "–" and text(browser, "ticks") == "0"


HOST_CHARTS = ["c-host-rate", "c-host-latency", "c-host-bytes"]


@pytest.mark.deadline(90)
def test_dashboard_host_click_shows_that_host(sluice_factory, httpbin, browser):
    """A click on a host's row opens its page: its charts, its policy as `sluice check --host`
    describes it, and its failed exchanges with their case; another host's click shows that
    one instead."""
    admin_port = pick_port()
    proxy = sluice_factory({"admin": {"listen": f"{HOST}:{admin_port}"}, "monitors": [{"metrics": {}}],
                            "policies": {"localhost": {"adapters": [{"headers": {"set": {"X-Dashboard": "yes"}}}]}},
                            "access": {"deny": ["127.0.0.9/32"]}})
    stop = threading.Event()
    loads = [traffic(proxy.url, httpbin.url + "/get", stop),
             traffic(proxy.url, f"http://localhost:{httpbin.port}/status/503", stop)]
    s = session_via(proxy.url)
    for _ in range(3):
        assert s.get("http://127.0.0.9/x?token=secret", timeout=10).status_code == 403  # access.deny: Sluice's own
    try:
        browser.get(f"http://{HOST}:{admin_port}/")
        assert wait_until(lambda: text(browser, "status") == "live", 10), text(browser, "status")
        row = 'tr[data-host="localhost"]'
        assert wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, row), 10)
        assert not browser.find_element(By.ID, "hostpanel").is_displayed()
        browser.find_element(By.CSS_SELECTOR, row).click()
        panel = browser.find_element(By.ID, "hostpanel")
        assert wait_until(lambda: panel.get_attribute("data-loaded") == "localhost", 10)
        assert text(browser, "hostname") == "localhost"
        policy = text(browser, "hostpolicy")
        assert policy.startswith("policy for localhost: localhost") and "X-Dashboard" in policy, policy
        # Read in one script: the panel's rows are replaced every 2 s.
        failures = lambda: browser.execute_script(  # noqa: E731
            "return [...document.querySelectorAll('#hostfailures tr')].map(r => [...r.cells].map(c => c.textContent))")
        assert wait_until(lambda: len(failures()) >= 2, 10), failures()
        assert all(f[3] == "503" and f[4] == "origin_5xx" and f[2].endswith("/status/503") for f in failures()), failures()
        # Its charts have the host's seconds: requests and errors in the last one drawn.
        points = ("const c = Chart.getChart('c-host-rate'); "
                  "return [c.data.labels.length, ...c.data.datasets.map(d => d.data.reduce((a, b) => a + b, 0))]")
        assert wait_until(lambda: min(browser.execute_script(points)) > 0 and browser.execute_script(points)[0] >= 3, 10), \
            browser.execute_script(points)
        assert browser.execute_script(BLANK_CANVASES.replace(str(CHARTS), str(HOST_CHARTS))) == []
        browser.execute_script("arguments[0].scrollIntoView()", panel)
        ARTIFACTS.mkdir(exist_ok=True)
        assert browser.save_screenshot(str(ARTIFACTS / "dashboard-host.png"))
        # The denied destination's row: Sluice's own refusal, its case, the query left out.
        denied = 'tr[data-host="127.0.0.9"]'
        assert wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, denied), 10)
        browser.find_element(By.CSS_SELECTOR, denied).click()
        assert wait_until(lambda: panel.get_attribute("data-loaded") == "127.0.0.9", 10)
        assert text(browser, "hostpolicy").startswith("policy for 127.0.0.9: default")
        rows = failures()
        assert len(rows) == 3 and all(r[3] == "403" and r[4] == "destination_denied" for r in rows), rows
        assert all(r[2] == "http://127.0.0.9/x?…" and "secret" not in r[2] for r in rows), rows
        assert "denied by access.deny" in rows[0][5]
        browser.find_element(By.ID, "hostclose").click()
        assert not panel.is_displayed()
    finally:
        stop.set()
        for t in loads:
            t.join(10)
