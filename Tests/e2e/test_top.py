"""`sluice top` (docs/operations.md): a running Sluice's numbers in a terminal, as an operator
would see them over ssh — tested in a real terminal (tmux: send-keys, capture-pane).

The admin listener has a token; `top` reads it from SLUICE_ADMIN_TOKEN or --token-file. Two
hosts get traffic at different rates, and the screen must list the busier one first, with
the totals the proxy served; `q` must end it and give the terminal back.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
import uuid

import pytest
import requests

from conftest import SLUICE_BIN
from faultservers import pick_port
from support import HOST, wait_until

TOKEN = "top-e2e-token-0123456789"

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


# A tmux server of the tests' own (-L), so that nothing of the user's sessions is touched.
SOCKET = "sluice-e2e-top-" + uuid.uuid4().hex[:8]


def tmux(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["tmux", "-L", SOCKET, *args], capture_output=True, text=True, timeout=10, check=check)


@pytest.fixture
def session():
    name = "sluice-top-" + uuid.uuid4().hex[:8]
    yield name
    tmux("kill-session", "-t", name, check=False)
    if tmux("list-sessions", check=False).returncode != 0:
        tmux("kill-server", check=False)


def pane(name: str) -> str:
    return tmux("capture-pane", "-p", "-t", name).stdout


def proxy_with_admin(sluice_factory, nginx):
    admin = pick_port()
    proxy = sluice_factory({"monitors": [{"metrics": {}}],
                            "admin": {"listen": f"{HOST}:{admin}", "token": TOKEN}})
    return proxy, admin


def traffic(proxy, url: str, n: int):
    with requests.Session() as s:
        for _ in range(n):
            assert s.get(url, proxies={"http": proxy.url}, timeout=10).status_code == 200


def test_top_shows_hosts_busiest_first_and_quits_on_q(sluice_factory, nginx, session, tmp_path):
    proxy, admin = proxy_with_admin(sluice_factory, nginx)
    busy, quiet = f"http://{HOST}:{nginx.http_port}/1k", f"http://localhost:{nginx.http_port}/1k"
    traffic(proxy, quiet, 3)
    traffic(proxy, busy, 2)
    tmux("new-session", "-d", "-s", session, "-x", "120", "-y", "30",
         "-e", f"SLUICE_ADMIN_TOKEN={TOKEN}", f"{SLUICE_BIN} top --admin {HOST}:{admin}")
    assert wait_until(lambda: "sluice top" in pane(session), 10), pane(session)
    # Keep one host busy while the other stays quiet: after a refresh, the busy one leads.
    stop = threading.Event()

    def load():
        with requests.Session() as s:
            while not stop.is_set():
                s.get(busy, proxies={"http": proxy.url}, timeout=10)
                time.sleep(0.02)  # time passing: a steady rate of about 50 requests/s, bounded by stop
    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    try:
        def busy_first() -> bool:
            rows = [r for r in (line.split() for line in pane(session).splitlines())
                    if r and r[0] in (HOST, "localhost")]
            try:  # a pane caught mid-redraw is simply not it yet
                return [r[0] for r in rows] == [HOST, "localhost"] and float(rows[0][1]) > 5
            except (IndexError, ValueError):
                return False
        assert wait_until(busy_first, 10), pane(session)
    finally:
        stop.set()
        worker.join(5)
    screen = pane(session)
    assert f"sluice top — {HOST}:{admin} — generation 1" in screen, screen
    assert "req/s" in screen and "upstream ms: p50" in screen and "HOST" in screen and "REQ/S" in screen
    quiet_row = next(line.split() for line in screen.splitlines() if line.startswith("localhost"))
    assert quiet_row[2] == "3", quiet_row  # its total: the 3 requests it got
    tmux("send-keys", "-t", session, "q")
    assert wait_until(lambda: tmux("has-session", "-t", session, check=False).returncode != 0, 5), \
        "sluice top did not quit on q"


def test_top_without_the_token_says_so(sluice_factory, nginx, session):
    proxy, admin = proxy_with_admin(sluice_factory, nginx)
    env = {k: v for k, v in os.environ.items() if k != "SLUICE_ADMIN_TOKEN"}
    r = subprocess.run([SLUICE_BIN, "top", "--admin", f"{HOST}:{admin}", "--once"], capture_output=True, text=True,
                       timeout=20, env=env, stdin=subprocess.DEVNULL)
    assert r.returncode == 1 and "refused the token" in r.stderr and "SLUICE_ADMIN_TOKEN" in r.stderr, r


def test_top_once_with_a_token_file(sluice_factory, nginx, tmp_path):
    proxy, admin = proxy_with_admin(sluice_factory, nginx)
    traffic(proxy, f"http://{HOST}:{nginx.http_port}/1k", 4)
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    r = subprocess.run([SLUICE_BIN, "top", "--admin", f"{HOST}:{admin}", "--token-file", str(token), "--once",
                        "--interval", "0.2"], capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    row = next(line.split() for line in r.stdout.splitlines() if line.split()[:1] == [HOST])
    assert row[2] == "4", r.stdout  # REQUESTS
    assert "\x1b[" not in r.stdout  # no terminal control codes when printing once


def test_top_keeps_trying_an_admin_that_is_not_there(session):
    port = pick_port()
    tmux("new-session", "-d", "-s", session, "-x", "100", "-y", "10", f"{SLUICE_BIN} top --admin {HOST}:{port}")
    assert wait_until(lambda: "cannot read" in pane(session) and "retrying" in pane(session), 10), pane(session)
    tmux("send-keys", "-t", session, "q")
    assert wait_until(lambda: tmux("has-session", "-t", session, check=False).returncode != 0, 5)
