"""Reloads under load leave nothing behind (issue 36): 50 SIGHUPs, each changing one header
value, while keep-alive clients send GETs through Sluice with the access log on. No request
fails, and once the load has stopped Sluice's RSS is within 16 MiB of what it was before the
reloads. Each retired configuration's per-worker access-log buffer held the capacity its last
busy period gave it, for the life of the process: some 3 MiB per reload at 40k req/s, 60+ MiB
over this test's 50."""

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

    off = stderr_len(proxy)
    with Load(proxy.port, url) as load:
        for k in range(1, RELOADS + 1):
            write_config_text(proxy, gen_config(proxy, k))
            sighup(proxy)
            until(lambda: stderr_since(proxy, off).count("reload: applied") >= k, 10, 0.02, f"reload {k} applied")
            time.sleep(0.2)  # time passing: each configuration serves load for two log-writer periods
    during = rss_kib(proxy)
    assert proxy.alive(), "sluice died during the reloads"
    assert not load.failures, f"{len(load.failures)} of {load.ok + len(load.failures)} requests failed: " \
                              f"{load.failures[:5]}\nstderr:\n{proxy.stderr()[-3000:]}"
    assert load.ok > 500, f"only {load.ok} requests during {RELOADS} reloads"

    # Within 16 MiB: glibc keeps memory in the arenas after bursts on a loaded machine, which
    # the workers' trim does not always return — up to ~3.5 MiB measured for issue #36, 5.4 to
    # 5.7 MiB on 2026-11-28, and on 2026-11-29 6 to 7.5 MiB alone and 9.0 MiB in CI (six test
    # workers), the same after 150 reloads as after 50 and 10 and at d116238 as at its
    # successors: a plateau, not a growth per reload — while the leak this guards against grew
    # by 60+ MiB per 50 reloads.
    bound = before + 16384 * RSS_SCALE
    settled = wait_until(lambda: rss_kib(proxy) <= bound, 10, 0.25)
    after = rss_kib(proxy)
    assert settled, (f"VmRSS {before} KiB before {RELOADS} reloads under load ({load.ok} requests), "
                     f"{during} KiB at their end, still {after} KiB 10 s later (bound {bound:.0f} KiB)")
