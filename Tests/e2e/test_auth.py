"""HTTP authentication (docs/configuration.md, "HTTP authentication (`credentials`)"): Sluice
answers 401 challenges for Basic (RFC 7617) and Digest (RFC 7616) like Alamofire's
`authenticate(username:password:)` — the first request goes without credentials, the
challenge is answered once, a request body is replayed for the second request when it fits in
`retry.buffer_limit` (1 MiB without a retry section), and the password never shows in any
output.

httpbin's /basic-auth and /digest-auth are the reference servers; a scripted FaultUpstream
shows exactly what went over the wire.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets as pysecrets

import pytest

from policy_support import run_check, write_yaml
from resilience_servers import Reply
from resilience_support import fault, fetch, log_entry, retry_cfg, settle_no_more_tries, start_proxy  # noqa: F401
from support import HOST

KiB = 1024


def b64(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


def creds(user: str = "u", password: str = "p") -> dict:
    return {"credentials": {"username": user, "password": password}}


def basic_gate(user: str, password: str, scheme: str = 'Basic realm="e2e"'):
    """A per-try decision: 200 for the right Basic credentials, else a 401 challenge."""
    want = "Basic " + b64(user, password)

    def decide(t):
        if t.header("Authorization") == want:
            return Reply(200, body=f"welcome {user}, try {t.n}".encode())
        return Reply(401, body=f"who are you? try {t.n}".encode(), headers=[("WWW-Authenticate", scheme)])
    return decide


@pytest.fixture
def cred_env(monkeypatch):
    pw = f"pwCRED{pysecrets.token_hex(8)}"
    monkeypatch.setenv("E2E_CRED_PASSWORD", pw)
    return pw


# ------------------------------------------------------------------------------------------
# Configuration
# ------------------------------------------------------------------------------------------

def test_check_accepts_credentials_and_redacts_the_password(tmp_path, cred_env):
    cfg = write_yaml(tmp_path / "creds.yaml", {
        "listen": ["127.0.0.1:23997"],
        "policies": {"api.example.com": {"credentials": {"username": "svc", "password": "${E2E_CRED_PASSWORD}"}},
                     HOST: {"credentials": {"username": "u", "password": "plain"},
                            "retry": {"buffer_limit": "64KiB"}}}})
    r = run_check(cfg)
    assert r.returncode == 0, r.stdout + r.stderr
    r = run_check(cfg, host="api.example.com")
    assert r.returncode == 0, r.stdout + r.stderr
    assert cred_env not in r.stdout + r.stderr, f"password printed by check --host:\n{r.stdout}"


def test_check_rejects_credentials_without_password(tmp_path):
    cfg = write_yaml(tmp_path / "creds-bad.yaml", {"listen": ["127.0.0.1:23996"],
                                                   "policies": {HOST: {"credentials": {"username": "u"}}}})
    r = run_check(cfg)
    assert r.returncode == 1 and "password" in (r.stdout + r.stderr), r.stdout + r.stderr


# ------------------------------------------------------------------------------------------
# httpbin: Basic and Digest
# ------------------------------------------------------------------------------------------

def test_basic_challenge_answered_httpbin(sluice_factory, tmp_path, httpbin):
    p = start_proxy(sluice_factory, tmp_path, creds("u", "p"))
    r, _ = fetch(p, "GET", httpbin.url + "/basic-auth/u/p")
    assert r.status == 200, r
    assert json.loads(r.body) == {"authenticated": True, "user": "u"}, r.body


@pytest.mark.parametrize("suffix", ["", "/MD5", "/SHA-256"])
def test_digest_challenge_answered_httpbin(sluice_factory, tmp_path, httpbin, suffix):
    p = start_proxy(sluice_factory, tmp_path, creds("u", "p"))
    r, _ = fetch(p, "GET", httpbin.url + f"/digest-auth/auth/u/p{suffix}")
    assert r.status == 200, r
    assert json.loads(r.body) == {"authenticated": True, "user": "u"}, r.body


@pytest.mark.parametrize("path", ["/basic-auth/u/p", "/digest-auth/auth/u/p"])
def test_wrong_password_gets_the_401_through(sluice_factory, tmp_path, httpbin, path):
    p = start_proxy(sluice_factory, tmp_path, creds("u", "wrong"))
    r, _ = fetch(p, "GET", httpbin.url + path)
    assert r.status == 401, r
    assert r.header("WWW-Authenticate"), f"the upstream's challenge must reach the client: {r!r}"


# ------------------------------------------------------------------------------------------
# On the wire
# ------------------------------------------------------------------------------------------

def test_first_request_without_credentials_then_one_answer(sluice_factory, tmp_path, fault):
    url = fault.script("/gate", [], basic_gate("svc", "s3cret"))
    p = start_proxy(sluice_factory, tmp_path, creds("svc", "s3cret"))
    r, _ = fetch(p, "GET", url)
    assert r.status == 200 and r.body == b"welcome svc, try 2", r
    tries = settle_no_more_tries(fault, "/gate", 2)
    assert tries[0].header("Authorization") is None, "credentials must not be sent before a challenge"
    assert tries[1].header("Authorization") == "Basic " + b64("svc", "s3cret"), tries[1].raw_head


def test_challenge_is_answered_only_once(sluice_factory, tmp_path, fault):
    url = fault.script("/gate-wrong", [], basic_gate("svc", "right"))
    p = start_proxy(sluice_factory, tmp_path, creds("svc", "wrong"))
    r, _ = fetch(p, "GET", url)
    assert r.status == 401 and r.body == b"who are you? try 2", f"the second 401 goes to the client unchanged: {r!r}"
    assert r.header("WWW-Authenticate") == 'Basic realm="e2e"', r
    settle_no_more_tries(fault, "/gate-wrong", 2)


def test_no_challenge_no_credentials(sluice_factory, tmp_path, fault):
    url = fault.always("/open", Reply(200, body=b"open"))
    p = start_proxy(sluice_factory, tmp_path, creds("svc", "s3cret"))
    r, _ = fetch(p, "GET", url)
    assert r.status == 200 and r.body == b"open", r
    t = settle_no_more_tries(fault, "/open", 1)[0]
    assert t.header("Authorization") is None, t.raw_head


def test_other_schemes_are_not_answered(sluice_factory, tmp_path, fault):
    url = fault.script("/bearer-challenge", [], basic_gate("svc", "s3cret", scheme='Bearer realm="api"'))
    p = start_proxy(sluice_factory, tmp_path, creds("svc", "s3cret"))
    r, _ = fetch(p, "GET", url)
    assert r.status == 401 and r.header("WWW-Authenticate") == 'Bearer realm="api"', r
    t = settle_no_more_tries(fault, "/bearer-challenge", 1)[0]
    assert t.header("Authorization") is None


def test_body_replayed_for_the_answer(sluice_factory, tmp_path, fault):
    url = fault.script("/gate-post", [], basic_gate("svc", "s3cret"))
    p = start_proxy(sluice_factory, tmp_path, creds("svc", "s3cret"))
    body = os.urandom(100 * KiB)
    r, _ = fetch(p, "POST", url, {"Content-Type": "application/octet-stream"}, body)
    assert r.status == 200, r
    tries = settle_no_more_tries(fault, "/gate-post", 2)
    want = hashlib.sha256(body).hexdigest()
    assert [t.sha256 for t in tries] == [want, want], [len(t.body) for t in tries]
    assert all(t.method == "POST" for t in tries)


def test_body_over_buffer_limit_is_not_replayed(sluice_factory, tmp_path, fault):
    url = fault.script("/gate-big", [], basic_gate("svc", "s3cret"))
    p = start_proxy(sluice_factory, tmp_path, {**creds("svc", "s3cret"),
                                               "retry": retry_cfg(limit=1, scale="50ms", buffer_limit="16KiB")})
    body = os.urandom(64 * KiB)
    r, _ = fetch(p, "POST", url, {"Content-Type": "application/octet-stream"}, body)
    assert r.status == 401 and r.body == b"who are you? try 1", r
    t = settle_no_more_tries(fault, "/gate-big", 1)[0]
    assert t.sha256 == hashlib.sha256(body).hexdigest(), "the body must still stream to the upstream intact"


def test_password_never_in_any_output(sluice_factory, tmp_path, fault, cred_env):
    url = fault.script("/gate-secret", [], basic_gate("svc", cred_env))
    wrong = fault.script("/gate-secret-401", [], basic_gate("svc", "other"))
    p = start_proxy(sluice_factory, tmp_path, {"credentials": {"username": "svc", "password": "${E2E_CRED_PASSWORD}"}},
                    debug=True)
    r, _ = fetch(p, "GET", url)
    assert r.status == 200, r
    r, _ = fetch(p, "POST", wrong, body=b"x" * 100)
    assert r.status == 401, r
    log_entry(p, "/gate-secret-401")
    assert len(fault.tries("/gate-secret")) == 2
    out = p.all_output()
    for v in (cred_env, b64("svc", cred_env)):
        assert v not in out, f"secret {v!r} appears in Sluice's output"
    assert "debug" in p.debug_text(), "the debug monitor wrote nothing"
