"""The fleet (`fleet:`, docs/fleet.md): three Sluice instances share one Redis (a real
`redis-server` started here, on loopback or a Unix socket) and keep one set of rate limits —
the origin sees the fleet's rate, not three times it; an origin's 429 seen through one holds
the others; Redis killed or stopped mid-run is a mode (`on_redis_down`), not an outage, and the
fleet limit comes back with Redis (its scripts loaded again after NOSCRIPT); bad settings are
refused at `check`."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from faultservers import HOST, pick_port, simple_response
from policy_support import run_check, write_yaml
from support import TIME_SCALE, port_open, wait_until
from test_rate_limit import ArrivalOrigin

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")


class Redis:
    """A redis-server of the test's own: no persistence, on a loopback port (and a socket)."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.port = pick_port()
        self.socket = workdir / "redis.sock"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Redis":
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--unixsocket", str(self.socket),
             "--save", "", "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert wait_until(lambda: port_open(self.port), 10), "redis-server did not start"
        return self

    def cli(self, *args: str) -> str:
        return subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True,
                              timeout=5).stdout.strip()

    def kill(self, sig=signal.SIGKILL) -> None:
        assert self.proc
        self.proc.send_signal(sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            self.proc.wait(5)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(5)


@pytest.fixture
def redis(tmp_path):
    r = Redis(tmp_path).start()
    yield r
    r.stop()


@pytest.fixture
def origin():
    s = ArrivalOrigin()
    yield s
    s.stop()


def fleet_of(sluice_factory, redis: Redis, rate_limit: dict, n: int = 3, **fleet) -> list:
    settings = {"redis": f"127.0.0.1:{redis.port}", "timeout": "50ms", "heartbeat": "300ms", **fleet}
    return [sluice_factory({"workers": 2, "fleet": settings, "policies": {"default": {"rate_limit": rate_limit}}},
                           name=f"fleet{i}")
            for i in range(n)]


def get(proxy, url: str, timeout: float = 30) -> requests.Response:
    return requests.get(url, proxies={"http": proxy.url}, timeout=timeout)


def windows(times: list[float], start: float) -> list[int]:
    out, k = [], 0
    while start + k + 1 <= times[-1]:
        out.append(sum(1 for t in times if start + k <= t < start + k + 1))
        k += 1
    return out


def test_three_instances_keep_one_rate(sluice_factory, redis, origin):
    """`rate: 60/s, burst: 5` on three instances, 12 clients spread over them, 360 requests: the
    origin sees 60 a second in every whole second after the burst (within 10 %), not 180, and
    every request is answered 200."""
    fleet = fleet_of(sluice_factory, redis, {"rate": "60/s", "burst": 5, "max_wait": "30s"})
    url = f"http://{HOST}:{origin.port}/f"

    def client(i: int) -> list[int]:
        proxy = fleet[i % 3]
        with requests.Session() as s:
            return [s.get(url, proxies={"http": proxy.url}, timeout=60).status_code for _ in range(30)]

    with ThreadPoolExecutor(12) as pool:
        codes = [c for cs in pool.map(client, range(12)) for c in cs]
    assert codes.count(200) == 360, sorted(set(codes))
    times = origin.times()
    assert len(times) == 360
    per_second = windows(times, times[5])
    print(f"fleet arrivals per second after the burst: {per_second}")  # the figure
    assert len(per_second) >= 4, per_second
    assert all(54 <= w <= 66 for w in per_second), per_second


def test_an_origins_429_through_one_instance_holds_the_others(sluice_factory, redis):
    """The origin answers A's request 429 with `Retry-After: 2`: B's and C's requests (sent
    right after) wait for the same 2 s, and no client sees a 429."""
    first = simple_response(429, b"slow down", [("Retry-After", "2")], reason="Too Many Requests")
    origin = ArrivalOrigin(lambda req, n: first if n == 1 else simple_response(200, b"ok"))
    try:
        a, b, c = fleet_of(sluice_factory, redis, {"learn": True, "max_wait": "6s"})
        url = f"http://{HOST}:{origin.port}/h"
        with ThreadPoolExecutor(3) as pool:
            fa = pool.submit(get, a, url + "?a")
            time.sleep(0.3)  # window: A's 429 is learned and shared before B and C ask
            fb, fc = pool.submit(get, b, url + "?b"), pool.submit(get, c, url + "?c")
            codes = [f.result().status_code for f in (fa, fb, fc)]
        assert codes == [200, 200, 200], codes
        times = origin.times()
        assert len(times) == 4
        assert times[1] - times[0] >= 1.9, f"B or C reached the origin {times[1] - times[0]:.2f} s after its 429"
    finally:
        origin.stop()


def test_redis_killed_then_back_is_a_mode_not_an_outage(sluice_factory, redis, origin):
    """While Redis is gone (SIGKILL) no request waits past the fleet's timeout for it, the
    instances share the limit locally (`local_share`: 30/s each for a fleet of 2 at 60/s) and
    nothing is lost; a new Redis (no scripts loaded: NOSCRIPT) brings the fleet limit back."""
    a, b = fleet_of(sluice_factory, redis, {"rate": "60/s", "burst": 1, "on_limit": "reject"}, n=2)
    time.sleep(1.0)  # window: a heartbeat or two count the instances
    url = f"http://{HOST}:{origin.port}/k"
    assert get(a, url).status_code == 200
    redis.kill()
    t0 = time.monotonic()
    slowest = 0.0
    codes = []
    while time.monotonic() - t0 < 2.0:
        for proxy in (a, b):
            t = time.monotonic()
            codes.append(get(proxy, url, timeout=5).status_code)
            slowest = max(slowest, time.monotonic() - t)
    assert set(codes) <= {200, 429}, set(codes)
    print(f"while Redis was down: slowest answer {slowest * 1000:.0f} ms, {codes.count(200)} of {len(codes)} went")
    assert slowest < 0.5 * TIME_SCALE, f"a request waited {slowest:.2f} s while Redis was down"
    # Two instances at 30/s each: about 120 in 2 s; never the 4x of no limit at all.
    assert 60 <= codes.count(200) <= 150, codes.count(200)
    assert "fall back to on_redis_down: local_share" in a.stderr() + b.stderr()
    redis.start()
    assert wait_until(lambda: "answers again" in a.stderr() and "answers again" in b.stderr(), 10), \
        "the fleet did not come back"
    # The scripts are gone too (SCRIPT FLUSH): EVALSHA meets NOSCRIPT, and EVAL loads them again.
    assert redis.cli("SCRIPT", "FLUSH") == "OK"
    episodes = (a.stderr() + b.stderr()).count("is not answering")
    before = len(origin.times())
    t0 = time.monotonic()
    statuses = [get(a if i % 2 else b, url).status_code for i in range(40)]
    elapsed = time.monotonic() - t0
    # 60/s with a burst of 1 over the fleet: at most one more than the schedule allows.
    assert statuses.count(200) <= 60 * elapsed + 2, f"{statuses.count(200)} of 40 went in {elapsed:.2f} s"
    assert statuses.count(429) > 0, "the fleet limit refuses again"
    assert len(origin.times()) - before == statuses.count(200)
    assert (a.stderr() + b.stderr()).count("is not answering") == episodes, "NOSCRIPT is not a failure"


def test_redis_stopped_does_not_stall_requests(sluice_factory, redis, origin):
    """SIGSTOP (Redis alive but silent): each request waits at most the fleet's timeout for it,
    then the instance falls back; SIGCONT brings the fleet back."""
    [a] = fleet_of(sluice_factory, redis, {"rate": "1000/s", "burst": 100}, n=1, on_redis_down="allow")
    url = f"http://{HOST}:{origin.port}/s"
    assert get(a, url).status_code == 200
    redis.kill(signal.SIGSTOP)
    try:
        slowest = 0.0
        for _ in range(20):
            t = time.monotonic()
            assert get(a, url, timeout=5).status_code == 200
            slowest = max(slowest, time.monotonic() - t)
        print(f"Redis stopped: slowest answer {slowest * 1000:.0f} ms (timeout 50 ms)")
        assert slowest < 0.3 * TIME_SCALE, slowest
    finally:
        redis.kill(signal.SIGCONT)
    assert wait_until(lambda: "answers again" in a.stderr(), 10)


def test_deny_mode_answers_503_while_redis_is_away(sluice_factory, redis, origin):
    [a] = fleet_of(sluice_factory, redis, {"rate": "100/s"}, n=1, on_redis_down="deny")
    redis.kill()
    url = f"http://{HOST}:{origin.port}/d"
    r = get(a, url)
    assert r.status_code == 503 and "fleet.on_redis_down: deny" in r.text, r.text
    assert r.headers["Retry-After"] == "1"
    assert origin.times() == []


def test_unix_socket_and_password(sluice_factory, redis, origin):
    """Redis on a Unix socket with a password (`requirepass`): the fleet authenticates and
    shares its limit; a wrong password is logged and falls back."""
    redis.cli("CONFIG", "SET", "requirepass", "s3cret")
    os.environ["FLEET_TEST_REDIS_PASSWORD"] = "s3cret"
    good = sluice_factory({"fleet": {"redis": f"unix:{redis.socket}", "password": "${FLEET_TEST_REDIS_PASSWORD}"},
                           "policies": {"default": {"rate_limit": {"rate": "1/min", "on_limit": "reject"}}}},
                          name="good")
    url = f"http://{HOST}:{origin.port}/u"
    assert get(good, url).status_code == 200
    assert get(good, url).status_code == 429
    keys = subprocess.run(["redis-cli", "-p", str(redis.port), "-a", "s3cret", "--no-auth-warning", "KEYS", "*"],
                          capture_output=True, text=True).stdout
    assert "sluice:{default|" in keys and ":rl:" in keys, keys
    assert "s3cret" not in good.stderr()
    bad = sluice_factory({"fleet": {"redis": f"unix:{redis.socket}", "password": "wrong"},
                          "policies": {"default": {"rate_limit": {"rate": "1/min"}}}}, name="bad")
    assert get(bad, url + "?bad").status_code == 200  # local_share: its own minute's place
    assert wait_until(lambda: "refused AUTH" in bad.stderr(), 5), bad.stderr()


@pytest.mark.parametrize("address, phrase", [
    ("redis.example:6379", "not the host name 'redis.example'"),
    ("127.0.0.1", "the port is missing"),
    ("unix:relative.sock", "absolute path"),
])
def test_bad_fleet_settings_are_refused_at_check(tmp_path, address, phrase):
    path = write_yaml(tmp_path / "f.yaml", {"fleet": {"redis": address}})
    out = run_check(path)
    assert out.returncode != 0 and phrase in out.stdout + out.stderr, out.stdout + out.stderr


def test_an_unreachable_redis_is_a_logged_fallback(sluice_factory, origin, closed_port):
    """Nothing listens at the fleet's address: Sluice starts, says so once, and applies its
    limits locally (`local_share`, one instance known): 1/min lets one request through."""
    proxy = sluice_factory({"fleet": {"redis": f"127.0.0.1:{closed_port}"},
                            "policies": {"default": {"rate_limit": {"rate": "1/min", "on_limit": "reject"}}}})
    url = f"http://{HOST}:{origin.port}/n"
    t = time.monotonic()
    codes = [get(proxy, url).status_code for _ in range(3)]
    assert time.monotonic() - t < 1.0 * TIME_SCALE, "no request waited for the missing Redis"
    assert codes[0] == 200 and codes[1:] == [429, 429], codes
    assert wait_until(lambda: "is not answering" in proxy.stderr(), 5), proxy.stderr()
    # One line per connection and episode: each worker's, and worker 0's subscriber.
    assert proxy.stderr().count("is not answering") <= 3, proxy.stderr()


def test_a_circuit_opened_by_one_instance_is_open_on_all(sluice_factory, redis):
    """An origin that fails (503) until instance A opens its circuit (3 failures in a row): B's
    and C's requests then fail fast with 503 without reaching it, until the cooldown."""
    failing = simple_response(503, b"down", reason="Service Unavailable")
    origin = ArrivalOrigin(lambda req, n: failing)
    try:
        settings = {"redis": f"127.0.0.1:{redis.port}", "heartbeat": "300ms"}
        policy = {"health": {"consecutive_failures": 3, "cooldown": "10s"}}
        a, b, c = [sluice_factory({"workers": 2, "fleet": settings, "policies": {"default": policy}}, name=f"c{i}")
                   for i in range(3)]
        assert wait_until(lambda: redis.cli("PUBSUB", "NUMSUB", "sluice:circuits").split() == ["sluice:circuits", "3"],
                          10), "every instance listens for circuit news"
        url = f"http://{HOST}:{origin.port}/c"
        with requests.Session() as s:
            assert [s.get(url, proxies={"http": a.url}, timeout=10).status_code for _ in range(3)] == [503] * 3
        assert len(origin.times()) == 3
        assert wait_until(lambda: "circuit opened by another instance" in b.stderr()
                          and "circuit opened by another instance" in c.stderr(), 5), b.stderr()
        for proxy in (b, c):
            r = get(proxy, url)
            assert r.status_code == 503 and "its circuit is open" in r.text, r.text
            assert 1 <= int(r.headers["Retry-After"]) <= 10, r.headers
        assert len(origin.times()) == 3, "B and C sent nothing to the origin"
    finally:
        origin.stop()


# ------------------------------------------------------------------------------------------
# OAuth 2 tokens: one per credential for the whole fleet
# ------------------------------------------------------------------------------------------

from resilience_support import bearer_factory, fetch, run_concurrently, start_proxy, token_server_factory  # noqa: E402,F401
from test_oauth import CLIENT_ID, oauth2, oauth_env, token_in  # noqa: E402,F401


def oauth_fleet(sluice_factory, tmp_path, redis, token_url: str, n: int = 3, **adapter_kw) -> list:
    fleet = {"redis": f"127.0.0.1:{redis.port}", "timeout": "200ms"}
    return [start_proxy(sluice_factory, tmp_path, {"adapters": [oauth2(token_url, **adapter_kw)]},
                        extra={"workers": 2, "fleet": fleet}) for _ in range(n)]


def test_one_token_fetch_for_the_whole_fleet(sluice_factory, tmp_path, redis, token_server_factory, bearer_factory,
                                             oauth_env):
    """3 instances x 50 concurrent clients and no token yet: the token endpoint is called
    exactly once (one instance fetches under the fleet's lock; the others wait for it), and
    every request carries that token. The token's key in Redis does not show the client id."""
    ts = token_server_factory(client_id=CLIENT_ID, client_secret=oauth_env.secret, delay=0.5)
    up = bearer_factory(ts)
    proxies = oauth_fleet(sluice_factory, tmp_path, redis, ts.token_url)
    res = run_concurrently(150, lambda i: fetch(proxies[i % 3], "GET", f"http://{HOST}:{up.port}/t?i={i}",
                                                timeout=30)[0], timeout=60)
    bad = [r for r in res if getattr(r, "status", None) != 200]
    assert not bad, f"{len(bad)} of 150 failed, e.g. {bad[:3]}"
    assert ts.grants() == 1, f"the token endpoint saw {ts.grants()} grants from the fleet"
    assert {token_in(r) for r in res} == {ts.token(1)}
    keys = redis.cli("KEYS", "sluice:{oauth|*")
    assert ":token" in keys and CLIENT_ID not in keys, keys


def test_a_401_refreshes_once_for_the_whole_fleet(sluice_factory, tmp_path, redis, token_server_factory,
                                                  bearer_factory, oauth_env):
    """The upstream revokes the fleet's token: requests through all three instances get a 401
    once, and the fleet fetches exactly one new token (the refused one is deleted only while it
    is still the one kept), which every later request carries."""
    ts = token_server_factory(client_id=CLIENT_ID, client_secret=oauth_env.secret, delay=0.3)
    up = bearer_factory(ts)
    proxies = oauth_fleet(sluice_factory, tmp_path, redis, ts.token_url)
    for p in proxies:
        r, _ = fetch(p, "GET", f"http://{HOST}:{up.port}/first")
        assert r.status == 200 and token_in(r) == ts.token(1), r
    assert ts.grants() == 1
    up.reject.add(ts.token(1))
    res = run_concurrently(30, lambda i: fetch(proxies[i % 3], "GET", f"http://{HOST}:{up.port}/again?i={i}",
                                               timeout=30)[0], timeout=60)
    assert all(getattr(r, "status", None) == 200 for r in res), [getattr(r, "status", r) for r in res]
    assert ts.grants() == 2, f"{ts.grants()} grants: one refresh for the fleet"
    assert {token_in(r) for r in res} == {ts.token(2)}


def test_share_false_keeps_a_credential_local(sluice_factory, tmp_path, redis, token_server_factory,
                                              bearer_factory, oauth_env):
    ts = token_server_factory(client_id=CLIENT_ID, client_secret=oauth_env.secret)
    up = bearer_factory(ts)
    proxies = oauth_fleet(sluice_factory, tmp_path, redis, ts.token_url, n=2, share=False)
    for p in proxies:
        assert fetch(p, "GET", f"http://{HOST}:{up.port}/local")[0].status == 200
    assert ts.grants() == 2, "each instance fetched its own"
    assert redis.cli("KEYS", "sluice:{oauth|*") == ""


def test_one_trial_for_the_whole_fleet_after_the_cooldown(sluice_factory, redis):
    """A's circuit opens (and B's and C's with it). After the cooldown the origin is well again
    but slow (1 s): of 6 requests sent at once through the three instances, one is the fleet's
    trial and reaches the origin; the other 5 fail fast. The trial's success closes every
    instance's circuit: the next requests through all three go."""
    state = {"well": False}

    def answer(req, n):
        if not state["well"]:
            return simple_response(503, b"down", reason="Service Unavailable")
        time.sleep(1.0)  # server behaviour: a slow answer, so the trial is out while the others ask
        return simple_response(200, b"ok")

    origin = ArrivalOrigin(answer)
    try:
        settings = {"redis": f"127.0.0.1:{redis.port}", "heartbeat": "300ms", "timeout": "200ms"}
        policy = {"health": {"consecutive_failures": 3, "cooldown": "1s"}}
        proxies = [sluice_factory({"workers": 2, "fleet": settings, "policies": {"default": policy}}, name=f"t{i}")
                   for i in range(3)]
        assert wait_until(lambda: redis.cli("PUBSUB", "NUMSUB", "sluice:circuits").split() == ["sluice:circuits", "3"],
                          10), "every instance listens for circuit news"
        url = f"http://{HOST}:{origin.port}/trial"
        with requests.Session() as s:
            assert [s.get(url, proxies={"http": proxies[0].url}, timeout=10).status_code for _ in range(3)] == [503] * 3
        assert wait_until(lambda: all("opened by another instance" in p.stderr() for p in proxies[1:]), 5)
        state["well"] = True
        time.sleep(1.3)  # time passing: the cooldown (1 s) ends on every instance
        before = len(origin.times())
        with ThreadPoolExecutor(6) as pool:
            codes = sorted(pool.map(lambda i: get(proxies[i % 3], f"{url}?i={i}").status_code, range(6)))
        assert codes == [200, 503, 503, 503, 503, 503], codes
        assert len(origin.times()) - before == 1, "one trial for the fleet"
        # The trial's instance closed its circuit and told the other two.
        assert wait_until(lambda: sum("closed by another instance" in p.stderr() for p in proxies) == 2, 5)
        assert [get(p, url + "?after").status_code for p in proxies] == [200, 200, 200]
    finally:
        origin.stop()


def test_one_probe_for_the_whole_fleet(sluice_factory, redis):
    """With `probe`, the fleet's lock picks one instance per round: three instances whose
    circuits are open to an origin that keeps failing send it about one probe per interval
    between them (not one each), and a recovered origin closes all three circuits."""
    state = {"well": False}

    def answer(req, n):
        if state["well"]:
            return simple_response(200, b"ok")
        return simple_response(503, b"down", reason="Service Unavailable")

    origin = ArrivalOrigin(answer)
    try:
        settings = {"redis": f"127.0.0.1:{redis.port}", "heartbeat": "300ms", "timeout": "200ms"}
        policy = {"health": {"consecutive_failures": 2, "cooldown": "500ms",
                             "probe": {"path": "/healthz", "interval": "500ms"}}}
        proxies = [sluice_factory({"workers": 2, "fleet": settings, "policies": {"default": policy}}, name=f"p{i}")
                   for i in range(3)]
        assert wait_until(lambda: redis.cli("PUBSUB", "NUMSUB", "sluice:circuits").split() == ["sluice:circuits", "3"],
                          10), "every instance listens for circuit news"
        url = f"http://{HOST}:{origin.port}/p"
        with requests.Session() as s:
            assert [s.get(url, proxies={"http": proxies[0].url}, timeout=10).status_code for _ in range(2)] == [503] * 2
        assert wait_until(lambda: all("opened by another instance" in p.stderr() for p in proxies[1:]), 5)
        for p in proxies[1:]:
            assert get(p, url + "?fast").status_code == 503  # their circuits open at this try
        probes = lambda: sum(1 for r in origin.requests() if "/healthz" in r["target"])  # noqa: E731
        start = probes()
        time.sleep(3.0)  # time passing: six probe intervals (500 ms) while the origin keeps failing
        sent = probes() - start
        print(f"probes in 3 s from 3 instances: {sent}")
        assert 2 <= sent <= 8, f"{sent} probes in 3 s: one instance per round, not three (would be ~18)"
        state["well"] = True
        assert wait_until(lambda: all(get(p, url + "?back").status_code == 200 for p in proxies), 5), \
            "a successful probe closes every instance's circuit"
    finally:
        origin.stop()
