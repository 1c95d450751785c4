"""Reloads under load leave nothing behind (issue 36): 50 SIGHUPs, each changing one header
value, while keep-alive clients send GETs through Sluice with the access log on. No request
fails; once the load has stopped, the second 25 reloads have added at most 4 MiB to Sluice's
RSS and the whole is within 16 MiB of what it was before. Each retired configuration's
per-worker access-log buffer held the capacity its last busy period gave it, for the life of
the process: some 3 MiB per reload at 40k req/s."""

from __future__ import annotations

import threading
import time

import pytest
import yaml

from policy_support import AccessLog, read_config, sighup, stderr_since, stderr_len, until, write_config_text
from rawhttp import RawConn, request_bytes
from support import HOST, RSS_SCALE, proc_status, wait_until

pytestmark = pytest.mark.xdist_group("reload-memory")

RELOADS = 50
CLIENTS = 6
# A long query makes each access-log line about 1 KiB, so that a log buffer holds what a busy
# 100 ms gives it even at the few thousand requests per second Python clients send.
QUERY = "q=" + "x" * 800


def gen_config(proxy, value: int) -> str:
    cfg = read_config(proxy)
    cfg["policies"] = {"default": {"adapters": [{"headers": {"set": {"X-Gen": f"v{value}"}}}]}}
    return yaml.safe_dump(cfg, sort_keys=False)


class Load:
    """CLIENTS keep-alive clients asking nginx's 1 KiB file through the proxy until stopped (at
    most 200,000 requests each); every failure is recorded."""

    def __init__(self, proxy_port: int, url: str):
        self.proxy_port, self.url = proxy_port, url
        self.lock = threading.Lock()
        self.ok = 0
        self.failures: list[str] = []
        self.stop_event = threading.Event()
        self.threads = [threading.Thread(target=self._client, args=(n,), daemon=True) for n in range(CLIENTS)]

    def __enter__(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout=15)

    def _client(self, n: int) -> None:
        c = RawConn(HOST, self.proxy_port, timeout=10)
        i = 0
        try:
            while not self.stop_event.is_set() and i < 200_000:
                i += 1
                try:
                    c.send(request_bytes("GET", f"{self.url}?c={n}&i={i}&{QUERY}"))
                    r = c.read_response(timeout=10)
                    err = None if r is not None and r.status == 200 else f"answer {r!r}"
                except Exception as e:  # noqa: BLE001 - every failure is recorded
                    r, err = None, f"{type(e).__name__}: {e}"
                with self.lock:
                    if err is None:
                        self.ok += 1
                    else:
                        self.failures.append(err)
                if err is not None or "close" in r.connection_tokens():
                    c.close()
                    c = RawConn(HOST, self.proxy_port, timeout=10)
        finally:
            c.close()


def rss_kib(proxy) -> int:
    return proc_status(proxy.pid)["VmRSS"]


@pytest.mark.deadline(90)
def test_reloads_under_load_return_their_memory(sluice_factory, nginx, tmp_path):
    log = AccessLog(tmp_path / "access.log")
    proxy = sluice_factory({"workers": 2, "monitors": [{"access_log": {"path": str(log.path)}}],
                            "policies": {"default": {"adapters": [{"headers": {"set": {"X-Gen": "v0"}}}]}}})
    url = f"http://{HOST}:{nginx.http_port}/1k"

    # The baseline: the same load for 3 s without a reload, then a rest long enough for the
    # workers' heap trim (250 ms without a new request) and the log writer (every 100 ms).
    with Load(proxy.port, url) as warm:
        time.sleep(3)  # time passing: the warm-up load runs for 3 s
    assert not warm.failures, warm.failures[:5]
    time.sleep(1.5)  # time passing: the workers go quiet and trim their heaps
    before = rss_kib(proxy)

    # The reloads in two halves, each under its own load, with a rest after each: a leak grows
    # with every reload, the allocator's keep does not. Measured (2026-11-29, 50 reloads, one to
    # six test workers beside this test): RSS 6 to 9 MiB above the baseline at the end, the same
    # after 150 reloads as after 50 and 10, and reached within the first ten.
    off = stderr_len(proxy)
    served = 0

    def reload_under_load(first: int, last: int) -> int:
        nonlocal served
        with Load(proxy.port, url) as load:
            for k in range(first, last + 1):
                write_config_text(proxy, gen_config(proxy, k))
                sighup(proxy)
                until(lambda: stderr_since(proxy, off).count("reload: applied") >= k, 10, 0.02, f"reload {k} applied")
                time.sleep(0.2)  # time passing: each configuration serves load for two log-writer periods
        assert proxy.alive(), "sluice died during the reloads"
        assert not load.failures, f"{len(load.failures)} of {load.ok + len(load.failures)} requests failed: " \
                                  f"{load.failures[:5]}\nstderr:\n{proxy.stderr()[-3000:]}"
        assert load.ok > 250, f"only {load.ok} requests during reloads {first} to {last}"
        served += load.ok
        time.sleep(1.5)  # time passing: the workers go quiet and trim their heaps
        return rss_kib(proxy)

    half = RELOADS // 2
    middle = reload_under_load(1, half)
    end = reload_under_load(half + 1, RELOADS)

    # The second half of the reloads adds at most 4 MiB: the leak this guards against (each
    # retired configuration's log buffer kept, some 3 MiB per reload at 40k req/s) grew by 60+
    # MiB per 50 reloads. And the whole stays within 16 MiB of the baseline: glibc keeps memory
    # in the worker arenas' top chunks after bursts on a loaded machine (3.5 MiB measured for
    # issue #36, 5.4 to 5.7 MiB on 2026-11-28, up to 9 MiB in CI on 2026-11-29).
    assert end - middle <= 4096 * RSS_SCALE, (
        f"VmRSS {before} KiB before the reloads, {middle} KiB after {half}, {end} KiB after {RELOADS} "
        f"({served} requests): the second half added {end - middle} KiB")
    bound = (before + 16384) * RSS_SCALE
    assert end <= bound, (f"VmRSS {before} KiB before {RELOADS} reloads under load ({served} requests), "
                          f"{end} KiB at their end (bound {bound:.0f} KiB)")
