"""OAuth 2 adapter (docs/configuration.md, "OAuth 2 (`oauth2` adapter)"): Alamofire's
AuthenticationInterceptor in a proxy. One token fetch at a time for the whole process, the
token applied as `Authorization: Bearer`, refresh before expiry, one refresh + one retry on a
`refresh_on` status, the refresh window, token endpoint failures as 502 naming oauth2, client
authentication by HTTP Basic or body fields, the refresh_token grant, and no token or client
secret in any output.

The token endpoint is a TokenServer on `localhost` (so no 127.0.0.1 policy applies to it); the
protected upstream is a BearerUpstream on 127.0.0.1 that accepts only the current token.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets as pysecrets
import threading
import time
import urllib.parse

import pytest

from policy_support import run_check, write_yaml
from resilience_support import (bearer_factory, fault, fetch, log_entry, run_concurrently,  # noqa: F401
                                start_proxy, token_server_factory)
from rawhttp import RawConn, request_bytes
from support import HOST, assert_sluice_error, wait_until

CLIENT_ID = "sluice-e2e"


class OAuthEnv:
    def __init__(self):
        tag = pysecrets.token_hex(8)
        self.secret = f"csSECRET{tag}"
        self.refresh = f"rtSECRET{tag}"

    def basic(self) -> str:
        return base64.b64encode(f"{CLIENT_ID}:{self.secret}".encode()).decode()


@pytest.fixture
def oauth_env(monkeypatch) -> OAuthEnv:
    e = OAuthEnv()
    monkeypatch.setenv("E2E_OAUTH_SECRET", e.secret)
    monkeypatch.setenv("E2E_OAUTH_REFRESH", e.refresh)
    return e


def oauth2(token_url: str, **kw) -> dict:
    a = {
        "grant": "client_credentials",
        "token_url": token_url,
        "client_id": CLIENT_ID,
        "client_secret": "${E2E_OAUTH_SECRET}",
        "client_auth": "basic",
        "refresh_before_expiry": "1s",
        "refresh_window": {"max": 5, "per": "30s"},
        "refresh_on": [401],
    }
    a.update(kw)
    return {"oauth2": {k: v for k, v in a.items() if v is not None}}


def setup(sluice_factory, tmp_path, token_server_factory, bearer_factory, oauth_env, debug=False, extra=None,
          server_kw=None, **adapter_kw):
    ts = token_server_factory(client_id=CLIENT_ID, client_secret=oauth_env.secret, refresh_token=oauth_env.refresh,
                              **(server_kw or {}))
    up = bearer_factory(ts)
    p = start_proxy(sluice_factory, tmp_path, {"adapters": [oauth2(ts.token_url, **adapter_kw)]},
                    debug=debug, extra=extra)
    return ts, up, p


def get(p, up, path: str, method="GET", body=b"", timeout=20):
    return fetch(p, method, f"http://{HOST}:{up.port}{path}", body=body, timeout=timeout)


def token_in(r) -> str | None:
    try:
        return json.loads(r.body)["token"]
    except (ValueError, KeyError, TypeError):
        return None


# ------------------------------------------------------------------------------------------
# Configuration
# ------------------------------------------------------------------------------------------

DOC_EXAMPLE = {
    "grant": "client_credentials",
    "token_url": "https://auth.example.com/oauth/token",
    "client_id": "sluice",
    "client_secret": "${E2E_OAUTH_SECRET}",
    "scope": "read write",
    "audience": "https://api.example.com",
    "client_auth": "basic",
    "refresh_before_expiry": "30s",
    "refresh_window": {"max": 5, "per": "30s"},
    "refresh_on": [401],
}


def test_check_accepts_the_documented_oauth2_adapter_and_redacts_secrets(tmp_path, oauth_env):
    cfg = write_yaml(tmp_path / "oauth.yaml", {"listen": ["127.0.0.1:23995"], "policies": {
        "api.example.com": {"adapters": [{"oauth2": DOC_EXAMPLE}]},
        "refresh.example.com": {"adapters": [{"oauth2": {**DOC_EXAMPLE, "grant": "refresh_token",
                                                         "refresh_token": "${E2E_OAUTH_REFRESH}",
                                                         "client_auth": "body"}}]}}})
    r = run_check(cfg)
    assert r.returncode == 0, r.stdout + r.stderr
    for host in ("api.example.com", "refresh.example.com"):
        r = run_check(cfg, host=host)
        assert r.returncode == 0, r.stdout + r.stderr
        out = r.stdout + r.stderr
        assert "oauth2" in out, out
        assert oauth_env.secret not in out and oauth_env.refresh not in out, f"secret printed by check --host:\n{out}"


@pytest.mark.parametrize("change, phrase", [
    ({"grant": "refresh_token"}, "refresh_token"),          # refresh_token: is required for that grant
    ({"client_auth": "header"}, "client_auth"),
    ({"grant": "password"}, "grant"),
])
def test_check_rejects_bad_oauth2(tmp_path, oauth_env, change, phrase):
    cfg = write_yaml(tmp_path / "oauth-bad.yaml", {"listen": ["127.0.0.1:23994"], "policies": {
        HOST: {"adapters": [{"oauth2": {**DOC_EXAMPLE, **change}}]}}})
    r = run_check(cfg)
    assert r.returncode == 1, f"accepted {change}:\n{r.stdout}{r.stderr}"
    assert phrase in r.stdout + r.stderr, r.stdout + r.stderr


# ------------------------------------------------------------------------------------------
# One fetch at a time
# ------------------------------------------------------------------------------------------

@pytest.mark.deadline(60)
def test_concurrent_requests_share_one_token_fetch(sluice_factory, tmp_path, token_server_factory, bearer_factory,
                                                   oauth_env):
    ts, up, p = setup(sluice_factory, tmp_path, token_server_factory, bearer_factory, oauth_env,
                      extra={"workers": 2}, server_kw={"delay": 0.5})
    N = 100
    res = run_concurrently(N, lambda i: get(p, up, f"/conc?i={i}")[0], timeout=40)
    bad = [r for r in res if getattr(r, "status", None) != 200]
    assert not bad, f"{len(bad)} of {N} failed, e.g. {bad[:3]}"
    assert ts.grants() == 1, f"token server saw {ts.grants()} grants for {N} concurrent requests"
    assert len(ts.all_requests()) == 1 and ts.max_in_flight == 1
    assert {token_in(r) for r in res} == {ts.token(1)}
    seen = up.requests()
    assert len(seen) == N and all(s.token == ts.token(1) and s.accepted for s in seen), \
        {(s.token, s.accepted) for s in seen}


def test_token_fetch_does_not_block_other_requests(sluice_factory, tmp_path, token_server_factory, bearer_factory,
                                                   oauth_env, httpbin):
    """workers: 1 and a token endpoint that takes 1.5 s: a request to another host is served
    while the oauth2 request waits."""
    ts, up, p = setup(sluice_factory, tmp_path, token_server_factory, bearer_factory, oauth_env,
                      extra={"workers": 1}, server_kw={"delay": 1.5})
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", get(p, up, "/slow-token")), daemon=True)
    t.start()
    assert wait_until(lambda: ts.all_requests(), 10), "the oauth2 request did not start a token fetch"
    r, elapsed = fetch(p, "GET", f"http://localhost:{httpbin.port}/get?while-token")
    assert r.status == 200, r
    assert elapsed < 0.8, f"a request to another host took {elapsed:.2f}s while a token fetch was pending"
    t.join(10)
    assert not t.is_alive()
    assert out["r"][0].status == 200 and ts.grants() == 1, out


def test_client_gone_while_waiting_for_a_token(sluice_factory, tmp_path, token_server_factory, bearer_factory,
                                               oauth_env):
    """Clients that disconnect while their requests wait for a slow token fetch: Sluice
    survives, sends nothing upstream for them, and serves the next request with the token."""
    ts, up, p = setup(sluice_factory, tmp_path, token_server_factory, bearer_factory, oauth_env,
                      server_kw={"delay": 1.0})
    conns = []
    for i in range(5):
        c = RawConn(HOST, p.port, timeout=5)
        c.send(request_bytes("GET", f"http://{HOST}:{up.port}/gone-{i}"))
        conns.append(c)
    assert wait_until(lambda: ts.all_requests(), 10), "the parked requests did not start a token fetch"
    for c in conns:
        c.close()
    assert wait_until(lambda: ts.grants() == 1, 10), "the token fetch did not finish"
    # window: the fetch has woken the parked requests; Sluice must neither die nor send them upstream
    time.sleep(0.5)
    assert p.sluice.alive(), f"sluice died after clients left while waiting for a token:\n{p.sluice.stderr()}"
    r, _ = get(p, up, "/after-gone")
    assert r.status == 200 and token_in(r) == ts.token(1), r
    assert ts.grants() == 1, ts.grants()
    assert [s.path for s in up.requests()] == ["/after-gone"], [s.path for s in up.requests()]


# ------------------------------------------------------------------------------------------
# Expiry and refresh
# ------------------------------------------------------------------------------------------

def test_refresh_before_expiry(sluice_factory, tmp_path, token_server_factory, bearer_factory, oauth_env):
    """expires_in 2 s, refresh_before_expiry 1 s: the token is reused for the first second and
    refreshed (before the request is sent) after that."""
    ts, up, p = setup(sluice_factory, tmp_path, token_server_factory, bearer_factory, oauth_env,
                      server_kw={"expires_in": 2}, refresh_before_expiry="1s")
    r, _ = get(p, up, "/exp-1")
    assert r.status == 200 and token_in(r) == ts.token(1), r
    t_grant = ts.all_requests()[0].t
    r, _ = get(p, up, "/exp-2")
    assert r.status == 200 and token_in(r) == ts.token(1), r
    assert ts.grants() == 1
    # time passing: 1.2 s after the grant the 2 s token is within refresh_before_expiry (1 s) of expiring
    time.sleep(max(0.0, t_grant + 1.2 - time.monotonic()))
    r, _ = get(p, up, "/exp-3")
    assert r.status == 200 and token_in(r) == ts.token(2), f"expected a refreshed token: {r!r}"
    assert ts.grants() == 2
    # the upstream never saw a stale token: the refresh happened before the request went out
    assert [s.accepted for s in up.requests()] == [True, True, True], [(s.path, s.token) for s in up.requests()]


def test_refresh_on_401_then_one_retry(sluice_factory, tmp_path, token_server_factory, bearer_factory, oauth_env):
    ts, up, p = setup(sluice_factory, tmp_path, token_server_factory, bearer_factory, oauth_env)
    r, _ = get(p, up, "/revoke-1")
    assert r.status == 200 and token_in(r) == ts.token(1), r
    up.reject.add(ts.token(1))                       # the upstream revokes the current token
    body = os.urandom(50 * 1024)
    r, _ = get(p, up, "/revoke-2", method="PUT", body=body)
    assert r.status == 200 and token_in(r) == ts.token(2), r
    assert ts.grants() == 2
    seen = [(s.path, s.token, s.accepted) for s in up.requests()]
    assert seen == [("/revoke-1", ts.token(1), True), ("/revoke-2", ts.token(1), False),
                    ("/revoke-2", ts.token(2), True)], seen
    want = hashlib.sha256(body).hexdigest()
    assert [s.body_sha256 for s in up.requests()[1:]] == [want, want], "the body must be replayed for the retry"
    e = log_entry(p, "/revoke-2")
    assert e["status"] == 200, e


def test_refresh_window_stops_hammering(sluice_factory, tmp_path, token_server_factory, bearer_factory, oauth_env):
    """Every token gets 401. Each request may refresh once and retry once; past `max` refreshes
    within `per`, requests fail with 502 instead of reaching the token endpoint again."""
    ts, up, p = setup(sluice_factory, tmp_path, token_server_factory, bearer_factory, oauth_env,
                      refresh_window={"max": 2, "per": "30s"})
    up.reject_all = True
    statuses, token_requests = [], []
    for i in range(6):
        n_before = len(up.requests())
        r, _ = get(p, up, f"/hammer-{i}")
        statuses.append(r.status)
        token_requests.append(len(ts.all_requests()))
        assert len(up.requests()) - n_before <= 2, f"request {i} was tried {len(up.requests()) - n_before} times"
        if r.status == 502:
            assert_sluice_error(r, 502, "oauth2")
        else:
            assert r.status == 401 and b"invalid_token" in r.body, f"request {i}: {r!r}"
    assert 502 in statuses, f"the refresh window never tripped: {statuses}, {ts.grants()} grants"
    first = statuses.index(502)
    assert all(s == 502 for s in statuses[first:]), f"after the window tripped: {statuses}"
    assert ts.grants() <= 2 + 1, f"{ts.grants()} grants with refresh_window max 2 (+1 initial fetch)"
    assert token_requests[first:] == [token_requests[first]] * (len(statuses) - first), \
        f"the token endpoint was asked again after the window tripped: {token_requests} ({statuses})"


# ------------------------------------------------------------------------------------------
# Token endpoint failures
# ------------------------------------------------------------------------------------------

def test_dead_token_endpoint_is_502_naming_oauth2(sluice_factory, tmp_path, token_server_factory, bearer_factory,
                                                  oauth_env):
    ts, up, p = setup(sluice_factory, tmp_path, token_server_factory, bearer_factory, oauth_env)
    ts.kill()
    r, elapsed = get(p, up, "/dead-token")
    assert_sluice_error(r, 502, "oauth2")
    assert "adapter oauth2 failed" in r.body.decode(), r.body
    assert up.requests() == [], "nothing may reach the upstream without a token"
    assert oauth_env.secret.encode() not in r.body
    e = log_entry(p, "/dead-token")
    assert e["status"] == 502 and e["outcome"] == "error", e


@pytest.mark.parametrize("mode", ["fail", "bad"])
def test_failing_token_endpoint_is_502_naming_oauth2(sluice_factory, tmp_path, token_server_factory, bearer_factory,
                                                     oauth_env, mode):
    # a wide refresh window: failed fetches may count as refreshes, and this test is not about it
    ts, up, p = setup(sluice_factory, tmp_path, token_server_factory, bearer_factory, oauth_env,
                      refresh_window={"max": 50, "per": "30s"})
    ts.mode = mode            # "fail": 500; "bad": 200 without an access_token
    res = run_concurrently(5, lambda i: get(p, up, f"/token-{mode}?i={i}")[0], timeout=20)
    for r in res:
        assert_sluice_error(r, 502, "oauth2")
        assert oauth_env.secret.encode() not in r.body
    assert up.requests() == []
    assert len(ts.all_requests()) <= 5
    # the endpoint recovers: the next request gets a token
    ts.mode = "ok"
    r, _ = get(p, up, f"/token-{mode}-recovered")
    assert r.status == 200 and token_in(r) == ts.current, r


# ------------------------------------------------------------------------------------------
# What the token endpoint receives
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("client_auth", ["basic", "body"])
def test_client_credentials_grant_and_client_auth(sluice_factory, tmp_path, token_server_factory, bearer_factory,
                                                  oauth_env, client_auth):
    ts, up, p = setup(sluice_factory, tmp_path, token_server_factory, bearer_factory, oauth_env,
                      server_kw={"require_auth": client_auth}, client_auth=client_auth,
                      scope="read write", audience="https://api.example.com")
    r, _ = get(p, up, f"/auth-{client_auth}")
    assert r.status == 200, r
    [q] = ts.all_requests()
    assert q.method == "POST" and q.path.split("?")[0] == "/token", q
    ctype = (next((v for k, v in q.headers if k.lower() == "content-type"), "") or "").split(";")[0].strip()
    assert ctype == "application/x-www-form-urlencoded", q.headers
    assert q.form.get("grant_type") == "client_credentials", q.form
    assert q.form.get("scope") == "read write" and q.form.get("audience") == "https://api.example.com", q.form
    assert q.auth_mode == client_auth, f"client_auth {client_auth}, token server saw {q.auth_mode}: {q.headers} {q.form}"
    if client_auth == "basic":
        assert (q.basic_id, q.basic_secret) == (CLIENT_ID, oauth_env.secret)
        assert "client_secret" not in q.form
    else:
        assert q.form.get("client_id") == CLIENT_ID and q.form.get("client_secret") == oauth_env.secret
        assert not any(k.lower() == "authorization" for k, _ in q.headers), q.headers


def test_refresh_token_grant(sluice_factory, tmp_path, token_server_factory, bearer_factory, oauth_env):
    ts, up, p = setup(sluice_factory, tmp_path, token_server_factory, bearer_factory, oauth_env,
                      grant="refresh_token", refresh_token="${E2E_OAUTH_REFRESH}")
    r, _ = get(p, up, "/refresh-grant")
    assert r.status == 200 and token_in(r) == ts.token(1), r
    [q] = ts.all_requests()
    assert q.form.get("grant_type") == "refresh_token", q.form
    assert q.form.get("refresh_token") == oauth_env.refresh, q.form
    assert q.auth_mode == "basic" and q.basic_secret == oauth_env.secret


def test_refresh_token_grant_uses_a_rotated_refresh_token(sluice_factory, tmp_path, token_server_factory,
                                                         bearer_factory, oauth_env):
    """RFC 6749 section 6: when the token endpoint issues a new refresh token, the next refresh
    uses it (the old one is dead at this server), and it never shows in any output."""
    ts, up, p = setup(sluice_factory, tmp_path, token_server_factory, bearer_factory, oauth_env, debug=True,
                      grant="refresh_token", refresh_token="${E2E_OAUTH_REFRESH}",
                      server_kw={"expires_in": 2, "rotate_refresh_token": True}, refresh_before_expiry="1s")
    r, _ = get(p, up, "/rotate-1")
    assert r.status == 200 and token_in(r) == ts.token(1), r
    # time passing: 1.2 s after the grant the 2 s token is within refresh_before_expiry (1 s) of expiring
    time.sleep(max(0.0, ts.all_requests()[0].t + 1.2 - time.monotonic()))
    r, _ = get(p, up, "/rotate-2")
    assert r.status == 200 and token_in(r) == ts.token(2), f"refresh with the rotated refresh token failed: {r!r}"
    reqs = ts.all_requests()
    assert [q.form.get("refresh_token") for q in reqs] == ts.refresh_tokens[:2], \
        [(q.form.get("refresh_token"), q.status) for q in reqs]
    out = p.all_output()
    for v in ts.refresh_tokens + ts.issued:
        assert v not in out, f"{v!r} appears in Sluice's output"


def test_stalled_token_endpoint_times_out_with_502(sluice_factory, tmp_path, token_server_factory, bearer_factory,
                                                   oauth_env, fault):
    """A token endpoint that accepts and never answers is bounded by the session core's
    per-try timeout (timeouts.upstream_per_try): the waiting request fails with 502 naming
    oauth2 instead of hanging."""
    from resilience_servers import Stall
    fault.always("/token", Stall())
    ts = token_server_factory(client_id=CLIENT_ID, client_secret=oauth_env.secret)
    up = bearer_factory(ts)
    p = start_proxy(sluice_factory, tmp_path,
                    {"adapters": [oauth2(f"http://localhost:{fault.port}/token")]},
                    extra={"timeouts": {"upstream_per_try": "1s", "drain": "5s"}})
    try:
        r, elapsed = get(p, up, "/stalled-token", timeout=8)
    except TimeoutError:
        raise AssertionError("no answer within 8 s from a request waiting on a stalled token endpoint "
                             "(timeouts.upstream_per_try is 1 s)") from None
    assert_sluice_error(r, 502, "oauth2")
    assert elapsed < 1.0 + 1.0, f"took {elapsed:.2f}s with a 1 s per-try timeout"
    assert up.requests() == []


# ------------------------------------------------------------------------------------------
# Secrets
# ------------------------------------------------------------------------------------------

def test_no_token_or_secret_in_any_output(sluice_factory, tmp_path, token_server_factory, bearer_factory,
                                          oauth_env):
    ts, up, p = setup(sluice_factory, tmp_path, token_server_factory, bearer_factory, oauth_env, debug=True,
                      grant="refresh_token", refresh_token="${E2E_OAUTH_REFRESH}",
                      server_kw={"expires_in": 60})
    assert get(p, up, "/leak-1")[0].status == 200
    up.reject.add(ts.token(1))
    assert get(p, up, "/leak-2")[0].status == 200     # refresh on 401
    ts.mode = "fail"
    up.reject.add(ts.token(2))
    r, _ = get(p, up, "/leak-3")                                      # refresh fails -> 502
    assert r.status in (401, 502), r
    log_entry(p, "/leak-3")
    out = p.all_output()
    assert "debug" in p.debug_text(), "the debug monitor wrote nothing"
    values = [oauth_env.secret, oauth_env.refresh, oauth_env.basic(), *ts.issued,
              urllib.parse.quote(oauth_env.secret), urllib.parse.quote(oauth_env.refresh)]
    for v in values:
        assert v not in out, f"secret {v!r} appears in Sluice's output:\n" \
                             f"{out[max(0, out.find(v) - 300): out.find(v) + 300]}"
    assert ts.tag not in out, "part of an access token appears in Sluice's output"


def test_token_fetch_goes_through_the_token_hosts_parent_proxy(sluice_factory, tmp_path, token_server_factory,
                                                              bearer_factory, oauth_env):
    # upstream_proxy of the token endpoint's host (localhost) applies to the token fetch.
    from policy_support import AccessLog, monitors
    parent_log = tmp_path / "parent-access.log"
    parent = sluice_factory({"monitors": monitors(access=parent_log)}, name="parent")
    ts = token_server_factory(client_id=CLIENT_ID, client_secret=oauth_env.secret, refresh_token=oauth_env.refresh)
    up = bearer_factory(ts)
    p = start_proxy(sluice_factory, tmp_path, extra={"policies": {
        HOST: {"adapters": [oauth2(ts.token_url)]},
        "localhost": {"upstream_proxy": {"url": parent.url}},
    }})
    r, _ = get(p, up, "/via-parent")
    assert r.status == 200, r
    [q] = ts.all_requests()
    assert q.method == "POST" and q.path.split("?")[0] == "/token", q
    [entry] = AccessLog(parent_log).wait_for(lambda e: e.get("method") == "POST" and "/token" in e.get("url", ""))
    assert entry["status"] == 200, entry
