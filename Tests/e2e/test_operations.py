"""Running Sluice as a service (docs/operations.md): the systemd unit in systemd/ passes
`systemd-analyze verify`, and its security exposure is what the docs record; `sluice run`
speaks systemd's notification protocol to a NOTIFY_SOCKET that the test owns, with the exact
messages for start, reload (a good and a bad file), status and stop; the watchdog pings
only while every worker's event loop checks in (one stopped worker thread withholds it);
SIGUSR1 reopens the access log so a log moved under load loses no line."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO, SLUICE_BIN
from faultservers import HOST, pick_port
from policy_support import AccessLog, monitors, stderr_len, stderr_since, write_config_text
from support import port_open, session_via, wait_until

UNIT = REPO / "systemd" / "sluice.service"


class NotifySocket:
    """A datagram socket standing in for systemd's: records every message with its arrival
    time; `on_message` runs in the reader thread as each one arrives."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="sluice-notify-", dir="/tmp")  # sun_path is 108 bytes
        self.path = os.path.join(self.dir, "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, str]] = []
        self.lock = threading.Lock()
        self.on_message = None
        self.closed = False
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        while not self.closed:
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                continue
            except OSError:
                return
            text = data.decode()
            if self.on_message:
                self.on_message(text)
            with self.lock:
                self.messages.append((time.monotonic(), text))

    def all(self) -> list[str]:
        with self.lock:
            return [m for _, m in self.messages]

    def since(self, t: float) -> list[str]:
        with self.lock:
            return [m for at, m in self.messages if at >= t]

    def lifecycle(self) -> list[str]:
        """Every message but the periodic ones (WATCHDOG=1 and STATUS= updates)."""
        return [m for m in self.all() if not m.startswith(("WATCHDOG=1", "STATUS="))]

    def wait_for(self, pred, timeout: float = 10.0, what: str = "message") -> str:
        found: list[str] = []

        def ok():
            found[:] = [m for m in self.all() if pred(m)]
            return bool(found)

        assert wait_until(ok, timeout, 0.02), f"no {what} within {timeout}s; got {self.all()}"
        return found[0]

    def close(self):
        self.closed = True
        self.sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def notify():
    n = NotifySocket()
    yield n
    n.close()


def monotonic_usec() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


# ------------------------------------------------------------------------------------------
# the unit file
# ------------------------------------------------------------------------------------------

def unit_with_binary(tmp_path: Path) -> Path:
    """The unit with /usr/local/bin/sluice replaced by the binary under test (verify checks
    that every Exec path exists and is executable)."""
    out = tmp_path / "sluice.service"
    out.write_text(UNIT.read_text().replace("/usr/local/bin/sluice", SLUICE_BIN))
    return out


def test_unit_passes_systemd_analyze_verify(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    unit = unit_with_binary(tmp_path)
    p = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    # verify also reports on the system's own units (those this one names, like
    # network-online.target): only lines about this unit count.
    ours = [line for line in (p.stdout + p.stderr).splitlines() if "sluice.service" in line]
    assert ours == [], "\n".join(ours)
    text = UNIT.read_text()
    for line in ("Type=notify", "NotifyAccess=main", "WatchdogSec=30s",
                 "ExecReload=/usr/local/bin/sluice check --config /etc/sluice/sluice.yaml",
                 "ExecReload=/bin/kill -HUP $MAINPID"):
        assert f"\n{line}\n" in text, f"{line!r} missing from {UNIT}"
    # the check comes before the signal: a bad file fails `systemctl reload` and is never read
    assert text.index("ExecReload=/usr/local/bin/sluice check") < text.index("ExecReload=/bin/kill")


def test_unit_security_exposure_is_the_one_documented(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    unit = unit_with_binary(tmp_path)
    p = subprocess.run(["systemd-analyze", "security", "--offline=true", "--no-pager", str(unit)],
                       capture_output=True, text=True, timeout=60)
    m = re.search(r"Overall exposure level for sluice\.service: (\d+\.\d+) (\w+)", p.stdout + p.stderr)
    assert m, p.stdout[-2000:] + p.stderr[-2000:]
    score, verdict = float(m.group(1)), m.group(2)
    assert verdict == "OK" and score < 2.0, f"exposure {score} {verdict}"
    doc = (REPO / "docs" / "operations.md").read_text()
    assert f"{m.group(1)} {verdict}" in doc, f"docs/operations.md must record the score {m.group(1)} {verdict}"


# ------------------------------------------------------------------------------------------
# sd_notify: the message sequence
# ------------------------------------------------------------------------------------------

def test_notify_sequence_for_start_status_reload_and_stop(sluice_factory, notify, httpbin):
    route_port, second_port = pick_port(), pick_port()
    main_port = pick_port()
    ports = [main_port, second_port, route_port]
    bound_at_ready: list[list[bool]] = []

    def on_message(text):
        if text.startswith("READY=1") and not bound_at_ready:
            bound_at_ready.append([port_open(p) for p in ports])

    notify.on_message = on_message
    proxy = sluice_factory({"listen": [f"{HOST}:{main_port}", f"{HOST}:{second_port}"],
                            "routes": [{"listen": f"{HOST}:{route_port}", "upstream": httpbin.url}],
                            "workers": 2},
                           env={"NOTIFY_SOCKET": notify.path})
    notify.wait_for(lambda m: m.startswith("READY=1"), what="READY=1")
    assert bound_at_ready == [[True, True, True]], \
        f"READY=1 must come once every listener accepts: {bound_at_ready}"

    # STATUS= follows the workers' counts (one request held in flight by a slow upstream)
    t = threading.Thread(target=lambda: session_via(proxy.url).get(httpbin.url + "/delay/3", timeout=20))
    t.start()
    notify.wait_for(lambda m: "requests in flight: 1," in m, timeout=8, what="STATUS with one request in flight")
    t.join()
    notify.wait_for(lambda m: "requests in flight: 0," in m and "generation 1" in m, timeout=8,
                    what="STATUS back to zero")

    # a good reload
    cfg = yaml.safe_load(proxy.config_path.read_text())
    cfg["policies"] = {"default": {"adapters": [{"headers": {"set": {"X-Gen": "2"}}}]}}
    write_config_text(proxy, yaml.safe_dump(cfg))
    before = monotonic_usec()
    os.kill(proxy.pid, signal.SIGHUP)
    notify.wait_for(lambda m: "generation 2" in m and m.startswith("READY=1"), what="READY=1 after reload")
    after = monotonic_usec()

    # a bad reload: the running configuration stays, and systemd hears READY=1 again
    offset = stderr_len(proxy)
    write_config_text(proxy, "listen: [\n  - 127.0.0.1:1\n policies: {\n")
    os.kill(proxy.pid, signal.SIGHUP)
    notify.wait_for(lambda m: "reload failed" in m and m.startswith("READY=1"), what="READY=1 after a bad reload")
    assert re.search(r"reload failed.*:\d+:\d+", stderr_since(proxy, offset)), stderr_since(proxy, offset)
    r = session_via(proxy.url).get(httpbin.url + "/headers", timeout=10)
    assert r.json()["headers"].get("X-Gen") == "2", "the bad file must not replace the good one"

    proxy.signal(signal.SIGTERM)
    assert proxy.wait(15) == 0
    proxy.expected_exit = True
    # the datagram was sent before the exit, but the test's reader thread may not have taken
    # it yet on a loaded machine
    notify.wait_for(lambda m: m.startswith("STOPPING=1"), timeout=5, what="STOPPING=1")

    path = str(proxy.config_path)
    expected = [
        r"READY=1\nSTATUS=serving: configuration generation 1",
        r"RELOADING=1\nMONOTONIC_USEC=(\d+)\nSTATUS=reloading " + re.escape(path),
        r"READY=1\nSTATUS=serving: configuration generation 2",
        r"RELOADING=1\nMONOTONIC_USEC=(\d+)\nSTATUS=reloading " + re.escape(path),
        r"READY=1\nSTATUS=the last reload failed \(see the log\); serving: configuration generation 2",
        r"STOPPING=1\nSTATUS=draining \(up to 5000 ms\)",
    ]
    got = notify.lifecycle()
    assert len(got) == len(expected), f"expected {len(expected)} lifecycle messages, got:\n{got}"
    for pattern, message in zip(expected, got):
        assert re.fullmatch(pattern, message), f"{message!r} does not match {pattern!r}"
    stamp = int(re.fullmatch(expected[1], got[1]).group(1))
    assert before <= stamp <= after, f"MONOTONIC_USEC {stamp} outside [{before}, {after}]"
    # no watchdog was asked for, so none is sent
    assert not any(m.startswith("WATCHDOG=1") for m in notify.all()), notify.all()
    # periodic STATUS lines carry the counts and nothing else
    for m in notify.all():
        if m.startswith("STATUS="):
            assert re.fullmatch(r"STATUS=(the last reload failed \(see the log\); )?serving: configuration "
                                r"generation \d+, requests in flight: \d+, client connections: \d+", m), m


def test_without_notify_socket_nothing_is_sent(sluice_factory, notify, httpbin):
    """No NOTIFY_SOCKET, no messages (and no heartbeat timers in the workers)."""
    proxy = sluice_factory()
    assert session_via(proxy.url).get(httpbin.url + "/get", timeout=10).status_code == 200
    os.kill(proxy.pid, signal.SIGHUP)
    # (neither the reload's RELOADING/READY nor a periodic STATUS, which would come every second)
    time.sleep(1.5)  # window: nothing may reach the notify socket
    assert notify.all() == []


# ------------------------------------------------------------------------------------------
# the watchdog
# ------------------------------------------------------------------------------------------

PTRACE_DETACH, PTRACE_SEIZE, PTRACE_INTERRUPT = 17, 0x4206, 0x4207
WALL = 0x40000000


class StoppedThread:
    """Stops one thread of another process (PTRACE_SEIZE + PTRACE_INTERRUPT: the other
    threads run on), as a worker stuck in a loop would be, until `resume()`."""

    def __init__(self, tid: int):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
        self.libc.ptrace.restype = ctypes.c_long
        self.tid = tid
        if self.libc.ptrace(PTRACE_SEIZE, tid, None, None) != 0:
            err = ctypes.get_errno()
            pytest.skip(f"ptrace is not permitted here ({os.strerror(err)}): cannot stop one worker thread")
        assert self.libc.ptrace(PTRACE_INTERRUPT, tid, None, None) == 0, os.strerror(ctypes.get_errno())
        pid, status = os.waitpid(tid, WALL)
        assert pid == tid and os.WIFSTOPPED(status), status
        self.attached = True

    def resume(self):
        if self.attached:
            assert self.libc.ptrace(PTRACE_DETACH, self.tid, None, None) == 0, os.strerror(ctypes.get_errno())
            self.attached = False


def served_within(proxy_url: str, url: str, seconds: float) -> bool:
    try:
        return session_via(proxy_url).get(url, timeout=seconds).status_code == 200
    except Exception:  # noqa: BLE001 (a connection queued for the stopped worker times out)
        return False


def worker_tids(pid: int) -> dict[str, int]:
    out = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        name = Path(f"/proc/{pid}/task/{task}/comm").read_text().strip()
        if name.startswith("sluice-w"):
            out[name] = int(task)
    return out


@pytest.mark.deadline(60)
def test_watchdog_pings_only_while_every_worker_checks_in(sluice_factory, notify, httpbin):
    watchdog_usec = 400_000  # a ping every 200 ms
    proxy = sluice_factory({"workers": 2},
                           env={"NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": str(watchdog_usec)})
    notify.wait_for(lambda m: m.startswith("READY=1"), what="READY=1")
    tids = worker_tids(proxy.pid)
    assert sorted(tids) == ["sluice-w0", "sluice-w1"], tids

    t0 = time.monotonic()
    time.sleep(1.5)  # time passing: pings are counted over 1.5 s
    pings = [m for m in notify.since(t0) if m.startswith("WATCHDOG=1")]
    assert 5 <= len(pings) <= 9, f"{len(pings)} pings in 1.5 s at a 200 ms interval"

    offset = stderr_len(proxy)
    stuck = StoppedThread(tids["sluice-w1"])
    try:
        # a ping decided before the stop may still arrive; after that, none
        time.sleep(0.5)  # time passing: more than a ping interval, for a ping decided before the stop
        t1 = time.monotonic()
        time.sleep(1.5)  # window: no WATCHDOG=1 may be sent while worker 1 is stopped
        late = [m for m in notify.since(t1) if m.startswith("WATCHDOG=1")]
        assert late == [], f"the watchdog was pinged with worker 1 stopped: {late}"
        assert wait_until(lambda: "worker(s) 1 did not check in" in stderr_since(proxy, offset), 3), \
            stderr_since(proxy, offset)
        # the other worker still serves: of a few new connections (the kernel spreads them
        # over both workers' listening sockets), those that reach worker 0 are answered
        assert any(served_within(proxy.url, httpbin.url + "/get", 2) for _ in range(8)), \
            "no connection was answered while only worker 1 was stopped"
    finally:
        stuck.resume()
    t2 = time.monotonic()
    notify.wait_for(lambda m: m.startswith("WATCHDOG=1") and m in notify.since(t2), timeout=3,
                    what="a ping once worker 1 runs again")
    assert wait_until(lambda: "every worker checks in again" in stderr_since(proxy, offset), 3)


# ------------------------------------------------------------------------------------------
# SIGUSR1: reopen the access log
# ------------------------------------------------------------------------------------------

@pytest.mark.deadline(90)
def test_sigusr1_reopens_the_access_log_and_a_rotation_under_load_loses_nothing(sluice_factory, httpbin, tmp_path):
    log = tmp_path / "access.log"
    proxy = sluice_factory({"monitors": monitors(access=log), "workers": 2})
    total = 600
    done = []
    errors = []

    def client(k: int):
        s = session_via(proxy.url)
        for i in range(total // 4):
            try:
                r = s.get(f"{httpbin.url}/get?c={k}&i={i}", timeout=10)
                if r.status_code != 200:
                    errors.append(r.status_code)
                done.append(1)
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    assert wait_until(lambda: len(done) >= total // 3, 30), len(done)
    rotated = tmp_path / "access.log.1"
    os.rename(log, rotated)                # logrotate's move
    offset = stderr_len(proxy)
    proxy.signal(signal.SIGUSR1)            # its postrotate
    for t in threads:
        t.join(60)
    assert errors == [] and len(done) == total, (errors[:5], len(done))
    assert wait_until(lambda: "reopened 1 log file(s)" in stderr_since(proxy, offset), 5), stderr_since(proxy, offset)
    assert wait_until(lambda: log.exists() and log.stat().st_size > 0, 5), "the reopened log got no line"

    def entries():
        lines = [*AccessLog(rotated).lines(), *AccessLog(log).lines()]
        return [e for e in lines if "/get?c=" in e.get("url", "")]

    assert wait_until(lambda: len(entries()) == total, 5), f"{len(entries())} of {total} lines"
    got = entries()
    assert len({e["url"] for e in got}) == total, "a request was logged twice or not at all"
    assert len(AccessLog(rotated).lines()) > 0 and len(AccessLog(log).lines()) > 0
    # every line is whole JSON in either file (AccessLog.lines parses each)


# ------------------------------------------------------------------------------------------
# diagnostics: log_format, log_level
# ------------------------------------------------------------------------------------------

def test_log_format_json_and_log_level_apply_at_start_and_reload(sluice_factory, httpbin):
    import json as jsonlib
    proxy = sluice_factory({"log_format": "json", "log_level": "info"})
    assert wait_until(lambda: "listening on" in proxy.stderr(), 5)
    lines = [l for l in proxy.stderr().splitlines() if l.strip()]
    for line in lines:
        entry = jsonlib.loads(line)  # every diagnostic line is one JSON object
        assert set(entry) >= {"time", "level", "pid", "message"}, entry
        assert entry["pid"] == proxy.pid and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", entry["time"])
    assert any(jsonlib.loads(l)["message"].startswith("listening on") and jsonlib.loads(l)["level"] == "info"
               for l in lines)
    # back to text, and warnings only: the reload's own info line is no longer written
    # (the X-Gen header shows, through httpbin, when the workers serve the reloaded file; the
    # server's log settings are applied before the workers are told)
    cfg = yaml.safe_load(proxy.config_path.read_text())
    cfg.update({"log_format": "text", "log_level": "warning"})
    cfg.setdefault("policies", {}).setdefault("default", {})["adapters"] = [{"headers": {"set": {"X-Gen": "text"}}}]
    write_config_text(proxy, yaml.safe_dump(cfg))
    offset = stderr_len(proxy)
    os.kill(proxy.pid, signal.SIGHUP)

    def gen() -> str | None:
        return session_via(proxy.url).get(httpbin.url + "/headers", timeout=10).json()["headers"].get("X-Gen")

    assert wait_until(lambda: gen() == "text", 10), f"the reload was not applied\n{stderr_since(proxy, offset)}"
    # a bad file: its error is written, as text
    write_config_text(proxy, yaml.safe_dump(dict(cfg, log_level="loud")))
    os.kill(proxy.pid, signal.SIGHUP)
    assert wait_until(lambda: "log_level must be debug, info, warning or error" in stderr_since(proxy, offset), 5), \
        stderr_since(proxy, offset)
    after = stderr_since(proxy, offset)
    assert "reload: applied" not in after, after
    for line in filter(None, after.splitlines()):
        assert re.match(rf"sluice\[{proxy.pid}\] (warning|error): ", line), line
