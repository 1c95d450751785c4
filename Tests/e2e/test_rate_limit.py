"""Rate limits (`rate_limit:`, docs/configuration.md#rate-limits; docs/errors.md, 429): an origin
that records when each request arrived, real clients through Sluice (two workers: the limit
holds for the process). In `wait` mode a request over the limit waits for its turn and the
origin's arrival rate is the limit's; in `reject` mode it is answered 429 with `Retry-After`
and the `RateLimit-Policy` / `RateLimit` fields, and never sent; a client that leaves while it
waits gives its place back; a cache hit takes no place; every try of a retried request does."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from faultservers import HOST, RecordingServer, pick_port, simple_response
from policy_support import monitors, set_sections, sighup, stderr_len, stderr_since, until
from rawhttp import RawConn
from support import TIME_SCALE, port_open, wait_until


class ArrivalOrigin(RecordingServer):
    """Answers 200 to everything (or what `answer` says) and keeps each request's arrival time."""

    def __init__(self, answer=None):
        self.arrivals: list[float] = []
        self.answer = answer
        self.arrival_lock = threading.Lock()
        super().__init__(response=self._respond)

    def _respond(self, req):
        with self.arrival_lock:
            self.arrivals.append(time.monotonic())
        if self.answer:
            return self.answer(req, len(self.arrivals))
        return simple_response(200, b"ok", [("Cache-Control", "no-store")])

    def times(self) -> list[float]:
        with self.arrival_lock:
            return sorted(self.arrivals)


@pytest.fixture
def origin():
    s = ArrivalOrigin()
    yield s
    s.stop()


def limited(sluice_factory, tmp_path, rate_limit: dict, **extra):
    log = tmp_path / "access.log"
    policy = {"rate_limit": rate_limit, **extra}
    return sluice_factory({"workers": 2, "policies": {"default": policy}, "monitors": monitors(access=log)})


def get(proxy, url: str, timeout: float = 60) -> requests.Response:
    return requests.get(url, proxies={"http": proxy.url}, timeout=timeout)


def test_waiting_keeps_the_origin_at_the_limit_and_loses_nothing(sluice_factory, tmp_path, origin):
    """400 requests from 16 clients against 50/s with a burst of 5: after the burst the origin
    sees 50 requests a second (within 10 %) in every whole second, and every client gets 200."""
    proxy = limited(sluice_factory, tmp_path, {"rate": "50/s", "burst": 5, "max_wait": "30s"})
    url = f"http://{HOST}:{origin.port}/item"

    def client(n: int) -> list[int]:
        with requests.Session() as s:
            return [s.get(url, proxies={"http": proxy.url}, timeout=60).status_code for _ in range(25)]

    with ThreadPoolExecutor(16) as pool:
        statuses = [code for codes in pool.map(client, range(16)) for code in codes]
    assert statuses.count(200) == 400, f"every request is answered 200: {sorted(set(statuses))}"
    times = origin.times()
    assert len(times) == 400, "every request reached the origin, once"
    start = times[5]  # the burst went at once; the schedule runs from the sixth
    windows = []
    k = 0
    while start + k + 1 <= times[-1]:
        windows.append(sum(1 for t in times if start + k <= t < start + k + 1))
        k += 1
    print(f"arrivals per second after the burst: {windows}")  # the figure the issue asks for
    assert len(windows) >= 6, windows
    assert all(45 <= w <= 55 for w in windows), f"arrivals per second after the burst: {windows}"


def test_reject_mode_answers_429_and_sends_nothing_over_the_budget(sluice_factory, tmp_path, origin):
    """`on_limit: reject` with a budget of 10 (burst 10 of 2/min): 60 requests from 6 clients get
    exactly the budget's 200s (± 1) and 429s for the rest, each with a Retry-After a client can
    act on and the rate-limit fields; the origin sees only the 200s."""
    proxy = limited(sluice_factory, tmp_path, {"rate": "2/min", "burst": 10, "on_limit": "reject"})
    url = f"http://{HOST}:{origin.port}/r"

    def client(n: int) -> list[requests.Response]:
        with requests.Session() as s:
            return [s.get(url, proxies={"http": proxy.url}, timeout=30) for _ in range(10)]

    with ThreadPoolExecutor(6) as pool:
        answers = [r for rs in pool.map(client, range(6)) for r in rs]
    ok = [r for r in answers if r.status_code == 200]
    refused = [r for r in answers if r.status_code == 429]
    assert 9 <= len(ok) <= 11, f"{len(ok)} requests got through a budget of 10"
    assert len(ok) + len(refused) == 60, sorted({r.status_code for r in answers})
    assert len(origin.times()) == len(ok), "a refused request is never sent"
    for r in refused:
        assert 1 <= int(r.headers["Retry-After"]) <= 30, r.headers
        assert r.headers["RateLimit-Policy"] == '"default";q=2;w=60', r.headers
        assert r.headers["RateLimit"].startswith('"default";r=0;t='), r.headers
        assert "rate limit of policy default reached" in r.text


def test_a_client_that_leaves_while_waiting_gives_its_place_back(sluice_factory, tmp_path, origin):
    """1/s: A goes at once; B waits for the next second and leaves; C, asking after B left,
    gets B's place (about 1 s after A), not the one after it (about 2 s)."""
    proxy = limited(sluice_factory, tmp_path, {"rate": "1/s", "max_wait": "10s"})
    url = f"http://{HOST}:{origin.port}/p"
    t0 = time.monotonic()
    assert get(proxy, url).status_code == 200
    with RawConn(HOST, proxy.port, timeout=5) as b:
        b.send(f"GET {url} HTTP/1.1\r\nHost: {HOST}:{origin.port}\r\n\r\n".encode())
        time.sleep(0.2 * TIME_SCALE)  # window: B's request reaches Sluice and takes the next second
    time.sleep(0.1)  # window: B's close reaches Sluice before C asks
    assert get(proxy, url).status_code == 200
    waited = time.monotonic() - t0
    assert len(origin.times()) == 2, "B never reached the origin"
    assert waited < 1.6 * TIME_SCALE, f"C answered {waited:.2f} s after A: B's place was not given back"


def test_every_try_takes_a_place_and_a_cache_hit_takes_none(sluice_factory, tmp_path):
    """A retried request's second try waits for its own turn; a response answered from the cache
    reaches nobody and waits for nothing."""
    answers = {1: simple_response(503, b"busy", [("Retry-After", "0")], reason="Service Unavailable")}

    def answer(req, n):
        return answers.get(n, simple_response(200, b"ok", [("Cache-Control", "max-age=60")]))

    origin = ArrivalOrigin(answer)
    try:
        log = tmp_path / "access.log"
        proxy = sluice_factory({
            "workers": 2, "cache_store": {"memory": "16MiB"}, "monitors": monitors(access=log),
            "policies": {"default": {"rate_limit": {"rate": "2/s", "max_wait": "10s"},
                                     "retry": {"limit": 2, "backoff": {"scale": "10ms"}}}}})
        url = f"http://{HOST}:{origin.port}/c"
        assert get(proxy, url).status_code == 200
        tries = origin.times()
        assert len(tries) == 2
        assert tries[1] - tries[0] >= 0.45, "the retry waited for its own place (2/s: 500 ms apart)"
        t1 = time.monotonic()
        r = get(proxy, url)
        assert r.status_code == 200 and "hit" in r.headers.get("Cache-Status", ""), r.headers
        assert time.monotonic() - t1 < 0.3 * TIME_SCALE, "a cache hit does not wait for the limit"
        assert len(origin.times()) == 2
    finally:
        origin.stop()


# ------------------------------------------------------------------------------------------
# Learning the origin's own limits (`rate_limit.learn`), `max_concurrent`, reloads, many keys
# ------------------------------------------------------------------------------------------

def access_lines(path, part: str, n: int) -> list[dict]:
    """The access log's lines whose url contains `part`, once there are `n` of them (lines are
    written behind the responses)."""
    import json
    found: list[dict] = []

    def enough():
        text = path.read_text() if path.exists() else ""
        found[:] = [e for e in map(json.loads, filter(str.strip, text.splitlines())) if part in e["url"]]
        return len(found) >= n

    wait_until(enough, 5)
    return found


def test_an_origins_429_holds_every_request_until_its_retry_after(sluice_factory, tmp_path):
    """`rate_limit: { learn: true }` (wait mode): the origin answers its first request 429 with
    `Retry-After: 2`. Nothing reaches it for the next 2 s — neither the requests that arrive
    meanwhile nor the refused one, which Sluice sends again when the hold ends — and then every
    client gets 200: none of them ever sees a 429."""
    first = simple_response(429, b"slow down", [("Retry-After", "2")], reason="Too Many Requests")
    origin = ArrivalOrigin(lambda req, n: first if n == 1 else simple_response(200, b"ok"))
    try:
        log = tmp_path / "access.log"
        proxy = limited(sluice_factory, tmp_path, {"learn": True, "max_wait": "6s"})
        url = f"http://{HOST}:{origin.port}/learn"
        with ThreadPoolExecutor(7) as pool:
            futures = [pool.submit(get, proxy, url + "?n=0")]
            time.sleep(0.3)  # window: the 429 arrives and is learned before the others ask
            futures += [pool.submit(get, proxy, f"{url}?n={i}") for i in range(1, 7)]
            answers = [f.result() for f in futures]
        assert [r.status_code for r in answers] == [200] * 7, [(r.status_code, r.text) for r in answers]
        times = origin.times()
        assert len(times) == 8, "the refused request went once more, the others once"
        gap = times[1] - times[0]
        print(f"first request after the 429: {gap:.3f} s later")  # the figure the issue asks for
        assert 1.9 <= gap <= 3.0 * TIME_SCALE, f"the origin was asked again {gap:.2f} s after its 429"
        lines = access_lines(log, "/learn", 7)
        held = [line for line in lines if line.get("rate_limit", {}).get("decision") == "waited"]
        assert len(held) == 7, lines
        assert all("429 with Retry-After: 2" in line["rate_limit"]["limit"] for line in held), held
        assert all(line["rate_limit"]["waited_ms"] >= 1500 for line in held), held
        [retried] = [line for line in lines if line["retries"]]
        assert retried["retries"][0]["reason"] == "rate_limit 429" and retried["attempts"] == 2, retried
    finally:
        origin.stop()


def test_a_script_reading_the_body_keeps_the_wait_for_an_origins_429(sluice_factory, tmp_path):
    """With a `lua` entry that reads the response body (`read_response_body`), the body is kept
    before the decision: the origin's 429 is still waited out and sent again, never shown to
    the client, and the script sees both answers."""
    first = simple_response(429, b"slow down", [("Retry-After", "1")], reason="Too Many Requests")
    origin = ArrivalOrigin(lambda req, n: first if n == 1 else simple_response(200, b"ok"))
    script = ('return { on_response = function(res, ctx) ctx.vars.seen = (ctx.vars.seen or "") .. res.status .. ":" '
              '.. res:body() .. ";" end }')
    try:
        log = tmp_path / "access.log"
        proxy = limited(sluice_factory, tmp_path, {"learn": True, "max_wait": "5s"},
                        adapters=[{"lua": {"source": script, "read_response_body": True}}])
        r = get(proxy, f"http://{HOST}:{origin.port}/kept")
        assert r.status_code == 200 and r.text == "ok", (r.status_code, r.text)
        times = origin.times()
        assert len(times) == 2 and times[1] - times[0] >= 0.9, times
        [line] = access_lines(log, "/kept", 1)
        assert line["rate_limit"]["decision"] == "waited" and line["attempts"] == 2, line
        assert line["retries"][0]["reason"] == "rate_limit 429", line
        assert line["lua"]["vars"] == {"seen": "429:slow down;200:ok;"}, line
    finally:
        origin.stop()


def test_x_ratelimit_remaining_zero_holds_until_the_reset(sluice_factory, tmp_path):
    """A 200 with `X-RateLimit-Remaining: 0` and `X-RateLimit-Reset: 2` (seconds) is passed on,
    and the next request waits for the reset before it goes; `X-RateLimit-Remaining: 5` holds
    nothing."""
    def answer(req, n):
        remaining = "0" if n == 1 else "5"
        return simple_response(200, b"ok", [("X-RateLimit-Remaining", remaining), ("X-RateLimit-Reset", "2")])

    origin = ArrivalOrigin(answer)
    try:
        proxy = limited(sluice_factory, tmp_path, {"learn": True, "max_wait": "5s"})
        url = f"http://{HOST}:{origin.port}/x"
        assert get(proxy, url).status_code == 200
        t1 = time.monotonic()
        assert get(proxy, url).status_code == 200
        assert 1.7 <= time.monotonic() - t1 <= 3.0 * TIME_SCALE, "the second request waited for the reset"
        t2 = time.monotonic()
        assert get(proxy, url).status_code == 200
        assert time.monotonic() - t2 < 0.5 * TIME_SCALE, "requests left: no hold"
    finally:
        origin.stop()


def test_reject_mode_refuses_while_the_origin_holds(sluice_factory, tmp_path):
    """`on_limit: reject`: the origin's 429 (`Retry-After: 3`) reaches its client unchanged; the
    next request is answered 429 by Sluice itself, with a Retry-After of the hold's end and the
    `RateLimit` field, and is never sent."""
    first = simple_response(429, b"origin says no", [("Retry-After", "3")], reason="Too Many Requests")
    origin = ArrivalOrigin(lambda req, n: first if n == 1 else simple_response(200, b"ok"))
    try:
        proxy = limited(sluice_factory, tmp_path, {"learn": True, "on_limit": "reject"})
        url = f"http://{HOST}:{origin.port}/rj"
        r1 = get(proxy, url)
        assert r1.status_code == 429 and r1.text == "origin says no", r1.text
        r2 = get(proxy, url)
        assert r2.status_code == 429 and "asked for no more requests" in r2.text, r2.text
        assert 1 <= int(r2.headers["Retry-After"]) <= 3, r2.headers
        assert r2.headers["RateLimit"].startswith('"default";r=0;t='), r2.headers
        assert len(origin.times()) == 1, "the refused request was not sent"
    finally:
        origin.stop()


class SlowOrigin(ArrivalOrigin):
    """Answers after `delay` seconds and records the most requests it had at once."""

    def __init__(self, delay: float):
        self.delay = delay
        self.current = 0
        self.most = 0
        super().__init__(answer=self._slow)

    def _slow(self, req, n):
        with self.arrival_lock:
            self.current += 1
            self.most = max(self.most, self.current)
        time.sleep(self.delay)  # server behaviour: a slow API, so that requests overlap
        with self.arrival_lock:
            self.current -= 1
        return simple_response(200, b"ok", [("Cache-Control", "no-store")])


def test_max_concurrent_keeps_the_origin_at_n_in_flight_across_workers(sluice_factory, tmp_path):
    """`max_concurrent: 2` with two workers: 10 clients at once, each answered after 0.3 s — the
    origin never has more than 2 at once, every client gets 200, and the others waited their
    turn (FIFO) rather than failing."""
    origin = SlowOrigin(0.3)
    try:
        log = tmp_path / "access.log"
        proxy = limited(sluice_factory, tmp_path, {"max_concurrent": 2, "learn": False, "max_wait": "10s"})
        url = f"http://{HOST}:{origin.port}/slow"
        with ThreadPoolExecutor(10) as pool:
            answers = list(pool.map(lambda i: get(proxy, f"{url}?i={i}"), range(10)))
        assert [r.status_code for r in answers] == [200] * 10
        assert origin.most == 2, f"the origin had {origin.most} requests at once"
        assert len(origin.times()) == 10
        waited = [line for line in access_lines(log, "/slow", 10)
                  if line.get("rate_limit", {}).get("decision") == "waited"]
        assert len(waited) >= 6 and all(line["rate_limit"]["limit"] == "max_concurrent 2" for line in waited), waited
    finally:
        origin.stop()


def test_max_concurrent_in_reject_mode_answers_429(sluice_factory, tmp_path):
    """`max_concurrent: 1, on_limit: reject`: of 4 requests at once to a slow origin, one goes
    and the others are answered 429 (`rate_limit.max_concurrent`) at once."""
    origin = SlowOrigin(0.5)
    try:
        proxy = limited(sluice_factory, tmp_path, {"max_concurrent": 1, "on_limit": "reject"})
        url = f"http://{HOST}:{origin.port}/one"
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda i: get(proxy, f"{url}?i={i}"), range(4)))
        codes = sorted(r.status_code for r in answers)
        assert codes.count(200) >= 1 and codes.count(200) + codes.count(429) == 4, codes
        refused = [r for r in answers if r.status_code == 429]
        assert refused and all("max_concurrent" in r.text and r.headers["Retry-After"] == "1" for r in refused)
        assert len(origin.times()) == codes.count(200)
    finally:
        origin.stop()


def test_a_reload_changes_the_limit_without_losing_the_queue(sluice_factory, tmp_path, origin):
    """2/s: 8 requests at once queue up (the last would go after 3.5 s); a reload to 100/s
    while they wait loses none of them (every one is answered 200), and a request arriving
    after the reload goes under the new limit at once."""
    proxy = limited(sluice_factory, tmp_path, {"rate": "2/s", "max_wait": "10s"})
    url = f"http://{HOST}:{origin.port}/q"
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(get, proxy, f"{url}?i={i}") for i in range(8)]
        time.sleep(0.5)  # window: the 8 requests are queued before the reload
        offset = stderr_len(proxy)
        set_sections(proxy, policies={"default": {"rate_limit": {"rate": "100/s", "max_wait": "10s"}}})
        sighup(proxy)
        until(lambda: "reload: applied" in stderr_since(proxy, offset), 5, what="the reload")
        t = time.monotonic()
        assert get(proxy, url + "?after=1").status_code == 200
        assert time.monotonic() - t < 0.5 * TIME_SCALE, "the new limit applies to new requests"
        codes = [f.result().status_code for f in futures]
    assert codes == [200] * 8, codes
    assert len(origin.times()) == 9


def test_ten_thousand_client_keys_keep_the_table_bounded(sluice_factory, tmp_path, origin):
    """`key: header:X-Client` with `limits.rate_limit_keys: 1000`: 10,000 distinct keys (each
    within its own budget) are all answered 200, the table keeps 1000 keys, and the 9,000 it
    forgot are counted."""
    import http.client
    import json
    import urllib.request
    admin = pick_port()
    proxy = sluice_factory({
        "workers": 1, "limits": {"rate_limit_keys": 1000}, "admin": {"listen": f"{HOST}:{admin}"},
        "policies": {"default": {"rate_limit": {"rate": "1/min", "key": "header:X-Client", "on_limit": "reject"}}}})
    assert wait_until(lambda: port_open(admin), 10)
    conn = http.client.HTTPConnection(HOST, proxy.port, timeout=10)
    codes = {}
    for i in range(10_000):
        conn.request("GET", f"http://{HOST}:{origin.port}/k", headers={"X-Client": f"c{i}"})
        r = conn.getresponse()
        r.read()
        codes[r.status] = codes.get(r.status, 0) + 1
    # The most recent key is still remembered: its second request is over its budget.
    conn.request("GET", f"http://{HOST}:{origin.port}/k", headers={"X-Client": "c9999"})
    r = conn.getresponse()
    r.read()
    conn.close()
    assert codes == {200: 10_000}, codes
    assert r.status == 429
    limits = json.load(urllib.request.urlopen(f"http://{HOST}:{admin}/limits", timeout=5))
    [policy] = limits["policies"]
    assert policy["keys"] == 1000 and policy["evicted"] == 9000, policy
    assert policy["allowed"] == 10_000 and policy["rejected"] == 1, policy
    metrics = urllib.request.urlopen(f"http://{HOST}:{admin}/metrics", timeout=5).read().decode()
    assert 'sluice_rate_limit_keys_evicted_total{policy="default"} 9000' in metrics, metrics
    assert 'sluice_rate_limit_decisions_total{policy="default",decision="rejected"} 1' in metrics
