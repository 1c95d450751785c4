"""Retries (docs/configuration.md, "Retries (`retry`)", "Validation (`validate`)", "Retry events
in the access log"; docs/errors.md): attempt counts, exponential backoff with max_delay and
jitter as measured at the upstream, Retry-After (seconds and HTTP-date, on 503 and 429),
methods and byte-exact body replay, buffer_limit, transport failures (refused, reset, TLS,
per-try timeout, deadline), no retry after the first response byte, validation failures handed
to the retrier, and the per-host retry budget under 200 concurrent requests.

Every upstream is a FaultUpstream (resilience_servers.py) scripted per path; it records each
try's arrival time and body, so delays are measured from the end of one try to the first byte
of the next. Delays are small (50-800 ms) to keep the module fast.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import time

import pytest

from policy_support import run_check, write_yaml
from rawhttp import RawConn, chunked, request_bytes
from resilience_servers import (Close, NotTLSServer, Partial, Reply, Reset, RetryAfterDate, Stall)
from resilience_support import (EARLY, assert_delay, assert_delays, assert_lasted,  # noqa: F401
                                assert_retry_log, debug_tries, fault, fetch, gaps, late_bound, log_entry,
                                retries_of, retry_cfg, run_concurrently, settle_no_more_tries, start_proxy)
from support import HOST, assert_sluice_error, wait_until

KiB = 1024
MiB = 1024 * 1024


def policy(**retry_kw) -> dict:
    return {"retry": retry_cfg(**retry_kw)}


# ------------------------------------------------------------------------------------------
# Configuration
# ------------------------------------------------------------------------------------------

FULL_RETRY_CONFIG = """\
listen: ["127.0.0.1:{port}"]
policies:
  default:
    retry:
      limit: 2
      backoff:
        base: 2
        scale: 500ms
        max_delay: 30s
        jitter: none
      methods: [DELETE, GET, HEAD, OPTIONS, PUT, TRACE]
      statuses: [408, 500, 502, 503, 504]
      errors: [refused, dns, timeout, reset, tls]
      retry_after: true
      per_try_timeout: 60s
      deadline: unlimited
      budget: {{ ratio: 0.2, min_per_second: 3 }}
      buffer_limit: 1MiB
    validate: {{ status: ["200-299", 304], content_type: ["application/json", "text/*"] }}
  api.example.com:
    retry: {{}}
  "*.corp.internal":
    retry: none
  jitter.example.com:
    retry: {{ limit: 4, backoff: {{ jitter: full }}, deadline: 10s }}
  equal.example.com:
    retry: {{ backoff: {{ jitter: equal, scale: 100ms }}, methods: [GET, POST] }}
"""


def test_check_accepts_every_documented_retry_and_validate_key(tmp_path):
    cfg = tmp_path / "retry-full.yaml"
    cfg.write_text(FULL_RETRY_CONFIG.format(port=23999))
    r = run_check(cfg)
    assert r.returncode == 0, f"sluice check rejected the documented retry/validate keys:\n{r.stdout}{r.stderr}"


@pytest.mark.parametrize("retry, phrase", [
    ({"limit": 2, "backoff": {"jitter": "sometimes"}}, "jitter"),
    ({"limt": 2}, "limit"),                      # misspelt key: the closest known one is suggested
    ({"errors": ["refused", "kaput"]}, "kaput"),
    ({"backoff": {"scale": "fast"}}, "scale"),
])
def test_check_rejects_bad_retry_values_with_location(tmp_path, retry, phrase):
    cfg = write_yaml(tmp_path / "retry-bad.yaml", {"listen": ["127.0.0.1:23998"],
                                                   "policies": {HOST: {"retry": retry}}})
    r = run_check(cfg)
    out = r.stdout + r.stderr
    assert r.returncode == 1, f"sluice check accepted {retry}:\n{out}"
    assert re.search(re.escape(str(cfg)) + r":\d+:\d+", out), f"no FILE:LINE:COLUMN in:\n{out}"
    assert phrase in out, f"error output does not mention {phrase!r}:\n{out}"


# ------------------------------------------------------------------------------------------
# Attempt counts, what the client gets, the access log and debug lines
# ------------------------------------------------------------------------------------------

def test_fail_twice_then_succeed_with_limit_2(sluice_factory, tmp_path, fault):
    url = fault.fail_then_ok("/ft2", 2, 503)
    p = start_proxy(sluice_factory, tmp_path, policy(limit=2, scale="100ms"), debug=True)
    r, _ = fetch(p, "GET", url)
    assert r is not None and r.status == 200, r
    # only the last try's response reaches the client
    assert r.header("X-Try") == "3" and r.body == b"status 200 try 3 path /ft2", r
    tries = settle_no_more_tries(fault, "/ft2", 3)
    assert [t.action for t in tries] == ["reply 503", "reply 503", "reply 200"]
    # every try is the same request
    assert len({(t.method, t.target, tuple(t.headers)) for t in tries}) == 1, [t.raw_head for t in tries]
    assert_delays(tries, [0.1, 0.2])
    e = log_entry(p, "/ft2")
    assert e["status"] == 200 and e["outcome"] == "ok", e
    assert_retry_log(e, attempts=3, stopped=None, reason_has="503", delays_ms=[100, 200])
    assert debug_tries(p, e["id"]) == [1, 2, 3], p.debug_text()


def test_limit_1_passes_the_last_503_through_unchanged(sluice_factory, tmp_path, fault):
    url = fault.script("/ft2b", [Reply(503, body=lambda t: f"busy, try {t.n}".encode(),
                                       headers=[("X-Custom", "upstream-value"), ("Cache-Control", "no-store")],
                                       reason="Try Later") for _ in range(2)])
    p = start_proxy(sluice_factory, tmp_path, policy(limit=1, scale="100ms"))
    r, _ = fetch(p, "GET", url)
    assert r is not None and r.status == 503, r
    assert r.reason == "Try Later", r
    assert r.body == b"busy, try 2", r
    assert r.header("X-Try") == "2" and r.header("X-Custom") == "upstream-value", r
    assert r.header("Cache-Control") == "no-store" and r.header("Content-Type") == "text/plain", r
    settle_no_more_tries(fault, "/ft2b", 2)
    e = log_entry(p, "/ft2b")
    assert e["status"] == 503, e
    assert_retry_log(e, attempts=2, stopped="limit", reason_has="503", delays_ms=[100])


def test_without_retry_section_a_request_is_tried_once(sluice_factory, tmp_path, fault):
    url = fault.fail_then_ok("/once", 1, 503)
    p = start_proxy(sluice_factory, tmp_path, {"adapters": [{"headers": {"set": {"X-P": "1"}}}]})
    r, _ = fetch(p, "GET", url)
    assert r is not None and r.status == 503 and r.header("X-Try") == "1", r
    settle_no_more_tries(fault, "/once", 1)
    e = log_entry(p, "/once")
    assert e["attempts"] == 1 and retries_of(e) == [], e
    assert e.get("retry_stopped") in (None, ""), e


def test_retry_none_overrides_the_default_policy_and_a_host_entry_inherits_it(sluice_factory, tmp_path, fault):
    fault.fail_then_ok("/inh-none", 2, 503)
    fault.fail_then_ok("/inh-default", 2, 503)
    p = start_proxy(sluice_factory, tmp_path, {"retry": "none"},
                    default_policy={"retry": retry_cfg(limit=2, scale="50ms")})
    r, _ = fetch(p, "GET", f"http://{HOST}:{fault.port}/inh-none")          # policy 127.0.0.1
    assert r.status == 503, r
    r, _ = fetch(p, "GET", f"http://localhost:{fault.port}/inh-default")    # policy default
    assert r.status == 200 and r.header("X-Try") == "3", r
    settle_no_more_tries(fault, "/inh-none", 1, wait=0.3)
    settle_no_more_tries(fault, "/inh-default", 3, wait=0)

    # a host entry that does not name `retry` keeps the default policy's retry section
    fault.fail_then_ok("/inh-adapters", 2, 503)
    p2 = start_proxy(sluice_factory, tmp_path, {"adapters": [{"headers": {"set": {"X-Host": "1"}}}]},
                     default_policy={"retry": retry_cfg(limit=2, scale="50ms")})
    r, _ = fetch(p2, "GET", fault.url + "/inh-adapters")
    assert r.status == 200 and r.header("X-Try") == "3", r
    tries = settle_no_more_tries(fault, "/inh-adapters", 3, wait=0.3)
    assert all(t.header("X-Host") == "1" for t in tries), "the host's adapters must run on every try"


def test_empty_retry_section_uses_documented_defaults(sluice_factory, tmp_path, fault):
    """`retry: {}`: limit 2, base 2, scale 500 ms, no jitter -> gaps 500 ms and 1000 ms."""
    url = fault.fail_then_ok("/defaults", 3, 503)
    p = start_proxy(sluice_factory, tmp_path, {"retry": {}})
    r, elapsed = fetch(p, "GET", url)
    assert r is not None and r.status == 503 and r.header("X-Try") == "3", r
    tries = settle_no_more_tries(fault, "/defaults", 3, wait=0.3)
    assert_delays(tries, [0.5, 1.0])
    assert_retry_log(log_entry(p, "/defaults"), attempts=3, stopped="limit", delays_ms=[500, 1000])


@pytest.mark.parametrize("method, tries", [
    ("PUT", 2), ("DELETE", 2), ("OPTIONS", 2), ("HEAD", 2),     # idempotent: retried by default
    ("POST", 1), ("PATCH", 1),                                    # not idempotent: tried once
])
def test_default_methods_are_the_idempotent_ones(sluice_factory, tmp_path, fault, method, tries):
    path = f"/method-{method.lower()}"
    url = fault.fail_then_ok(path, 1, 503)
    p = start_proxy(sluice_factory, tmp_path, policy(limit=1, scale="50ms"))
    body = b"payload" if method in ("PUT", "POST", "PATCH") else b""
    r, _ = fetch(p, method, url, body=body, timeout=5)
    assert r is not None and r.status == (200 if tries == 2 else 503), r
    settle_no_more_tries(fault, path, tries, wait=0.3)
    e = log_entry(p, path)
    if tries == 1:
        assert_retry_log(e, attempts=1, stopped="method")
    else:
        assert_retry_log(e, attempts=2, stopped=None)


# ------------------------------------------------------------------------------------------
# Backoff: base^n x scale, max_delay, jitter
# ------------------------------------------------------------------------------------------

def test_backoff_is_exponential(sluice_factory, tmp_path, fault):
    url = fault.fail_then_ok("/expo", 3, 503)
    p = start_proxy(sluice_factory, tmp_path, policy(limit=3, base=2, scale="200ms"))
    r, elapsed = fetch(p, "GET", url)
    assert r.status == 200 and r.header("X-Try") == "4", r
    tries = settle_no_more_tries(fault, "/expo", 4, wait=0.2)
    assert_delays(tries, [0.2, 0.4, 0.8])
    assert elapsed >= 1.4 - EARLY, elapsed
    assert_retry_log(log_entry(p, "/expo"), attempts=4, stopped=None, delays_ms=[200, 400, 800])


def test_max_delay_caps_the_backoff(sluice_factory, tmp_path, fault):
    url = fault.fail_then_ok("/capped", 3, 503)
    p = start_proxy(sluice_factory, tmp_path, policy(limit=3, base=4, scale="200ms", max_delay="300ms"))
    r, _ = fetch(p, "GET", url)
    assert r.status == 200, r
    tries = settle_no_more_tries(fault, "/capped", 4, wait=0.2)
    assert_delays(tries, [0.2, 0.3, 0.3])   # 200, min(800, 300), min(3200, 300)
    assert_retry_log(log_entry(p, "/capped"), attempts=4, delays_ms=[200, 300, 300])


@pytest.mark.parametrize("jitter", ["full", "equal"])
def test_jitter_bounds(sluice_factory, tmp_path, fault, jitter):
    """limit 4, scale 100 ms: nominal delays 100, 200, 400, 800 ms. full: each in [0, d];
    equal: each in [d/2, d]. Two requests (8 delays) so that jitter has to show."""
    nominal = [0.1, 0.2, 0.4, 0.8]
    paths = [f"/jitter-{jitter}-{i}" for i in range(2)]
    for path in paths:
        fault.fail_then_ok(path, 4, 503)
    # 8 retries in ~1.5 s: more than the default budget (3/s for 2 requests) allows
    p = start_proxy(sluice_factory, tmp_path, policy(limit=4, base=2, scale="100ms", jitter=jitter,
                                                     budget={"ratio": 1.0, "min_per_second": 100}))
    res = run_concurrently(2, lambda i: fetch(p, "GET", fault.url + paths[i])[0], timeout=20)
    assert all(getattr(r, "status", None) == 200 for r in res), res
    logged_all = []
    for path in paths:
        tries = settle_no_more_tries(fault, path, 5, wait=0.1)
        e = log_entry(p, path)
        logged = [r["delay_ms"] / 1000 for r in assert_retry_log(e, attempts=5)]
        logged_all += list(zip(logged, nominal))
        for i, (g, d, lg) in enumerate(zip(gaps(tries), nominal, logged)):
            lo = d / 2 if jitter == "equal" else 0.0
            assert lo - 0.002 <= lg <= d + 0.002, f"{jitter} jitter: logged delay {lg * 1000:.0f} ms " \
                                                  f"for retry {i} outside [{lo * 1000:.0f}, {d * 1000:.0f}]"
            assert lo - EARLY <= g <= late_bound(d), f"{jitter} jitter: measured gap {g * 1000:.0f} ms " \
                                                     f"for retry {i} outside [{lo * 1000:.0f}, {d * 1000:.0f}] + slack"
            assert g >= lg - EARLY, f"retry {i} started {g * 1000:.0f} ms after the try, " \
                                    f"before its logged delay {lg * 1000:.0f} ms"
    # jitter must actually vary the delays: all 8 at the top of their range would mean no jitter
    top = 0.9 if jitter == "full" else 0.95
    assert any(lg < top * d for lg, d in logged_all), f"{jitter} jitter never moved below {top} x delay: {logged_all}"


# ------------------------------------------------------------------------------------------
# Retry-After
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("status", [503, 429])
def test_retry_after_seconds(sluice_factory, tmp_path, fault, status):
    path = f"/ra-secs-{status}"
    url = fault.script(path, [Reply(status, headers=[("Retry-After", "1")])], Reply(200))
    p = start_proxy(sluice_factory, tmp_path, policy(limit=2, scale="50ms", statuses=[429, 503]))
    r, _ = fetch(p, "GET", url)
    assert r.status == 200 and r.header("X-Try") == "2", r
    tries = settle_no_more_tries(fault, path, 2, wait=0.1)
    assert_delays(tries, [1.0])
    rs = assert_retry_log(log_entry(p, path), attempts=2, reason_has=str(status))
    assert abs(rs[0]["delay_ms"] - 1000) <= 5, rs


@pytest.mark.parametrize("status", [503, 429])
def test_retry_after_http_date(sluice_factory, tmp_path, fault, status):
    path = f"/ra-date-{status}"
    url = fault.script(path, [RetryAfterDate(status, ahead=2)], Reply(200))
    p = start_proxy(sluice_factory, tmp_path, policy(limit=2, scale="50ms", statuses=[429, 503]))
    r, _ = fetch(p, "GET", url)
    assert r.status == 200 and r.header("X-Try") == "2", r
    tries = settle_no_more_tries(fault, path, 2, wait=0.1)
    expected = tries[0].expected_delay   # ~1.95 s: the date is 2 s after a second boundary just passed
    assert expected is not None and 1.8 < expected <= 2.0, tries[0]
    g = gaps(tries)[0]
    # an implementation that works in whole seconds may wait up to the full 2 s
    assert expected - 0.1 <= g <= 2.0 + 0.3, f"gap {g:.3f}s for a Retry-After date {expected:.3f}s ahead " \
                                             f"({tries[0].action})"


def test_retry_after_is_capped_by_max_delay(sluice_factory, tmp_path, fault):
    url = fault.script("/ra-cap", [Reply(503, headers=[("Retry-After", "5")])], Reply(200))
    p = start_proxy(sluice_factory, tmp_path, policy(limit=2, scale="50ms", max_delay="400ms"))
    r, _ = fetch(p, "GET", url)
    assert r.status == 200, r
    assert_delays(settle_no_more_tries(fault, "/ra-cap", 2, wait=0.1), [0.4])
    rs = assert_retry_log(log_entry(p, "/ra-cap"), attempts=2)
    assert abs(rs[0]["delay_ms"] - 400) <= 5, rs


def test_retry_after_ignored_when_disabled(sluice_factory, tmp_path, fault):
    url = fault.script("/ra-off", [Reply(503, headers=[("Retry-After", "2")])], Reply(200))
    p = start_proxy(sluice_factory, tmp_path, policy(limit=2, scale="100ms", retry_after=False))
    r, _ = fetch(p, "GET", url)
    assert r.status == 200, r
    assert_delays(settle_no_more_tries(fault, "/ra-off", 2, wait=0.1), [0.1])


@pytest.mark.parametrize("value, kind", [
    ("soon", "unparseable"),
    ("Thu, 01 Jan 1970 00:00:01 GMT", "past"),
    ("-5", "negative"),
])
def test_retry_after_unusable_values(sluice_factory, tmp_path, fault, value, kind):
    """An unparseable or negative Retry-After falls back to the backoff; a date in the past
    means "now". Either way Sluice must not stall on it."""
    path = f"/ra-{kind}"
    url = fault.script(path, [Reply(503, headers=[("Retry-After", value)])], Reply(200))
    p = start_proxy(sluice_factory, tmp_path, policy(limit=2, scale="200ms"))
    r, _ = fetch(p, "GET", url, timeout=10)
    assert r.status == 200 and r.header("X-Try") == "2", r
    g = gaps(settle_no_more_tries(fault, path, 2, wait=0.1))[0]
    if kind == "past":
        assert g <= late_bound(0.2), f"gap {g:.3f}s for a Retry-After in the past"
    else:
        assert_delay(g, 0.2, f"gap for Retry-After {value!r}")


def test_429_is_not_retried_unless_listed(sluice_factory, tmp_path, fault):
    url = fault.script("/429-default", [Reply(429, headers=[("Retry-After", "1")])], Reply(200))
    p = start_proxy(sluice_factory, tmp_path, policy(limit=2, scale="50ms"))
    r, elapsed = fetch(p, "GET", url)
    assert r.status == 429 and r.header("Retry-After") == "1", r
    assert elapsed < 0.8, f"a 429 outside `statuses` took {elapsed:.2f}s"
    settle_no_more_tries(fault, "/429-default", 1, wait=0.3)
    assert_retry_log(log_entry(p, "/429-default"), attempts=1, stopped=None)


def test_retry_stopped_only_for_retriable_failures(sluice_factory, tmp_path, fault, closed_port):
    """`retry_stopped` says why a *retriable* failure was not retried. A success, a status
    outside `statuses`, or a transport error outside `errors` is not one, whatever the method."""
    fault.always("/rs-404", Reply(404))
    fault.always("/rs-200", Reply(200))
    p = start_proxy(sluice_factory, tmp_path, policy(limit=2, scale="50ms", errors=["reset"]))
    cases = [("GET", fault.url + "/rs-404?get", 404), ("POST", fault.url + "/rs-404?post", 404),
             ("POST", fault.url + "/rs-200?post", 200),
             ("POST", f"http://{HOST}:{closed_port}/rs-refused-post", 502),
             ("GET", f"http://{HOST}:{closed_port}/rs-refused-get", 502)]
    for method, url, status in cases:
        r, _ = fetch(p, method, url, body=b"data" if method == "POST" else b"")
        assert r.status == status, (url, r)
    for method, url, status in cases:
        [e] = p.log.wait_for(lambda e: e.get("url") == url)
        assert_retry_log(e, attempts=1, stopped=None)


# ------------------------------------------------------------------------------------------
# Methods and request bodies
# ------------------------------------------------------------------------------------------

def test_post_is_not_retried_by_default(sluice_factory, tmp_path, fault):
    url = fault.always("/post-default", Reply(503, body=b"post refused"))
    p = start_proxy(sluice_factory, tmp_path, policy(limit=2, scale="50ms"))
    body = os.urandom(10 * KiB)
    r, _ = fetch(p, "POST", url, {"Content-Type": "application/octet-stream"}, body)
    assert r.status == 503 and r.body == b"post refused", r
    tries = settle_no_more_tries(fault, "/post-default", 1)
    assert tries[0].body == body
    assert_retry_log(log_entry(p, "/post-default"), attempts=1, stopped="method")


@pytest.mark.parametrize("method, methods", [("POST", ["GET", "POST"]), ("PUT", None)])
def test_body_is_replayed_byte_exact(sluice_factory, tmp_path, fault, method, methods):
    path = f"/replay-{method.lower()}"
    url = fault.fail_then_ok(path, 2, 503)
    kw = {"methods": methods} if methods else {}
    p = start_proxy(sluice_factory, tmp_path, policy(limit=2, scale="50ms", **kw))
    body = os.urandom(200 * KiB)
    want = hashlib.sha256(body).hexdigest()
    r, _ = fetch(p, method, url, {"Content-Type": "application/octet-stream"}, body)
    assert r.status == 200 and r.header("X-Try") == "3", r
    tries = settle_no_more_tries(fault, path, 3)
    for t in tries:
        assert t.body_complete and len(t.body) == len(body), f"try {t.n}: {len(t.body)} bytes of {len(body)}"
        assert t.sha256 == want, f"try {t.n}: body sha256 {t.sha256} != {want}"
        assert t.method == method
    e = log_entry(p, path)
    assert e["bytes_in"] == len(body), f"bytes_in counts the client's body once: {e}"
    assert_retry_log(e, attempts=3)


def test_chunked_body_is_replayed_byte_exact(sluice_factory, tmp_path, fault):
    url = fault.fail_then_ok("/replay-chunked", 1, 503)
    p = start_proxy(sluice_factory, tmp_path, policy(limit=2, scale="50ms", methods=["POST"]))
    parts = [os.urandom(n) for n in (1, 4096, 70 * KiB, 333)]
    body = b"".join(parts)
    raw = request_bytes("POST", url, {"Transfer-Encoding": "chunked"}, body=chunked(parts))
    r, _ = fetch(p, "POST", url, raw=raw)
    assert r.status == 200 and r.header("X-Try") == "2", r
    for t in settle_no_more_tries(fault, "/replay-chunked", 2):
        assert t.body == body, f"try {t.n}: {len(t.body)} bytes, sha256 {t.sha256}"


def test_body_over_buffer_limit_streams_and_is_not_retried(sluice_factory, tmp_path, fault):
    fault.always("/big-body", Reply(503, body=b"still busy"))
    fault.fail_then_ok("/small-body", 1, 503)
    p = start_proxy(sluice_factory, tmp_path,
                    policy(limit=2, scale="50ms", methods=["POST"], buffer_limit="64KiB"))
    big = os.urandom(1 * MiB)
    r, _ = fetch(p, "POST", fault.url + "/big-body", {"Content-Type": "application/octet-stream"}, big)
    assert r.status == 503 and r.body == b"still busy", r
    tries = settle_no_more_tries(fault, "/big-body", 1)
    assert tries[0].sha256 == hashlib.sha256(big).hexdigest(), "the large body must still reach the upstream intact"
    assert_retry_log(log_entry(p, "/big-body"), attempts=1, stopped="buffer_limit")
    # within the limit, the same policy does retry
    small = os.urandom(60 * KiB)
    r, _ = fetch(p, "POST", fault.url + "/small-body", {"Content-Type": "application/octet-stream"}, small)
    assert r.status == 200 and r.header("X-Try") == "2", r
    assert all(t.body == small for t in settle_no_more_tries(fault, "/small-body", 2, wait=0.2))


def test_chunked_body_over_buffer_limit_streams_and_is_not_retried(sluice_factory, tmp_path, fault):
    """A chunked body has no length up front: it streams, and once it outgrew buffer_limit it
    cannot be replayed."""
    fault.always("/big-chunked", Reply(503, body=b"still busy"))
    p = start_proxy(sluice_factory, tmp_path,
                    policy(limit=2, scale="50ms", methods=["POST"], buffer_limit="64KiB"))
    parts = [os.urandom(64 * KiB) for _ in range(16)]
    body = b"".join(parts)
    url = fault.url + "/big-chunked"
    r, _ = fetch(p, "POST", url, raw=request_bytes("POST", url, {"Transfer-Encoding": "chunked"}, body=chunked(parts)))
    assert r.status == 503 and r.body == b"still busy", r
    t = settle_no_more_tries(fault, "/big-chunked", 1)[0]
    assert t.body == body, f"{len(t.body)} bytes reached the upstream, sha256 {t.sha256}"
    assert_retry_log(log_entry(p, "/big-chunked"), attempts=1, stopped="buffer_limit")


def test_keep_alive_connection_after_retried_exchanges(sluice_factory, tmp_path, fault):
    """Retried exchanges, one after the other on one client connection (GET, POST with a body,
    GET), each get their own complete answer."""
    for path in ("/ka-1", "/ka-2", "/ka-3"):
        fault.fail_then_ok(path, 1, 503, ok=Reply(200, body=lambda t: f"ok {t.path} {len(t.body)}".encode()))
    p = start_proxy(sluice_factory, tmp_path, policy(limit=2, scale="50ms", methods=["GET", "POST"]))
    with RawConn(HOST, p.port, timeout=10) as c:
        for path, method, body in (("/ka-1", "GET", b""), ("/ka-2", "POST", b"z" * 5000), ("/ka-3", "GET", b"")):
            c.send(request_bytes(method, fault.url + path, body=body))
            r = c.read_response(method=method, timeout=10)
            assert r is not None and r.status == 200, (path, r)
            assert r.body == f"ok {path} {len(body)}".encode() and r.header("X-Try") == "2", (path, r)
    for path in ("/ka-1", "/ka-2", "/ka-3"):
        settle_no_more_tries(fault, path, 2, wait=0)


def test_client_gone_during_backoff(sluice_factory, tmp_path, fault):
    """The client disconnects while Sluice waits before a retry: Sluice survives, logs the
    exchange as client_aborted, keeps serving, and does not send the retry for nobody."""
    fault.always("/gone", Reply(503))
    fault.always("/after-gone", Reply(200, body=b"alive"))
    p = start_proxy(sluice_factory, tmp_path, policy(limit=2, scale="600ms"))
    c = RawConn(HOST, p.port, timeout=5)
    c.send(request_bytes("GET", fault.url + "/gone"))
    assert fault.wait_tries("/gone", 1, timeout=5), "the first try never arrived"
    time.sleep(0.2)                     # time passing: 0.2 s into the 600 ms backoff the 503 started
    c.close()                           # mid-backoff: the retry is due 600 ms after the first try
    time.sleep(1.6)                     # window: past every retry this exchange could have made; none may come
    assert p.sluice.alive(), f"sluice died after a client left during a retry delay:\n{p.sluice.stderr()}"
    r, _ = fetch(p, "GET", fault.url + "/after-gone")
    assert r.status == 200 and r.body == b"alive", r
    e = log_entry(p, "/gone")
    assert e["outcome"] == "client_aborted", e
    tries = fault.tries("/gone")
    assert len(tries) == 1, f"{len(tries)} tries were sent after the client had gone"


# ------------------------------------------------------------------------------------------
# Transport failures
# ------------------------------------------------------------------------------------------

def test_connection_refused_is_retried_then_502(sluice_factory, tmp_path, closed_port):
    p = start_proxy(sluice_factory, tmp_path, policy(limit=2, scale="100ms"))
    r, elapsed = fetch(p, "GET", f"http://{HOST}:{closed_port}/refused-retried")
    assert_sluice_error(r, 502, "refused")
    assert elapsed >= 0.3 - EARLY, f"3 tries with 100 + 200 ms between them took {elapsed:.3f}s"
    assert elapsed <= late_bound(0.3) + 0.3, elapsed
    e = log_entry(p, "/refused-retried")
    assert e["status"] == 502 and e["outcome"] == "error", e
    assert_retry_log(e, attempts=3, stopped="limit", reason_has="refused", delays_ms=[100, 200])


def test_connection_refused_not_retried_when_not_listed(sluice_factory, tmp_path, closed_port):
    p = start_proxy(sluice_factory, tmp_path, policy(limit=2, scale="1s", errors=["reset", "timeout"]))
    r, elapsed = fetch(p, "GET", f"http://{HOST}:{closed_port}/refused-unlisted")
    assert_sluice_error(r, 502, "refused")
    assert elapsed < 0.9, f"{elapsed:.2f}s: was it retried after the 1 s backoff?"
    assert_retry_log(log_entry(p, "/refused-unlisted"), attempts=1, stopped=None)


@pytest.mark.parametrize("action", [Reset, Close], ids=["rst", "fin"])
def test_connection_lost_before_response_is_retried(sluice_factory, tmp_path, fault, action):
    path = f"/lost-{action.name}"
    url = fault.script(path, [action(), action()], Reply(200))
    p = start_proxy(sluice_factory, tmp_path, policy(limit=2, scale="50ms"))
    r, _ = fetch(p, "GET", url)
    assert r is not None and r.status == 200 and r.header("X-Try") == "3", r
    tries = settle_no_more_tries(fault, path, 3)
    assert [t.action for t in tries] == [action.name, action.name, "reply 200"]
    assert_delays(tries, [0.05, 0.1])
    assert_retry_log(log_entry(p, path), attempts=3)


def test_reset_not_retried_when_not_listed(sluice_factory, tmp_path, fault):
    url = fault.script("/reset-unlisted", [Reset()], Reply(200))
    p = start_proxy(sluice_factory, tmp_path, policy(limit=2, scale="50ms", errors=["refused"]))
    r, _ = fetch(p, "GET", url)
    assert_sluice_error(r, 502, "upstream")
    settle_no_more_tries(fault, "/reset-unlisted", 1)


def test_per_try_timeout_on_a_stalled_upstream(sluice_factory, tmp_path, fault):
    url = fault.always("/stall-tries", Stall())
    p = start_proxy(sluice_factory, tmp_path, policy(limit=2, scale="100ms", per_try_timeout="500ms"))
    r, elapsed = fetch(p, "GET", url)
    assert_sluice_error(r, 504, "timed out")
    tries = settle_no_more_tries(fault, "/stall-tries", 3, wait=0.3)
    for t in tries:
        assert_lasted(t.t_done - t.t_arrival, 0.5, f"try {t.n} lasted")
    assert_delays(tries, [0.1, 0.2])
    want = 3 * 0.5 + 0.1 + 0.2
    assert want - EARLY <= elapsed <= want + 0.6, f"total {elapsed:.3f}s, expected ~{want:.1f}s"
    e = log_entry(p, "/stall-tries")
    assert e["status"] == 504, e
    assert_retry_log(e, attempts=3, stopped="limit", delays_ms=[100, 200])


def test_per_try_timeout_defaults_to_timeouts_upstream_per_try(sluice_factory, tmp_path, fault):
    url = fault.always("/stall-default-timeout", Stall())
    p = start_proxy(sluice_factory, tmp_path, policy(limit=1, scale="100ms"),
                    extra={"timeouts": {"upstream_per_try": "500ms", "drain": "5s"}})
    r, elapsed = fetch(p, "GET", url)
    assert_sluice_error(r, 504, "timed out")
    tries = settle_no_more_tries(fault, "/stall-default-timeout", 2, wait=0.3)
    for t in tries:
        assert_lasted(t.t_done - t.t_arrival, 0.5, f"try {t.n} lasted")
    assert 1.1 - EARLY <= elapsed <= 1.1 + 0.6, elapsed


def test_deadline_stops_retries_with_504(sluice_factory, tmp_path, fault):
    """per-try 1 s, deadline 1.5 s: try 1 times out at 1.0 s, try 2 starts at 1.1 s and is cut
    off by the deadline at 1.5 s."""
    url = fault.always("/deadline-stall", Stall())
    p = start_proxy(sluice_factory, tmp_path,
                    policy(limit=5, scale="100ms", per_try_timeout="1s", deadline="1500ms"))
    r, elapsed = fetch(p, "GET", url)
    assert_sluice_error(r, 504, "timed out")
    assert 1.5 - EARLY <= elapsed <= 1.5 + 0.4, f"deadline 1.5 s, answered after {elapsed:.3f}s"
    tries = settle_no_more_tries(fault, "/deadline-stall", 2, wait=0.4)
    assert_lasted(tries[1].t_done - tries[0].t_arrival, 1.5, "deadline measured at the upstream")
    e = log_entry(p, "/deadline-stall")
    assert e["status"] == 504 and e["attempts"] == 2, e
    assert e.get("retry_stopped") == "deadline", e


def test_deadline_counts_backoff_delays(sluice_factory, tmp_path, fault):
    """Fast 503s, delays 400 then 800 ms, deadline 1 s: the third try would start at 1.2 s, past
    the deadline, so it never starts. The contract allows either ending: the last 503 when Sluice
    sees the delay cannot fit, or a 504 at the deadline; never later than the deadline."""
    url = fault.always("/deadline-delays", Reply(503))
    p = start_proxy(sluice_factory, tmp_path, policy(limit=5, scale="400ms", deadline="1s"))
    r, elapsed = fetch(p, "GET", url)
    assert r is not None and r.status in (503, 504), r
    if r.status == 504:
        assert_sluice_error(r, 504, "timed out")
    assert elapsed <= 1.0 + 0.3, f"deadline 1 s, answered after {elapsed:.3f}s"
    settle_no_more_tries(fault, "/deadline-delays", 2, wait=0.5)
    e = log_entry(p, "/deadline-delays")
    assert e["attempts"] == 2 and e.get("retry_stopped") == "deadline", e


def test_tls_handshake_failure_is_retried(sluice_factory, tmp_path):
    srv = NotTLSServer()
    try:
        p = start_proxy(sluice_factory, tmp_path, policy(limit=2, scale="50ms"))
        r, _ = fetch(p, "GET", f"https://{HOST}:{srv.port}/tls-retried")
        assert_sluice_error(r, 502, "TLS")
        time.sleep(0.3)  # window: no fourth handshake may follow the 502
        assert srv.connection_count() == 3, f"{srv.connection_count()} handshakes, expected 3"
        assert_retry_log(log_entry(p, "/tls-retried"), attempts=3, stopped="limit")
    finally:
        srv.stop()


def test_certificate_verification_failure_is_never_retried(sluice_factory, tmp_path, nginx):
    p = start_proxy(sluice_factory, tmp_path, policy(limit=2, scale="1s", errors=["tls", "reset", "refused"]))
    r, elapsed = fetch(p, "GET", f"https://{HOST}:{nginx.https_wrong_name_port}/1k?cert-verify")
    assert_sluice_error(r, 502, "TLS")
    assert elapsed < 0.9, f"took {elapsed:.3f}s: a certificate failure was retried after the 1 s backoff"
    e = log_entry(p, "cert-verify")
    assert e["attempts"] == 1 and retries_of(e) == [], e


# ------------------------------------------------------------------------------------------
# Only before the first response byte
# ------------------------------------------------------------------------------------------

def test_no_retry_after_response_bytes_reached_the_client(sluice_factory, tmp_path, fault):
    url = fault.script("/partial", [Partial(total=100_000, send=1000)], Reply(200, body=b"Q" * 100_000))
    p = start_proxy(sluice_factory, tmp_path, policy(limit=2, scale="50ms"))
    r, _ = fetch(p, "GET", url, allow_truncated=True)
    assert r is not None and r.status == 200 and r.header("X-Try") == "1", r
    assert not r.complete, f"a body cut off by the upstream must reach the client truncated: {r!r}"
    assert len(r.body) <= 1000 and set(r.body) <= {ord("P")}, \
        f"the client got {len(r.body)} bytes; bytes of another try mixed in: {set(r.body)}"
    settle_no_more_tries(fault, "/partial", 1, wait=0.8)
    e = log_entry(p, "/partial")
    assert e["attempts"] == 1 and retries_of(e) == [], e


def test_retried_response_body_is_discarded(sluice_factory, tmp_path, fault):
    final = os.urandom(1 * MiB)
    url = fault.script("/discard", [Reply(503, body=b"x" * (256 * KiB))], Reply(200, body=final,
                                                                               content_type="application/octet-stream"))
    p = start_proxy(sluice_factory, tmp_path, policy(limit=2, scale="50ms"))
    r, _ = fetch(p, "GET", url)
    assert r.status == 200 and r.header("X-Try") == "2", r
    assert int(r.header("Content-Length") or -1) == len(final) or r.chunked, r
    assert hashlib.sha256(r.body).hexdigest() == hashlib.sha256(final).hexdigest(), \
        f"client body ({len(r.body)} bytes) is not exactly the last try's body"
    e = log_entry(p, "/discard")
    assert e["bytes_out"] == len(final), e


BODILESS = {
    # method, first response, validate section
    "head-503": ("HEAD", Reply(503), None),
    "get-503-empty-body": ("GET", Reply(503, body=b""), None),
    "get-304-fails-validation": ("GET", Reply(304, body=b""), {"status": ["200-299"]}),
    "get-204-fails-content-type": ("GET", Reply(204, body=b"", content_type=None),
                                   {"status": ["200-299"], "content_type": ["text/*"]}),
}


@pytest.mark.parametrize("case", list(BODILESS))
def test_retry_of_a_response_without_body(sluice_factory, tmp_path, fault, case):
    """A retried response that has no body (HEAD, Content-Length: 0, 204, 304) is discarded
    like any other, and the retry goes out."""
    method, first, validate = BODILESS[case]
    path = f"/bodiless-{case}"
    url = fault.script(path, [first], Reply(200, body=b"second"))
    pol = policy(limit=1, scale="50ms")
    if validate:
        pol["validate"] = validate
    p = start_proxy(sluice_factory, tmp_path, pol)
    try:
        r, elapsed = fetch(p, method, url, timeout=3)
    except TimeoutError:
        raise AssertionError(f"{case}: no response within 3 s; the upstream saw "
                             f"{[(t.n, t.action) for t in fault.tries(path)]}") from None
    assert r is not None and r.status == 200 and r.header("X-Try") == "2", r
    settle_no_more_tries(fault, path, 2, wait=0.2)


def test_followed_redirect_without_body(sluice_factory, tmp_path, fault):
    """The same discard path for `redirect: follow`: a 302 with Content-Length: 0 is followed."""
    fault.always("/empty-302", Reply(302, body=b"", headers=[("Location", "/empty-302-target")]))
    fault.always("/empty-302-target", Reply(200, body=b"target"))
    p = start_proxy(sluice_factory, tmp_path, {"redirect": {"follow": {"max": 3}}})
    try:
        r, _ = fetch(p, "GET", fault.url + "/empty-302", timeout=3)
    except TimeoutError:
        raise AssertionError(f"no response within 3 s; the upstream saw {[(t.path, t.action) for t in fault.tries()]}") \
            from None
    assert r.status == 200 and r.body == b"target", r


# ------------------------------------------------------------------------------------------
# Validation
# ------------------------------------------------------------------------------------------

def test_validation_failure_is_retried_and_the_last_response_passes_unchanged(sluice_factory, tmp_path, fault):
    """404 is not in `statuses`, but a response outside `validate.status` is a validation
    failure, handed to the retrier like an error; after the last try the client gets it as is."""
    url = fault.always("/validate-404", Reply(404, body=lambda t: f"not here, try {t.n}".encode(),
                                              headers=[("X-Upstream", "kept")]))
    p = start_proxy(sluice_factory, tmp_path, {"retry": retry_cfg(limit=2, scale="50ms"),
                                               "validate": {"status": ["200-299"]}})
    r, _ = fetch(p, "GET", url)
    assert r.status == 404 and r.body == b"not here, try 3", r
    assert r.header("X-Try") == "3" and r.header("X-Upstream") == "kept", r
    settle_no_more_tries(fault, "/validate-404", 3)
    e = log_entry(p, "/validate-404")
    assert e["status"] == 404, e
    assert_retry_log(e, attempts=3, stopped="limit")
    assert isinstance(e.get("validation"), str) and e["validation"], f"no `validation` reason: {e}"
    assert "404" in e["validation"], f"validation reason does not name the status: {e}"


def test_validation_without_retry_passes_the_response_and_logs_it(sluice_factory, tmp_path, fault):
    url = fault.always("/validate-once", Reply(500, body=b"broken"))
    p = start_proxy(sluice_factory, tmp_path, {"validate": {"status": ["200-299", 304]}})
    r, _ = fetch(p, "GET", url)
    assert r.status == 500 and r.body == b"broken", r
    settle_no_more_tries(fault, "/validate-once", 1)
    e = log_entry(p, "/validate-once")
    assert e["attempts"] == 1 and e.get("validation"), e


def test_validation_content_type_retry_until_it_matches(sluice_factory, tmp_path, fault):
    url = fault.script("/validate-ctype", [Reply(200, body=b"<html>maintenance</html>", content_type="text/html")],
                       Reply(200, body=b'{"ok": true}', content_type="application/json"))
    p = start_proxy(sluice_factory, tmp_path, {"retry": retry_cfg(limit=2, scale="50ms"),
                                               "validate": {"status": ["200-299"],
                                                            "content_type": ["application/json"]}})
    r, _ = fetch(p, "GET", url)
    assert r.status == 200 and r.body == b'{"ok": true}' and r.header("X-Try") == "2", r
    settle_no_more_tries(fault, "/validate-ctype", 2)
    assert_retry_log(log_entry(p, "/validate-ctype"), attempts=2)


def test_validation_content_type_wildcard(sluice_factory, tmp_path, fault):
    url = fault.always("/validate-wild", Reply(200, body=b"plain", content_type="text/plain; charset=utf-8"))
    p = start_proxy(sluice_factory, tmp_path, {"retry": retry_cfg(limit=2, scale="50ms"),
                                               "validate": {"status": ["200-299"], "content_type": ["text/*"]}})
    r, _ = fetch(p, "GET", url)
    assert r.status == 200 and r.body == b"plain", r
    settle_no_more_tries(fault, "/validate-wild", 1)
    e = log_entry(p, "/validate-wild")
    assert e.get("validation") in (None, ""), e


def test_valid_response_has_no_validation_field(sluice_factory, tmp_path, fault):
    url = fault.always("/validate-ok", Reply(304, body=b""))
    p = start_proxy(sluice_factory, tmp_path, {"retry": retry_cfg(limit=2, scale="50ms"),
                                               "validate": {"status": ["200-299", 304]}})
    r, _ = fetch(p, "GET", url)
    assert r.status == 304, r
    settle_no_more_tries(fault, "/validate-ok", 1)
    e = log_entry(p, "/validate-ok")
    assert e.get("validation") in (None, ""), e
    assert_retry_log(e, attempts=1)


# ------------------------------------------------------------------------------------------
# Budget
# ------------------------------------------------------------------------------------------

def budget_bound(client_sent: list[float], retries: list[tuple[float, float]], ratio: float, floor: float) -> float:
    """An upper bound, from the contract, on the retries the budget may allow.

    Contract: at a retry started at tau, the retries started in (tau-1, tau] number at most
    max(floor, ratio x requests started in (tau-1, tau]). Sluice's own times are not visible,
    so they are bracketed: a request starts no earlier than the client sent it
    (`client_sent`), and a retry starts (is scheduled or sent) no earlier than the failed try
    ended and no later than the upstream saw it (`retries` = [(earliest, latest)]).

    When all retries fit in one second (the test arranges that), the last retry's window holds
    every retry, so their number is at most max(floor, ratio x requests sent before the latest
    possible start of the last retry). Otherwise each second of the span gets the allowance
    of every request, a loose but sound bound.
    """
    earliest = min(e for e, _ in retries)
    latest = max(l for _, l in retries)
    if latest - earliest < 1.0:
        return max(floor, ratio * sum(1 for c in client_sent if c <= latest))
    return (math.ceil(latest - earliest) + 1) * max(floor, ratio * len(client_sent))


def test_default_budget_applies(sluice_factory, tmp_path, fault):
    """Without a `budget` key the documented default applies (ratio 0.2, min_per_second 3):
    6 failing requests within one second get 3 retries between them, not 6."""
    fault.always("/default-budget", Reply(503))
    p = start_proxy(sluice_factory, tmp_path, policy(limit=1, scale="20ms"))
    wait_for_second_fraction(0.03, 0.08)
    t0 = time.monotonic()
    for i in range(6):
        r, _ = fetch(p, "GET", f"{fault.url}/default-budget?i={i}")
        assert r.status == 503, r
    assert time.monotonic() - t0 < 0.8, "too slow to stay within one second; the test proves nothing"
    lines = p.log.wait_for(lambda e: "/default-budget" in e.get("url", ""), n=6)
    retried = sum(e["attempts"] - 1 for e in lines)
    assert retried == 3, f"{retried} retries for 6 failing requests in one second: {[e['retry_stopped'] for e in lines]}"
    assert [e.get("retry_stopped") for e in lines].count("budget") == 3, lines


def test_budget_is_per_host(sluice_factory, tmp_path, fault):
    """`budget` is per host: two hosts under the same (default) policy entry do not share one.
    Host 127.0.0.1 spends its allowance (min_per_second 2) on 4 failing requests; a request to
    host localhost within the same second still gets its own retry."""
    fault.always("/budget-a", Reply(503))
    fault.fail_then_ok("/budget-b", 1, 503)
    p = start_proxy(sluice_factory, tmp_path, None,
                    default_policy=policy(limit=1, scale="20ms", budget={"ratio": 0.1, "min_per_second": 2}))
    wait_for_second_fraction(0.03, 0.08)     # everything below happens within one second
    t0 = time.monotonic()
    for i in range(4):
        r, _ = fetch(p, "GET", f"http://{HOST}:{fault.port}/budget-a?i={i}")
        assert r.status == 503, r
    r, _ = fetch(p, "GET", f"http://localhost:{fault.port}/budget-b")
    assert time.monotonic() - t0 < 0.8, "too slow to stay within one second; the test proves nothing"
    a = p.log.wait_for(lambda e: "/budget-a" in e.get("url", ""), n=4)
    assert sum(e["attempts"] - 1 for e in a) == 2, f"127.0.0.1 should get exactly min_per_second=2 retries: {a}"
    assert [e.get("retry_stopped") for e in a].count("budget") == 2, a
    assert r.status == 200 and r.header("X-Try") == "2", \
        f"localhost's retry was refused by a budget spent on 127.0.0.1: {r!r}; {log_entry(p, '/budget-b')}"


def wait_for_second_fraction(lo: float, hi: float) -> None:
    """Sleep until time.monotonic() (CLOCK_MONOTONIC, the clock Sluice runs on) is between
    lo and hi past a whole second."""
    for _ in range(3):
        frac = time.monotonic() % 1.0
        if lo <= frac <= hi:
            return
        time.sleep((lo + 0.01 - frac) % 1.0)  # time passing: the clock must reach the wanted fraction


@pytest.mark.deadline(90)
def test_budget_limits_retries_under_load(sluice_factory, tmp_path, fault):
    """200 concurrent GETs to an always-503 upstream, limit 3, budget ratio 0.2, min 3/s.

    The burst starts just after a whole second of the monotonic clock (the clock Sluice runs
    on), so the burst and its retries (~0.5 s) fall within one second whether the window slides
    or is a per-second bucket; without a budget there would be 600 retries, with it ~40.

    See budget_bound for how "started" is bracketed from the outside.
    """
    N = 200
    path = "/budget"
    fault.always(path, Reply(503, body=b"overloaded"))
    p = start_proxy(sluice_factory, tmp_path, policy(limit=3, scale="50ms",
                                                     budget={"ratio": 0.2, "min_per_second": 3}))

    sent = [0.0] * N

    def one(i):
        sent[i] = time.monotonic()     # before the request leaves: Sluice cannot start it earlier
        r, _ = fetch(p, "GET", f"{fault.url}{path}?i={i}", {"X-Req": str(i)}, timeout=30)
        return r.status if r is not None else None

    statuses = run_concurrently(N, one, timeout=60,
                                before_release=lambda: wait_for_second_fraction(0.03, 0.08))
    assert all(s == 503 for s in statuses), [s for s in statuses if s != 503][:10]
    # Every client has its answer; the upstream marks a try done just after sending it.
    assert wait_until(lambda: all(t.t_done for t in fault.tries(path)), 10), "tries still open after every answer"
    tries = fault.tries(path)
    by_req: dict[str, list] = {}
    for t in tries:
        by_req.setdefault(t.header("X-Req"), []).append(t)
    assert len(by_req) == N, f"{len(by_req)} distinct requests reached the upstream"
    assert all(len(ts) <= 4 for ts in by_req.values()), "a request was tried more than 1 + limit times"
    initial = [ts[0].t_arrival for ts in by_req.values()]
    retries = [(prev.t_done, nxt.t_arrival) for ts in by_req.values() for prev, nxt in zip(ts, ts[1:])]
    n_retries = len(retries)
    if n_retries:
        bound = budget_bound(sent, retries, 0.2, 3)
        assert n_retries <= math.floor(bound + 1e-9), \
            f"{len(tries)} tries = {N} + {n_retries} retries; the budget allows at most {bound:.1f} retries " \
            f"(requests sent from {min(sent) % 1:.2f} past a second, over {max(sent) - min(sent):.2f}s, reaching " \
            f"the upstream over {max(initial) - min(initial):.2f}s; retries seen at " \
            f"{sorted(round(l - min(sent), 2) for _, l in retries)} s after the first request was sent)"
    assert n_retries >= 3, f"only {n_retries} retries: min_per_second 3 allows at least 3"
    lines = p.log.wait_for(lambda e: path in e.get("url", ""), n=N, timeout=10)
    assert sum(e["attempts"] - 1 for e in lines) == n_retries, "access-log attempts disagree with the upstream"
    assert len(fault.tries(path)) == len(tries), "a try reached the upstream after every client had its answer"
    stopped = [e.get("retry_stopped") for e in lines]
    assert stopped.count("budget") >= 1, f"no line says retry_stopped: budget: {set(map(str, stopped))}"
    assert set(stopped) <= {"budget", "limit"}, set(map(str, stopped))
