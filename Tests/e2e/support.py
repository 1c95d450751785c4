"""Helpers shared by the end-to-end tests: clients with a clean environment, the contract of
Sluice's own error responses (docs/errors.md), RSS sampling."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import requests

from faultservers import HOST
from rawhttp import RawConn, Response, request_bytes

MiB = 1 << 20
__all__ = ["HOST", "MiB", "RawConn", "request_bytes"]

# A binary built with a sanitizer (scripts/sanitize.sh sets SLUICE_E2E_SANITIZER=address or
# thread) runs its loop several times slower, and its allocator keeps freed memory aside (ASan's
# quarantine, TSan's shadow and history): the tests that bound a time or an RSS growth widen
# that bound by these factors. They never tighten one, and are 1 for a normal binary.
SANITIZER = os.environ.get("SLUICE_E2E_SANITIZER", "")
TIME_SCALE, RSS_SCALE = {"": (1.0, 1.0), "address": (2.0, 1.5), "thread": (3.0, 2.0)}[SANITIZER]


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without proxy variables, so clients go exactly where a test says."""
    env = {k: v for k, v in os.environ.items()
           if k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "ftp_proxy")}
    env.update(extra)
    return env


def tail(path: Path, n: int = 12000) -> str:
    try:
        data = Path(path).read_bytes()
    except OSError:
        return ""
    return data[-n:].decode("utf-8", "replace")


def run_curl(args: list[str], timeout: float = 60.0, input: bytes | None = None,
             stdin=None) -> subprocess.CompletedProcess:
    """curl with a clean environment, a hard time limit and bytes output."""
    cmd = ["curl", "-sS", "--max-time", str(int(timeout)), *args]
    return subprocess.run(cmd, input=input, stdin=stdin, capture_output=True, timeout=timeout + 10,
                          env=clean_env())


def session_via(proxy_url: str | None) -> requests.Session:
    """A requests session that ignores the environment and uses exactly this proxy (or none)."""
    s = requests.Session()
    s.trust_env = False
    if proxy_url:
        s.proxies = {"http": proxy_url, "https": proxy_url}
    return s


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(4 * MiB):
            h.update(chunk)
    return h.hexdigest()


def port_open(port: int, host: str = HOST) -> bool:
    """Whether something accepts TCP connections on host:port (0.5 s connect timeout)."""
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    s.settimeout(0.5)
    try:
        s.connect((host, port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def wait_until(cond, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(interval)  # poll interval: how often cond is checked until the deadline
    return bool(cond())


# ------------------------------------------------------------------------------------------
# docs/errors.md
# ------------------------------------------------------------------------------------------


def assert_sluice_error(r: Response | None, status: int, phrase: str) -> None:
    """A response Sluice generated itself: status, text/plain; charset=utf-8, an exact
    Content-Length and a one-line body starting with `sluice: ` that names the cause."""
    assert r is not None, f"expected a {status} response from sluice, the connection closed without one"
    assert r.status == status, f"expected {status} ({phrase}), got {r!r}"
    ctype = (r.header("content-type") or "").replace(" ", "").lower()
    assert ctype == "text/plain;charset=utf-8", f"Content-Type {r.header('content-type')!r} in {r!r}"
    cl = r.header("content-length")
    assert cl is not None and int(cl) == len(r.body), f"Content-Length {cl!r} vs body of {len(r.body)}: {r!r}"
    text = r.body.decode("utf-8")
    assert text.startswith("sluice: "), f"body does not start with 'sluice: ': {text!r}"
    assert "\n" not in text.rstrip("\r\n"), f"body is not one line: {text!r}"
    assert phrase.lower() in text.lower(), f"body {text!r} does not mention {phrase!r}"


def send_raw(proxy_port: int, data: bytes, timeout: float = 10.0, method: str = "GET") -> tuple[Response | None, RawConn]:
    """Open a connection to the proxy, send bytes, read one response. The caller closes."""
    c = RawConn(HOST, proxy_port, timeout=timeout)
    c.send(data)
    return c.read_response(method=method, timeout=timeout), c


def connect_through(s: socket.socket, authority: str, timeout: float = 10.0) -> bytes:
    """Sends `CONNECT authority` on s and returns the answer's head, read byte by byte so that
    nothing of the tunnel is consumed (shorter than a head if the proxy closed)."""
    s.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    head = b""
    deadline = time.monotonic() + timeout
    while b"\r\n\r\n" not in head and time.monotonic() < deadline:
        d = s.recv(1)
        if not d:
            break
        head += d
    return head


def assert_connection_kept(c: RawConn, httpbin_port: int) -> None:
    """The same connection still serves a normal proxied request."""
    c.send(request_bytes("GET", f"http://{HOST}:{httpbin_port}/get?kept=1"))
    r = c.read_response(timeout=10)
    assert r is not None, "connection was closed after the error; docs/errors.md says it is kept"
    assert r.status == 200 and b'"kept"' in r.body, r


def assert_connection_closed(c: RawConn, timeout: float = 5.0) -> None:
    assert c.wait_closed(timeout), f"connection still open {timeout}s after the error; docs/errors.md says closed"


# ------------------------------------------------------------------------------------------
# Memory
# ------------------------------------------------------------------------------------------


def proc_status(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS", "VmHWM")):
                k, v = line.split(":", 1)
                out[k] = int(v.split()[0])
    return out


class RssMonitor:
    """Samples a process's VmRSS in the background; reports the peak growth over a baseline
    (also taking VmHWM into account, which catches peaks between samples)."""

    def __init__(self, pid: int, interval: float = 0.1):
        self.pid = pid
        self.interval = interval
        self.baseline_kib = proc_status(pid)["VmRSS"]
        self.peak_kib = self.baseline_kib
        self.samples = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                self.peak_kib = max(self.peak_kib, proc_status(self.pid)["VmRSS"])
                self.samples += 1
            except (OSError, KeyError):
                return
            self._stop.wait(self.interval)

    def __enter__(self) -> "RssMonitor":
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if not self._stop.is_set():
            try:
                st = proc_status(self.pid)
                self.peak_kib = max(self.peak_kib, st["VmRSS"], st["VmHWM"])
            except (OSError, KeyError):
                pass
            self._stop.set()
            self._t.join(timeout=2)

    def current_growth_mib(self) -> float:
        return (proc_status(self.pid)["VmRSS"] - self.baseline_kib) / 1024

    @property
    def growth_mib(self) -> float:
        return (self.peak_kib - self.baseline_kib) / 1024

    def describe(self) -> str:
        return (f"baseline VmRSS {self.baseline_kib / 1024:.1f} MiB, peak {self.peak_kib / 1024:.1f} MiB "
                f"(growth {self.growth_mib:.1f} MiB, {self.samples} samples)")
