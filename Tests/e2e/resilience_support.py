"""Helpers and fixtures for test_retry.py, test_auth.py and test_oauth.py.

Fixtures are defined here and imported by the test modules (as policy_support does), so
conftest.py stays untouched. Timing checks use one tolerance policy: Sluice may never start a
retry noticeably *before* its delay (EARLY, clock and timer granularity), and may be late by
at most max(LATE, LATE_FRACTION x delay) on a loaded 2-core machine.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from policy_support import AccessLog, debug_lines, monitors
from rawhttp import RawConn, Response, request_bytes
from resilience_servers import BearerUpstream, FaultUpstream, TokenServer, Try
from support import HOST, TIME_SCALE, tail, wait_until

# A sanitized binary (support.TIME_SCALE > 1) reaches the upstream later after starting a
# try's timer, so a try can also look shorter than its timeout: both tolerances widen.
EARLY = 0.03 * TIME_SCALE  # s a retry may start before its computed delay
LATE = 0.25 * TIME_SCALE   # s a retry may start after it...
LATE_FRACTION = 0.30  # ...or this fraction of the delay, whichever is larger
# A try's length as the fault upstream sees it runs from the moment its thread read the first
# byte (`Try.t_arrival`), which on a loaded machine (CI, -n 3) comes after Sluice started the
# try's timer by the connect, the request's send and the server thread's wake-up: 45 ms on the
# native engine, 158 ms on the curl engine (whose timer also covers starting the handle) in CI
# runs. A try timed out at exactly its timeout looks that much shorter, so only the lower bound
# of such a length widens (assert_lasted); the client's total time keeps its tight bounds.
ARRIVAL_LAG = 0.2 * TIME_SCALE


# ------------------------------------------------------------------------------------------
# Fixtures
# ------------------------------------------------------------------------------------------

@pytest.fixture
def fault():
    s = FaultUpstream()
    yield s
    s.stop()


@pytest.fixture
def token_server_factory():
    made: list[TokenServer] = []

    def make(**kw) -> TokenServer:
        t = TokenServer(**kw)
        made.append(t)
        return t

    yield make
    for t in made:
        t.stop()


@pytest.fixture
def bearer_factory():
    made: list[BearerUpstream] = []

    def make(tokens: TokenServer, **kw) -> BearerUpstream:
        b = BearerUpstream(tokens, **kw)
        made.append(b)
        return b

    yield make
    for b in made:
        b.stop()


# ------------------------------------------------------------------------------------------
# Config
# ------------------------------------------------------------------------------------------

def retry_cfg(limit: int | None = 2, scale: str | None = "100ms", base: int | None = 2,
              jitter: str | None = "none", max_delay: str | None = None, **more) -> dict:
    """A `retry:` section; None leaves a key out (so its default applies)."""
    r: dict = {}
    if limit is not None:
        r["limit"] = limit
    backoff = {}
    if base is not None:
        backoff["base"] = base
    if scale is not None:
        backoff["scale"] = scale
    if max_delay is not None:
        backoff["max_delay"] = max_delay
    if jitter is not None:
        backoff["jitter"] = jitter
    if backoff:
        r["backoff"] = backoff
    r.update(more)
    return r


class Proxy:
    """A running Sluice plus its access log (and debug log, when asked for)."""

    def __init__(self, sluice, log: AccessLog, debug_path: Path | None):
        self.sluice = sluice
        self.log = log
        self.debug_path = debug_path
        self.port = sluice.port
        self.url = sluice.url

    def debug_text(self) -> str:
        return tail(self.debug_path, 1 << 22) if self.debug_path else ""

    def all_output(self) -> str:
        return "\n".join([self.log.text(), self.debug_text(), tail(self.sluice.err_path, 1 << 22),
                          tail(self.sluice.out_path, 1 << 22)])


def start_proxy(sluice_factory, tmp_path: Path, host_policy: dict | None = None,
                default_policy: dict | None = None, debug: bool = False, extra: dict | None = None,
                host: str = HOST) -> Proxy:
    """Sluice with `host_policy` for `host` (127.0.0.1 by default), an access log, and a debug
    log when asked for."""
    log = tmp_path / f"access-{time.monotonic_ns()}.log"
    dbg = tmp_path / f"debug-{time.monotonic_ns()}.log" if debug else None
    pols = {}
    if default_policy is not None:
        pols["default"] = default_policy
    if host_policy is not None:
        pols[host] = host_policy
    cfg = {"monitors": monitors(access=log, debug=dbg)}
    if pols:
        cfg["policies"] = pols
    cfg.update(extra or {})
    return Proxy(sluice_factory(cfg), AccessLog(log), dbg)


# ------------------------------------------------------------------------------------------
# Requests
# ------------------------------------------------------------------------------------------

def fetch(proxy, method: str, url: str, headers: dict | list | None = None, body: bytes = b"",
          timeout: float = 20.0, allow_truncated: bool = False,
          raw: bytes | None = None) -> tuple[Response | None, float]:
    """One request on a fresh connection; returns (response or None, seconds until it ended)."""
    t0 = time.monotonic()
    with RawConn(HOST, proxy.port, timeout=timeout) as c:
        c.send(raw if raw is not None else request_bytes(method, url, headers, body=body))
        r = c.read_response(method=method, timeout=timeout, allow_truncated=allow_truncated)
    return r, time.monotonic() - t0


def run_concurrently(n: int, fn, timeout: float = 30.0, before_release=None) -> list:
    """Run fn(i) on n threads released together by a barrier (after `before_release()`, when
    given, returns on this thread); each result, or the exception it raised. Every thread is
    joined with a deadline; a thread still running fails the test."""
    results: list = [None] * n
    barrier = threading.Barrier(n + 1, timeout=20)

    def work(i):
        try:
            barrier.wait()
            results[i] = fn(i)
        except BaseException as e:  # noqa: BLE001 - reported to the test
            results[i] = e

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    if before_release is not None:
        before_release()
    barrier.wait()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = sum(t.is_alive() for t in threads)
    assert stuck == 0, f"{stuck} of {n} client threads still running after {timeout}s"
    return results


# ------------------------------------------------------------------------------------------
# Access log / debug log
# ------------------------------------------------------------------------------------------

def log_entry(proxy: Proxy, path: str, timeout: float = 5.0) -> dict:
    """The one access-log line whose url contains `path`."""
    found = proxy.log.wait_for(lambda e: path in str(e.get("url", "")), n=1, timeout=timeout)
    assert len(found) == 1, f"{len(found)} access-log lines for {path}: {found}"
    return found[0]


def retries_of(e: dict) -> list[dict]:
    assert "retries" in e, f"access-log line has no `retries` (docs: every line has it): {e}"
    rs = e["retries"]
    assert isinstance(rs, list), f"`retries` is not a list: {e}"
    for r in rs:
        assert isinstance(r, dict) and {"attempt", "delay_ms", "reason"} <= set(r), \
            f"retry event lacks attempt/delay_ms/reason: {r} in {e}"
        assert isinstance(r["delay_ms"], (int, float)) and r["delay_ms"] >= 0, r
    return rs


def assert_retry_log(e: dict, attempts: int, stopped: str | None = None, reason_has: str | None = None,
                     delays_ms: list[float] | None = None, delay_tol_ms: float = 5) -> list[dict]:
    """`attempts` tries, one `retries` event per retry (attempt numbers consecutive), reasons
    naming the failure, delays as computed, and `retry_stopped` as given (None: absent/null)."""
    assert e.get("attempts") == attempts, f"attempts {e.get('attempts')} != {attempts}: {e}"
    rs = retries_of(e)
    assert len(rs) == attempts - 1, f"{len(rs)} retry events for {attempts} attempts: {e}"
    nums = [r["attempt"] for r in rs]
    assert all(isinstance(x, int) for x in nums) and all(b == a + 1 for a, b in zip(nums, nums[1:])), \
        f"retry attempt numbers not consecutive: {nums} in {e}"
    if nums:
        assert nums[0] in (0, 1, 2), f"first retry's attempt number {nums[0]} in {e}"
    if reason_has is not None:
        for r in rs:
            assert reason_has.lower() in str(r["reason"]).lower(), f"reason {r['reason']!r} lacks {reason_has!r}: {e}"
    if delays_ms is not None:
        got = [r["delay_ms"] for r in rs]
        assert len(got) == len(delays_ms) and all(abs(g - w) <= delay_tol_ms for g, w in zip(got, delays_ms)), \
            f"delay_ms {got} != {delays_ms} (±{delay_tol_ms}): {e}"
    if stopped is None:
        assert e.get("retry_stopped") in (None, ""), f"unexpected retry_stopped: {e}"
    else:
        assert e.get("retry_stopped") == stopped, f"retry_stopped {e.get('retry_stopped')!r} != {stopped!r}: {e}"
    return rs


def debug_tries(proxy: Proxy, request_id) -> list[int]:
    return [int(m.group(2)) for m in debug_lines(proxy.debug_text()) if m.group(1) == str(request_id)]


# ------------------------------------------------------------------------------------------
# Timing
# ------------------------------------------------------------------------------------------

def gaps(tries: list[Try]) -> list[float]:
    """Seconds from the end of each try (response sent, reset, or the peer giving up) to the
    first byte of the next one: the delay Sluice really left."""
    return [b.t_arrival - a.t_done for a, b in zip(tries, tries[1:])]


def late_bound(delay: float) -> float:
    return delay + max(LATE, LATE_FRACTION * delay)


def assert_delay(measured: float, expected: float, what: str = "gap", early: float = EARLY) -> None:
    lo, hi = expected - early, late_bound(expected)
    assert lo <= measured <= hi, f"{what} {measured * 1000:.0f} ms outside [{lo * 1000:.0f}, {hi * 1000:.0f}] ms " \
                                 f"(expected {expected * 1000:.0f} ms)"


def assert_lasted(measured: float, expected: float, what: str) -> None:
    """A length measured from a try's arrival at the fault upstream (`Try.t_arrival`) to a
    later moment: as assert_delay, allowing ARRIVAL_LAG more below."""
    assert_delay(measured, expected, what, early=EARLY + ARRIVAL_LAG)


def assert_delays(tries: list[Try], expected: list[float]) -> None:
    g = gaps(tries)
    assert len(g) == len(expected), f"{len(tries)} tries, gaps {g}, expected {expected}"
    for i, (m, x) in enumerate(zip(g, expected)):
        assert_delay(m, x, f"gap before try {i + 2} (all gaps {[round(v * 1000) for v in g]} ms)")


def settle_no_more_tries(fault: FaultUpstream, path: str, n: int, wait: float = 0.6,
                         finish_timeout: float = 3.0) -> list[Try]:
    """Wait a little and check the upstream saw exactly n tries of path, each of them over
    (answered, reset, or - for a stalled try - its connection closed by Sluice)."""
    time.sleep(wait)  # window: Sluice must not start another try of path in it
    ts = fault.tries(path)
    assert len(ts) == n, f"upstream saw {len(ts)} tries of {path}, expected {n}: " \
                         f"{[(t.n, t.method, t.action) for t in ts]}"
    wait_until(lambda: all(t.t_done for t in ts), finish_timeout, 0.02)
    open_tries = [t.n for t in ts if not t.t_done]
    assert not open_tries, f"tries {open_tries} of {path} still open {finish_timeout}s later: Sluice did not " \
                           f"close the upstream connection of a try it gave up on"
    return ts


__all__ = ["EARLY", "LATE", "fault", "token_server_factory", "bearer_factory", "retry_cfg", "Proxy",
           "start_proxy", "fetch", "run_concurrently", "log_entry", "retries_of", "assert_retry_log",
           "debug_tries", "gaps", "late_bound", "assert_delay", "assert_delays", "settle_no_more_tries"]
