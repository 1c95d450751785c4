"""The dashboard's host page lists a host's last lua script errors (docs/scripting.md,
"Errors"), in headless Chromium as test_dashboard.py drives it: time, script, hook, the
script's message and the request id; the table stays hidden for a host without any."""

import re

import pytest

from faultservers import HOST, pick_port
from support import session_via, wait_until

pytest.importorskip("selenium", reason="selenium (Tests/e2e/requirements.txt) is not installed")
from selenium.webdriver.common.by import By  # noqa: E402

from test_dashboard import browser, text  # noqa: E402,F401 (the fixture)


@pytest.mark.deadline(90)
def test_the_host_page_shows_the_last_script_errors(sluice_factory, recorder, browser):  # noqa: F811
    admin_port = pick_port()
    source = 'return { on_request = function(req) if req.path == "/boom" then error("boom " .. req.path) end end }'
    proxy = sluice_factory({"admin": {"listen": f"{HOST}:{admin_port}"}, "monitors": [{"metrics": {}}],
                            "policies": {HOST: {"adapters": [{"lua": {"source": source}}]}}})
    s = session_via(proxy.url)
    answers = [s.get(f"http://{HOST}:{recorder.port}/boom", timeout=10) for _ in range(3)]
    assert [r.status_code for r in answers] == [502] * 3
    assert s.get(f"http://localhost:{recorder.port}/fine", timeout=10).status_code == 200
    browser.get(f"http://{HOST}:{admin_port}/")
    assert wait_until(lambda: text(browser, "status") == "live", 10), text(browser, "status")
    rows = 'tr[data-host="%s"]'
    panel = browser.find_element(By.ID, "hostpanel")
    assert wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, rows % HOST), 10)
    browser.find_element(By.CSS_SELECTOR, rows % HOST).click()
    assert wait_until(lambda: panel.get_attribute("data-loaded") == HOST, 10)
    # Read in one script: the panel's rows are replaced every 2 s.
    cells = ("return [...document.querySelectorAll('#hostscripterrors tr')]"
             ".map(r => [...r.cells].map(c => c.textContent))")
    assert wait_until(lambda: len(browser.execute_script(cells)) == 3, 10), browser.execute_script(cells)
    listed = browser.execute_script(cells)
    assert all(row[1:4] == ["source.lua", "on_request", "source.lua:1: boom /boom"] for row in listed), listed
    # The request ids the 502s named (never the script's message).
    assert {row[4] for row in listed} == {re.search(r"on request (\d+) ", r.text)[1] for r in answers}, listed
    assert browser.find_element(By.ID, "hostscripterrorstable").is_displayed()
    # A host without a script: no table.
    assert wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, rows % "localhost"), 10)
    browser.find_element(By.CSS_SELECTOR, rows % "localhost").click()
    assert wait_until(lambda: panel.get_attribute("data-loaded") == "localhost", 10)
    assert not browser.find_element(By.ID, "hostscripterrorstable").is_displayed()
