"""Upstream TLS trust: the `trust:` evaluators (default,
revocation with CRLs and stapled OCSP, pinned_certificates, public_keys, composite,
disabled), the host → evaluator mapping and `tls.all_hosts_must_be_evaluated`, the
`upstream: {scheme: https}` upgrade for plain-HTTP clients, client certificates (mTLS),
routes to https upstreams, the access log's `trust_failure`, and TLS connection reuse.

Every upstream here is nginx with certificates made by `openssl` (tls_support.py). A trust
failure must be a 502 whose body is exactly
`sluice: TLS trust evaluation failed for upstream HOST:PORT (evaluator: NAME): REASON`,
the client connection must stay usable, and the origin must not have served the request
(its access log has no line for the request's unique tag).
"""

from __future__ import annotations

import datetime as dt
import base64
import json
import os
import queue
import re
import socket
import ssl
import threading
import time
import uuid
from urllib.parse import quote

import pytest

from faultservers import pick_port
from policy_support import AccessLog, run_check, set_sections, sighup, write_yaml
from rawhttp import RawConn, request_bytes
from support import HOST, connect_through, assert_sluice_error, port_open, run_curl, session_via, wait_until
from tls_support import (CA, TLSNginx, TLSServerSpec, handshake_figures, ocsp_status, openssl,
                         public_key_pem, self_signed)

CLIENT_KEY_PASS = "client key pass phrase 7"
TRUST_FAILED = "TLS trust evaluation failed"


# ------------------------------------------------------------------------------------------
# PKI and servers (once per module)
# ------------------------------------------------------------------------------------------

class TrustPKI:
    pass


@pytest.fixture(scope="module")
def tp(tmp_path_factory) -> TrustPKI:
    d = tmp_path_factory.mktemp("trust-pki")
    p = TrustPKI()
    p.dir = d
    now = dt.datetime.now(dt.timezone.utc)
    p.ca1 = CA(d / "ca1", "Sluice Trust CA One")
    p.ca2 = CA(d / "ca2", "Sluice Trust CA Two")
    p.ca3 = CA(d / "ca3", "Sluice Unrelated CA")
    p.good = p.ca1.issue("good", ["127.0.0.1", "localhost", "a.trust.localhost", "b.trust.localhost"])
    p.revoked = p.ca1.issue("revoked")
    p.expired = p.ca1.issue("expired", not_before=now - dt.timedelta(days=10), not_after=now - dt.timedelta(days=5))
    p.client = p.ca1.issue("client", client=True, passphrase=CLIENT_KEY_PASS, cn="sluice-e2e-client")
    p.future = p.ca1.issue("future", not_before=now + dt.timedelta(days=5), not_after=now + dt.timedelta(days=10))
    p.crl0 = p.ca1.crl("crl0.pem")          # CA one's CRL from before the revocation
    p.ca1.revoke(p.revoked)
    p.crl1 = p.ca1.crl("crl1.pem")
    p.crl3 = p.ca3.crl("crl3.pem")          # a CRL of an unrelated CA
    p.good2 = p.ca2.issue("good2")
    p.wrong_name = p.ca1.issue("wrong-name", ["wrong.test"])
    p.selfie = self_signed(d / "self", "selfie")
    p.self_wrong = self_signed(d / "self", "self-wrong", ["wrong.test"])
    p.ocsp_good = p.ca1.ocsp_response(p.good)
    assert ocsp_status(p.ocsp_good) == "good", ocsp_status(p.ocsp_good)
    p.ocsp_revoked = p.ca1.ocsp_response(p.revoked)
    assert ocsp_status(p.ocsp_revoked) == "revoked", ocsp_status(p.ocsp_revoked)
    # a certificate file in DER, and the leaf's public key alone, for public_keys entries
    p.good_der = d / "good.der"
    p.good_der.write_bytes(openssl(["x509", "-in", str(p.good.cert), "-outform", "DER"]))
    p.good_pubkey = public_key_pem(p.good, d / "good.pubkey.pem")
    return p


@pytest.fixture(scope="module")
def ts(tmp_path_factory, tp) -> TLSNginx:
    n = TLSNginx(tmp_path_factory.mktemp("trust-nginx"), [
        TLSServerSpec("good", tp.good.chain, tp.good.key),
        TLSServerSpec("stapled", tp.good.chain, tp.good.key, stapling_file=tp.ocsp_good),
        TLSServerSpec("mtls", tp.good.chain, tp.good.key, client_ca=tp.ca1.pem),
        TLSServerSpec("revoked", tp.revoked.chain, tp.revoked.key),
        TLSServerSpec("expired", tp.expired.chain, tp.expired.key),
        TLSServerSpec("future", tp.future.chain, tp.future.key),
        TLSServerSpec("stapled_revoked", tp.revoked.chain, tp.revoked.key, stapling_file=tp.ocsp_revoked),
        TLSServerSpec("self", tp.selfie.chain, tp.selfie.key),
        TLSServerSpec("self_wrong", tp.self_wrong.chain, tp.self_wrong.key),
        TLSServerSpec("ca2", tp.good2.chain, tp.good2.key),
        TLSServerSpec("wrong_name", tp.wrong_name.chain, tp.wrong_name.key),
    ])
    yield n
    n.stop()


@pytest.fixture
def counting_server(tmp_path, tp):
    """A fresh nginx (one TLS server, good leaf) whose log counts connections and handshakes."""
    n = TLSNginx(tmp_path / "count-nginx", [TLSServerSpec("count", tp.good.chain, tp.good.key)])
    yield n
    n.stop()


# ------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------

def tag() -> str:
    return "t=" + uuid.uuid4().hex[:16]


@pytest.fixture
def tproxy(sluice_factory, tmp_path, tp):
    """start(policies, tls=..., **top) -> (Sluice, AccessLog). tls.ca_file is CA one unless
    tls overrides it; every exchange goes to the returned access log."""
    def start(policies: dict | None = None, tls: dict | None = None, **top):
        log = AccessLog(tmp_path / f"access-{uuid.uuid4().hex[:6]}.log")
        cfg = {"tls": {"ca_file": str(tp.ca1.pem), **(tls or {})},
               "monitors": [{"access_log": {"path": str(log.path)}}]}
        if policies is not None:
            cfg["policies"] = policies
        cfg.update(top)
        return sluice_factory(cfg), log
    return start


def get(proxy, url: str, headers=None):
    with RawConn(HOST, proxy.port, timeout=20) as c:
        c.send(request_bytes("GET", url, headers))
        return c.read_response(timeout=20)


def expect_ok(proxy, server: TLSServerSpec, body: bytes, host: str = HOST, path: str = "/1k"):
    t = tag()
    r = get(proxy, server.url(f"{path}?{t}", host))
    assert r is not None and r.status == 200, f"{server.url(path, host)}: {r!r}"
    assert r.body == body, f"wrong body from {server.url(path, host)}: {r.body[:100]!r}"
    assert wait_until(lambda: len(server.lines_for(t)) == 1, 3), f"nginx log:\n{server.log_text()}"
    return r


def logged(server: TLSServerSpec, t: str, n: int = 1, timeout: float = 3.0) -> list:
    """The origin's log lines for tag t, once there are n of them (nginx writes the line
    after it has sent the response, so a client may see the response first)."""
    wait_until(lambda: len(server.lines_for(t)) >= n, timeout)
    return server.lines_for(t)


def trust_message(authority: str, evaluator: str, reason: str) -> str:
    return f"sluice: {TRUST_FAILED} for upstream {authority} (evaluator: {evaluator}): {reason}"


def assert_trust_failure(r, authority: str, evaluator: str, reason: str) -> None:
    """502 with the contract's one-line body. reason "untrusted certificate" matches the
    `untrusted certificate (<openssl text>)` form."""
    assert_sluice_error(r, 502, TRUST_FAILED)
    text = r.body.decode("utf-8").rstrip("\r\n")
    if reason == "untrusted certificate":
        prefix = trust_message(authority, evaluator, "untrusted certificate (")
        assert text.startswith(prefix) and text.endswith(")") and len(text) > len(prefix) + 1, \
            f"body {text!r}\n expected {prefix!r}<openssl text>)"
    else:
        assert text == trust_message(authority, evaluator, reason), \
            f"body {text!r}\n expected {trust_message(authority, evaluator, reason)!r}"


def expect_trust_failure(proxy, url: str, authority: str, evaluator: str, reason: str,
                         served=None, nginx=None) -> None:
    """Request url (a unique tag is added to its query), expect the trust failure, then check
    the connection is kept (a plain request to the session nginx works on it) and that the
    origin served nothing: `served(tag)` returns the origin's log lines for the tag."""
    t = tag()
    full = url + ("&" if "?" in url else "?") + t
    with RawConn(HOST, proxy.port, timeout=20) as c:
        c.send(request_bytes("GET", full))
        r = c.read_response(timeout=20)
        assert_trust_failure(r, authority, evaluator, reason)
        if nginx is not None:
            c.send(request_bytes("GET", nginx.url("/1k?after-trust-failure")))
            r2 = c.read_response(timeout=20)
            assert r2 is not None and r2.status == 200 and r2.body == nginx.file_1k, \
                f"connection not usable after the trust failure: {r2!r}"
    if served is not None:
        time.sleep(0.2)  # window: the origin must not serve (and log) the request in it
        lines = served(t)
        assert not lines, f"the origin served the request although trust failed: {lines}"


def session_nginx_served(nginx):
    def served(t: str) -> list[str]:
        try:
            text = (nginx.dir / "access.log").read_text("utf-8", "replace")
        except OSError:
            return []
        return [ln for ln in text.splitlines() if t in ln]
    return served


def fail(proxy, server: TLSServerSpec, evaluator: str, reason: str, nginx, host: str = HOST, path: str = "/1k"):
    expect_trust_failure(proxy, server.url(path, host), f"{host}:{server.port}", evaluator, reason,
                         served=server.lines_for, nginx=nginx)


# ------------------------------------------------------------------------------------------
# default
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("trust", ["default", {"default": True}, None], ids=["bare", "map", "implicit"])
def test_default_passes_with_tls_ca_file(sluice_factory, nginx, trust):
    pol = {HOST: {"trust": trust}} if trust is not None else {HOST: {"redirect": "do_not_follow"}}
    proxy = sluice_factory({"policies": pol})
    t = tag()
    r = get(proxy, nginx.tls_url(f"/1k?{t}"))
    assert r is not None and r.status == 200 and r.body == nginx.file_1k, r


def test_default_hostname_mismatch(sluice_factory, nginx):
    proxy = sluice_factory({"policies": {HOST: {"trust": "default"}}})
    expect_trust_failure(proxy, f"https://{HOST}:{nginx.https_wrong_name_port}/1k",
                         f"{HOST}:{nginx.https_wrong_name_port}", "default", "hostname mismatch",
                         served=session_nginx_served(nginx), nginx=nginx)


def test_implicit_default_also_checks_the_host_name(sluice_factory, nginx):
    """No trust section anywhere (all_hosts_must_be_evaluated false): the built-in default
    evaluator still verifies, and names itself `default`."""
    proxy = sluice_factory({})
    expect_trust_failure(proxy, f"https://{HOST}:{nginx.https_wrong_name_port}/1k",
                         f"{HOST}:{nginx.https_wrong_name_port}", "default", "hostname mismatch",
                         served=session_nginx_served(nginx), nginx=nginx)


def test_default_validate_host_false_accepts_another_name(sluice_factory, nginx):
    proxy = sluice_factory({"policies": {HOST: {"trust": {"default": True, "validate_host": False}}}})
    r = get(proxy, f"https://{HOST}:{nginx.https_wrong_name_port}/1k?{tag()}")
    assert r is not None and r.status == 200 and r.body == nginx.file_1k, r


def test_policy_ca_file_replaces_tls_ca_file(tproxy, tp, ts, nginx):
    """127.0.0.1 trusts only CA two (its own ca_file); localhost has no trust section and uses
    tls.ca_file (CA one). Both names reach the same servers."""
    proxy, _ = tproxy({HOST: {"trust": {"default": True, "ca_file": str(tp.ca2.pem)}}})
    expect_ok(proxy, ts["ca2"], ts.file_1k)
    fail(proxy, ts["good"], "default", "untrusted certificate", nginx)
    expect_ok(proxy, ts["good"], ts.file_1k, host="localhost")
    fail(proxy, ts["ca2"], "default", "untrusted certificate", nginx, host="localhost")


def test_default_expired_leaf(tproxy, ts, nginx):
    proxy, _ = tproxy({"default": {"trust": "default"}})
    fail(proxy, ts["expired"], "default", "certificate expired", nginx)


def test_default_not_yet_valid_leaf(tproxy, ts, nginx):
    proxy, _ = tproxy({"default": {"trust": "default"}})
    fail(proxy, ts["future"], "default", "certificate not yet valid", nginx)


def test_default_self_signed_unknown_is_untrusted(tproxy, ts, nginx):
    proxy, _ = tproxy({"default": {"trust": "default"}})
    fail(proxy, ts["self"], "default", "untrusted certificate", nginx)


# ------------------------------------------------------------------------------------------
# revocation
# ------------------------------------------------------------------------------------------

def test_crl_leaf_not_revoked_passes(tproxy, tp, ts):
    proxy, _ = tproxy({HOST: {"trust": {"revocation": [str(tp.crl1)]}}})
    expect_ok(proxy, ts["good"], ts.file_1k)


def test_crl_revoked_leaf_fails(tproxy, tp, ts, nginx):
    proxy, _ = tproxy({HOST: {"trust": {"revocation": [str(tp.crl1)]}}})
    fail(proxy, ts["revoked"], "revocation", "certificate revoked", nginx)
    expect_ok(proxy, ts["good"], ts.file_1k)  # the same CRL lets the unrevoked leaf through


def test_crl_list_without_the_issuers_crl_fails(tproxy, tp, ts, nginx):
    proxy, _ = tproxy({HOST: {"trust": {"revocation": [str(tp.crl3)]}}})
    fail(proxy, ts["good"], "revocation", "no CRL for the certificate's issuer", nginx)


def test_ocsp_require_without_stapling_fails(tproxy, tp, ts, nginx):
    proxy, _ = tproxy({HOST: {"trust": {"revocation": [str(tp.crl1)], "ocsp": "require"}}})
    fail(proxy, ts["good"], "revocation", "no OCSP response", nginx)


def test_ocsp_require_with_stapled_good_response_passes(tproxy, tp, ts):
    proxy, _ = tproxy({HOST: {"trust": {"revocation": [str(tp.crl1)], "ocsp": "require"}}})
    expect_ok(proxy, ts["stapled"], ts.file_1k)


def test_ocsp_require_with_stapled_revoked_response_fails(tproxy, tp, ts, nginx):
    """The CRL (from before the revocation) does not list the leaf; the stapled OCSP answer does."""
    proxy, _ = tproxy({HOST: {"trust": {"revocation": [str(tp.crl0)], "ocsp": "require"}}})
    fail(proxy, ts["stapled_revoked"], "revocation", "certificate revoked", nginx)
    expect_ok(proxy, ts["stapled"], ts.file_1k)


def test_ocsp_off_is_the_default(tproxy, tp, ts):
    proxy, _ = tproxy({HOST: {"trust": {"revocation": [str(tp.crl1)], "ocsp": "off"}}})
    expect_ok(proxy, ts["good"], ts.file_1k)


# ------------------------------------------------------------------------------------------
# pinned_certificates
# ------------------------------------------------------------------------------------------

def test_pinned_certificate_passes(tproxy, tp, ts):
    proxy, _ = tproxy({HOST: {"trust": {"pinned_certificates": [str(tp.good.cert)]}}})
    expect_ok(proxy, ts["good"], ts.file_1k)


def test_pinned_certificate_mismatch(tproxy, tp, ts, nginx):
    proxy, _ = tproxy({HOST: {"trust": {"pinned_certificates": [str(tp.good2.cert)]}}})
    fail(proxy, ts["good"], "pinned_certificates", "certificate pin mismatch", nginx)


def test_pinned_self_signed_needs_validate_chain_false(tproxy, tp, ts, nginx):
    on, _ = tproxy({HOST: {"trust": {"pinned_certificates": [str(tp.selfie.cert)], "validate_chain": False}}})
    expect_ok(on, ts["self"], ts.file_1k)
    off, _ = tproxy({HOST: {"trust": {"pinned_certificates": [str(tp.selfie.cert)]}}})
    fail(off, ts["self"], "pinned_certificates", "untrusted certificate", nginx)


def test_pinned_self_signed_still_validates_host(tproxy, tp, ts, nginx):
    """A pinned self-signed certificate for wrong.test: the name check still applies unless
    validate_host: false."""
    checked, _ = tproxy({HOST: {"trust": {"pinned_certificates": [str(tp.self_wrong.cert)],
                                          "validate_chain": False}}})
    fail(checked, ts["self_wrong"], "pinned_certificates", "hostname mismatch", nginx)
    unchecked, _ = tproxy({HOST: {"trust": {"pinned_certificates": [str(tp.self_wrong.cert)],
                                            "validate_chain": False, "validate_host": False}}})
    expect_ok(unchecked, ts["self_wrong"], ts.file_1k)


@pytest.mark.parametrize("evaluator", ["pinned_certificates", "public_keys"])
def test_pins_without_chain_validation_match_the_leaf_only(tproxy, tp, tmp_path, nginx, evaluator):
    """Without chain validation the handshake proves only the leaf's key, so an impostor that
    appends the (public) pinned certificate after its own self-signed leaf must fail."""
    impostor = self_signed(tmp_path / "impostor", "impostor")
    chain = tmp_path / "impostor-chain.pem"
    chain.write_bytes(impostor.cert.read_bytes() + tp.selfie.cert.read_bytes())
    n = TLSNginx(tmp_path / "impostor-nginx", [TLSServerSpec("impostor", chain, impostor.key)])
    try:
        pins = [str(tp.selfie.cert)] if evaluator == "pinned_certificates" else [tp.selfie.pin]
        reason = "certificate pin mismatch" if evaluator == "pinned_certificates" else "public key pin mismatch"
        proxy, _ = tproxy({HOST: {"trust": {evaluator: pins, "validate_chain": False}}})
        fail(proxy, n["impostor"], evaluator, reason, nginx)
    finally:
        n.stop()


# ------------------------------------------------------------------------------------------
# public_keys
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("form", ["sha256/", "sha256//"])
def test_public_key_leaf_pin_passes(tproxy, tp, ts, form):
    pin = tp.good.pin.replace("sha256/", form, 1)
    proxy, _ = tproxy({HOST: {"trust": {"public_keys": [pin]}}})
    expect_ok(proxy, ts["good"], ts.file_1k)


def test_public_key_pin_whose_base64_starts_with_slash(tproxy, tp, tmp_path):
    """`sha256/` + a base64 that itself starts with "/" (1 key in 64) is a plain pin, not the
    `sha256//` alias with a truncated digest: 44 base64 characters after `sha256/`."""
    cert = self_signed(tmp_path / "slash", "slash", slash_pin=True)
    assert cert.pin.startswith("sha256//") and len(cert.pin) == len("sha256/") + 44, cert.pin
    n = TLSNginx(tmp_path / "slash-nginx", [TLSServerSpec("slash", cert.chain, cert.key)])
    try:
        for pin in (cert.pin, "sha256//" + cert.pin[len("sha256/"):]):
            proxy, _ = tproxy({HOST: {"trust": {"public_keys": [pin], "validate_chain": False}}})
            expect_ok(proxy, n["slash"], n.file_1k)
    finally:
        n.stop()


def test_public_key_ca_pin_passes(tproxy, tp, ts):
    """Chain pinning: the CA's key is in the verified chain."""
    proxy, _ = tproxy({HOST: {"trust": {"public_keys": [tp.ca1.pin]}}})
    expect_ok(proxy, ts["good"], ts.file_1k)


@pytest.mark.parametrize("which", ["cert_pem", "cert_der", "pubkey_pem"])
def test_public_key_from_file_passes(tproxy, tp, ts, which):
    path = {"cert_pem": tp.good.cert, "cert_der": tp.good_der, "pubkey_pem": tp.good_pubkey}[which]
    proxy, _ = tproxy({HOST: {"trust": {"public_keys": [str(path)]}}})
    expect_ok(proxy, ts["good"], ts.file_1k)


def test_public_key_pin_mismatch(tproxy, tp, ts, nginx):
    proxy, _ = tproxy({HOST: {"trust": {"public_keys": [tp.good2.pin, tp.ca2.pin]}}})
    fail(proxy, ts["good"], "public_keys", "public key pin mismatch", nginx)


def test_public_key_pin_of_self_signed_without_chain_validation(tproxy, tp, ts, nginx):
    ok, _ = tproxy({HOST: {"trust": {"public_keys": [tp.selfie.pin], "validate_chain": False}}})
    expect_ok(ok, ts["self"], ts.file_1k)
    strict, _ = tproxy({HOST: {"trust": {"public_keys": [tp.selfie.pin]}}})
    fail(strict, ts["self"], "public_keys", "untrusted certificate", nginx)


# ------------------------------------------------------------------------------------------
# composite
# ------------------------------------------------------------------------------------------

def test_composite_default_and_public_keys_pass(tproxy, tp, ts):
    proxy, _ = tproxy({HOST: {"trust": {"composite": ["default", {"public_keys": [tp.good.pin]}]}}})
    expect_ok(proxy, ts["good"], ts.file_1k)


def test_composite_pin_member_fails(tproxy, tp, ts, nginx):
    proxy, _ = tproxy({HOST: {"trust": {"composite": ["default", {"public_keys": [tp.good2.pin]}]}}})
    fail(proxy, ts["good"], "composite(default, public_keys)", "public key pin mismatch", nginx)


def test_composite_default_member_fails(tproxy, tp, ts, nginx):
    """The pin matches the leaf (for wrong.test only), but the default member checks the name."""
    proxy, _ = tproxy({HOST: {"trust": {"composite": ["default", {"public_keys": [tp.wrong_name.pin]}]}}})
    fail(proxy, ts["wrong_name"], "composite(default, public_keys)", "hostname mismatch", nginx)


# ------------------------------------------------------------------------------------------
# disabled
# ------------------------------------------------------------------------------------------

def test_disabled_without_insecure_is_a_config_error(tmp_path):
    path = tmp_path / "disabled.yaml"
    path.write_text(f'listen: ["{HOST}:{pick_port()}"]\n'
                    "policies:\n"
                    f'  "{HOST}":\n'
                    "    trust: { disabled: true }\n")
    r = run_check(path)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "trust: disabled turns certificate verification off; add 'insecure: true' to say you mean it" in out, out
    assert re.search(re.escape(str(path)) + r":4:\d+", out) or re.search(r"disabled\.yaml:4:\d+", out), \
        f"no FILE:4:COL location in:\n{out}"


def test_disabled_with_insecure_accepts_anything_and_says_so(tproxy, ts, tp):
    proxy, log = tproxy({HOST: {"trust": {"disabled": True, "insecure": True}},
                         "localhost": {"trust": "default"}})
    expect_ok(proxy, ts["self"], ts.file_1k)
    expect_ok(proxy, ts["expired"], ts.file_1k)
    expect_ok(proxy, ts["self_wrong"], ts.file_1k)
    expect_ok(proxy, ts["good"], ts.file_1k, host="localhost")  # another policy: not insecure
    lines = log.wait_for(n=4)
    mine = [e for e in lines if e.get("policy") == HOST]
    other = [e for e in lines if e.get("policy") == "localhost"]
    assert len(mine) == 3 and len(other) == 1, lines
    for e in mine:
        assert e.get("insecure") is True, f"line under the disabled policy lacks \"insecure\": true: {e}"
    assert other[0].get("insecure") in (None, False), other[0]
    # a warning on stderr at start, naming the policy
    assert any(HOST in ln and ("disabled" in ln or "insecure" in ln) for ln in proxy.stderr().splitlines()), \
        f"no start-up warning naming policy {HOST}:\n{proxy.stderr()}"


# ------------------------------------------------------------------------------------------
# Host → evaluator mapping, all_hosts_must_be_evaluated
# ------------------------------------------------------------------------------------------

def test_exact_host_beats_wildcard_and_names_pick_evaluators(tproxy, tp, ts, nginx):
    proxy, _ = tproxy({
        "a.trust.localhost": {"trust": "default"},
        "*.trust.localhost": {"trust": {"public_keys": [tp.good2.pin]}},
        HOST: {"trust": {"pinned_certificates": [str(tp.good2.cert)]}},
        "localhost": {"trust": {"public_keys": [tp.good.pin]}},
    })
    expect_ok(proxy, ts["good"], ts.file_1k, host="a.trust.localhost")
    fail(proxy, ts["good"], "public_keys", "public key pin mismatch", nginx, host="b.trust.localhost")
    fail(proxy, ts["good"], "pinned_certificates", "certificate pin mismatch", nginx, host=HOST)
    expect_ok(proxy, ts["good"], ts.file_1k, host="localhost")


def test_all_hosts_must_be_evaluated(tproxy, ts, nginx):
    proxy, _ = tproxy({"localhost": {"trust": "default"}}, tls={"all_hosts_must_be_evaluated": True})
    server = ts["good"]
    t = tag()
    with RawConn(HOST, proxy.port, timeout=20) as c:
        c.send(request_bytes("GET", server.url(f"/1k?{t}")))
        r = c.read_response(timeout=20)
        assert_sluice_error(r, 502, TRUST_FAILED)
        assert r.body.decode().rstrip("\r\n") == (
            f"sluice: {TRUST_FAILED} for upstream {HOST}:{server.port} (evaluator: none): "
            "no trust evaluator is configured for this host (tls.all_hosts_must_be_evaluated)"), r.body
        c.send(request_bytes("GET", nginx.url("/1k?after")))
        r2 = c.read_response(timeout=20)
        assert r2 is not None and r2.status == 200, r2
    time.sleep(0.2)  # window: the unevaluated host must not serve (and log) the request in it
    assert server.lines_for(t) == [], "the unevaluated host was sent the request"
    expect_ok(proxy, server, ts.file_1k, host="localhost")


def test_all_hosts_must_be_evaluated_host_inherits_default_policy_trust(tproxy, ts):
    """A host entry without a trust section uses the default policy's: it is evaluated."""
    proxy, _ = tproxy({"default": {"trust": "default"}, HOST: {"redirect": "do_not_follow"}},
                      tls={"all_hosts_must_be_evaluated": True})
    expect_ok(proxy, ts["good"], ts.file_1k)
    expect_ok(proxy, ts["good"], ts.file_1k, host="localhost")


# ------------------------------------------------------------------------------------------
# upstream: { scheme: https } — plain-HTTP clients, TLS to the origin
# ------------------------------------------------------------------------------------------

def upgrade(pin: str, port: int | None = None) -> dict:
    up = {"scheme": "https"}
    if port is not None:
        up["port"] = port
    return {"localhost": {"upstream": up, "trust": {"public_keys": [pin]}}}


def test_upgrade_to_https_curl_and_requests(tproxy, tp, ts, tmp_path):
    proxy, log = tproxy(upgrade(tp.good.pin))
    server = ts["good"]
    t1, t2 = tag(), tag()
    url1 = f"http://localhost:{server.port}/1k?{t1}"
    out = tmp_path / "curl.out"
    r = run_curl(["-x", proxy.url, "-o", str(out), "-w", "%{http_code}", url1], timeout=20)
    assert r.returncode == 0 and r.stdout == b"200", (r.returncode, r.stdout, r.stderr)
    assert out.read_bytes() == ts.file_1k
    url2 = f"http://localhost:{server.port}/1k?{t2}"
    resp = session_via(proxy.url).get(url2, timeout=20)
    assert resp.status_code == 200 and resp.content == ts.file_1k, resp
    for t in (t1, t2):
        lines = logged(server, t)
        assert len(lines) == 1 and lines[0].status == 200, server.log_text()
        assert lines[0].protocol.startswith("TLS"), lines[0]
        assert lines[0].host == f"localhost:{server.port}", f"Host header changed: {lines[0]}"
    urls = sorted(e["url"] for e in log.wait_for(n=2))  # two workers may flush in either order
    assert urls == sorted([url1, url2]), f"the access log must keep the client's URL: {urls}"


def test_upgrade_to_https_with_wrong_pin_is_502(tproxy, tp, ts, nginx):
    proxy, _ = tproxy(upgrade(tp.good2.pin))
    server = ts["good"]
    expect_trust_failure(proxy, f"http://localhost:{server.port}/1k", f"localhost:{server.port}",
                         "public_keys", "public key pin mismatch", served=server.lines_for, nginx=nginx)
    # curl sees the same 502
    r = run_curl(["-x", proxy.url, "-w", "\n%{http_code}", f"http://localhost:{server.port}/1k?{tag()}"], timeout=20)
    body, _, code = r.stdout.rpartition(b"\n")
    assert code == b"502" and TRUST_FAILED.encode() in body, r.stdout


def test_upstream_override_never_downgrades_https(tproxy, ts, nginx):
    """`upstream: {scheme: http, port: P}` redirects plain-HTTP requests only: an https request
    for the host still goes to its own URL over TLS, verified."""
    proxy, _ = tproxy({HOST: {"upstream": {"scheme": "http", "port": nginx.http_port}}})
    expect_ok(proxy, ts["good"], ts.file_1k)


def test_upgrade_port_override(tproxy, tp, ts, closed_port):
    """The policy's port wins over the URL's port and over the default 443; Host stays the client's."""
    proxy, _ = tproxy(upgrade(tp.good.pin, port=ts["good"].port))
    server = ts["good"]
    s = session_via(proxy.url)
    hosts_seen = {}
    for authority in (f"localhost:{closed_port}", "localhost"):
        t = tag()
        r = s.get(f"http://{authority}/1k?{t}", timeout=20)
        assert r.status_code == 200 and r.content == ts.file_1k, (authority, r.status_code, r.content[:200])
        lines = logged(server, t)
        assert len(lines) == 1, server.log_text()
        hosts_seen[authority] = lines[0].host
    assert all(k == v for k, v in hosts_seen.items()), \
        f"Host header changed (client's Host -> what the origin on port {server.port} saw): {hosts_seen}"


def test_upgrade_scheme_http_is_identity(tproxy, nginx):
    proxy, _ = tproxy({HOST: {"upstream": {"scheme": "http"}}})
    r = session_via(proxy.url).get(nginx.url("/1k"), timeout=20)
    assert r.status_code == 200 and r.content == nginx.file_1k


# ------------------------------------------------------------------------------------------
# client_certificate (mTLS)
# ------------------------------------------------------------------------------------------

def client_cert(tp, passphrase_ref: str | None) -> dict:
    c = {"certificate": str(tp.client.cert), "key": str(tp.client.key)}
    if passphrase_ref is not None:
        c["passphrase"] = passphrase_ref
    return c


def test_mtls_without_client_certificate_nginx_refuses(tproxy, ts):
    proxy, _ = tproxy({HOST: {"trust": "default"}})
    server = ts["mtls"]
    t = tag()
    r = get(proxy, server.url(f"/whoami?{t}"))
    assert r is not None and r.status == 400, r
    assert b"No required SSL certificate was sent" in r.body, r
    lines = logged(server, t)
    assert len(lines) == 1 and lines[0].status == 400 and lines[0].client_dn == "-", server.log_text()


@pytest.mark.parametrize("source", ["env", "file"])
def test_mtls_with_client_certificate(tproxy, tp, ts, monkeypatch, tmp_path, source):
    if source == "env":
        monkeypatch.setenv("E2E_CLIENT_KEY_PASS", CLIENT_KEY_PASS)
        ref = "${E2E_CLIENT_KEY_PASS}"
    else:
        f = tmp_path / "client-key-pass"
        f.write_text(CLIENT_KEY_PASS + "\n")
        ref = f"file:{f}"
    proxy, log = tproxy({HOST: {"trust": "default", "client_certificate": client_cert(tp, ref)}})
    server = ts["mtls"]
    t = tag()
    r = get(proxy, server.url(f"/whoami?{t}"))
    assert r is not None and r.status == 200, r
    assert b"CN=sluice-e2e-client" in r.body, r
    assert "CN=sluice-e2e-client" in (r.header("X-Client-DN") or ""), r
    lines = logged(server, t)
    assert len(lines) == 1 and "CN=sluice-e2e-client" in lines[0].client_dn, server.log_text()
    log.wait_for()
    for text, where in ((proxy.stderr(), "stderr"), (proxy.stdout(), "stdout"), (log.text(), "access log")):
        assert CLIENT_KEY_PASS not in text, f"the key passphrase appears in {where}"


def test_mtls_client_certificate_off_in_host_overrides_default(tproxy, tp, ts, monkeypatch):
    monkeypatch.setenv("E2E_CLIENT_KEY_PASS", CLIENT_KEY_PASS)
    proxy, _ = tproxy({"default": {"client_certificate": client_cert(tp, "${E2E_CLIENT_KEY_PASS}")},
                       HOST: {"client_certificate": "off"}})
    server = ts["mtls"]
    r = get(proxy, server.url(f"/whoami?{tag()}", "localhost"))
    assert r is not None and r.status == 200 and b"CN=sluice-e2e-client" in r.body, r
    r = get(proxy, server.url(f"/whoami?{tag()}"))
    assert r is not None and r.status == 400 and b"No required SSL certificate" in r.body, r


# ------------------------------------------------------------------------------------------
# routes to https upstreams
# ------------------------------------------------------------------------------------------

def test_route_to_https_upstream_uses_that_hosts_trust(tproxy, tp, ts):
    server = ts["good"]
    bad_route, good_route = pick_port(), pick_port()
    proxy, _ = tproxy({"localhost": {"trust": {"public_keys": [tp.good2.pin]}},
                       HOST: {"trust": {"public_keys": [tp.good.pin]}}},
                      routes=[{"listen": f"{HOST}:{bad_route}", "upstream": f"https://localhost:{server.port}"},
                              {"listen": f"{HOST}:{good_route}", "upstream": f"https://{HOST}:{server.port}/"}])
    assert wait_until(lambda: port_open(bad_route) and port_open(good_route), 5), "route listeners not open"
    t = tag()
    with RawConn(HOST, bad_route, timeout=20) as c:
        c.send(request_bytes("GET", f"/1k?{t}", host=f"{HOST}:{bad_route}"))
        r = c.read_response(timeout=20)
    assert_trust_failure(r, f"localhost:{server.port}", "public_keys", "public key pin mismatch")
    time.sleep(0.2)  # window: the origin that failed trust must not serve (and log) the request in it
    assert server.lines_for(t) == [], server.log_text()
    t = tag()
    with RawConn(HOST, good_route, timeout=20) as c:
        c.send(request_bytes("GET", f"/1k?{t}", host=f"{HOST}:{good_route}"))
        r = c.read_response(timeout=20)
    assert r is not None and r.status == 200 and r.body == ts.file_1k, r
    assert len(logged(server, t)) == 1


# ------------------------------------------------------------------------------------------
# access log
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["public_keys", "expired"])
def test_access_log_trust_failure_not_retried(tproxy, tp, ts, case):
    trust, server, evaluator, reason = {
        "public_keys": ({"public_keys": [tp.good2.pin]}, "good", "public_keys", "public key pin mismatch"),
        "expired": ("default", "expired", "default", "certificate expired"),
    }[case]
    proxy, log = tproxy({HOST: {"trust": trust, "retry": {"limit": 2, "backoff": {"scale": "10ms"}}}})
    url = ts[server].url(f"/1k?{tag()}")
    r = get(proxy, url)
    assert_trust_failure(r, f"{HOST}:{ts[server].port}", evaluator, reason)
    e = log.wait_for()[0]
    assert e["status"] == 502 and e["outcome"] == "error", e
    assert e["url"] == url and e["policy"] == HOST, e
    assert e.get("trust_failure") == {"evaluator": evaluator, "reason": reason}, e
    err = e.get("error") or ""
    assert TRUST_FAILED in err and reason in err and f"(evaluator: {evaluator})" in err, e
    assert e["attempts"] == 1, f"a trust failure must not be retried: {e}"
    assert not e.get("retries"), e


def test_access_log_no_trust_failure_field_on_success(tproxy, tp, ts):
    proxy, log = tproxy({HOST: {"trust": {"public_keys": [tp.good.pin]}}})
    expect_ok(proxy, ts["good"], ts.file_1k)
    e = log.wait_for()[0]
    assert e["status"] == 200 and e["outcome"] == "ok" and not e.get("trust_failure"), e
    assert e.get("insecure") in (None, False), e


# ------------------------------------------------------------------------------------------
# sluice check: the documented forms, and errors at the node
# ------------------------------------------------------------------------------------------

def test_check_accepts_every_documented_form(tmp_path, tp, monkeypatch):
    monkeypatch.setenv("E2E_CLIENT_KEY_PASS", CLIENT_KEY_PASS)
    cfg = {
        "listen": [f"{HOST}:{pick_port()}"],
        "tls": {"ca_file": str(tp.ca1.pem), "all_hosts_must_be_evaluated": False},
        "policies": {
            "default": {"trust": "default"},
            "h1.example": {"trust": {"default": True, "ca_file": str(tp.ca2.pem), "validate_host": True}},
            "h2.example": {"trust": {"revocation": [str(tp.crl1)], "ocsp": "require"}},
            "h3.example": {"trust": {"revocation": [], "ocsp": "require"}},
            "h4.example": {"trust": {"pinned_certificates": [str(tp.good.cert)], "validate_chain": False,
                                     "validate_host": True}},
            "h5.example": {"trust": {"public_keys": [tp.good.pin, tp.good.pin.replace("sha256/", "sha256//"),
                                                     str(tp.good.cert), str(tp.good_der), str(tp.good_pubkey)],
                                     "validate_chain": True}},
            "h6.example": {"trust": {"composite": ["default", {"public_keys": [tp.ca1.pin]}]}},
            "h7.example": {"trust": {"disabled": True, "insecure": True}},
            "h8.example": {"upstream": {"scheme": "https", "port": 8443},
                           "client_certificate": client_cert(tp, "${E2E_CLIENT_KEY_PASS}")},
            "*.h9.example": {"upstream": {"scheme": "http"}, "client_certificate": "off"},
        },
    }
    r = run_check(write_yaml(tmp_path / "forms.yaml", cfg))
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    assert CLIENT_KEY_PASS not in r.stdout + r.stderr


def _bad_cases(tp, tmp_path):
    text_file = tmp_path / "not-a-cert.pem"
    text_file.write_text("hello, no certificate here\n")
    return {
        "unknown_evaluator": ('{"pinned_certificate": ["%s"]}' % tp.good.cert, ["pinned_certificates"]),
        "unknown_bare_word": ("defualt", ["default"]),
        "missing_file": ('{"pinned_certificates": ["/nonexistent/e2e/pin.pem"]}', []),
        "missing_ca_file": ('{"default": true, "ca_file": "/nonexistent/e2e/ca.pem"}', ["ca_file"]),
        "malformed_pin": ('{"public_keys": ["sha256/not*base64*at*all"]}', []),
        "pin_wrong_length": ('{"public_keys": ["sha256/AAAA"]}', []),
        "no_certificate_in_file": ('{"pinned_certificates": ["%s"]}' % text_file, []),
        "no_crl_in_file": ('{"revocation": ["%s"]}' % tp.good.cert, []),
        "bad_ocsp": ('{"revocation": ["%s"], "ocsp": "sometimes"}' % tp.crl1, []),
        "option_on_wrong_evaluator": ('{"default": true, "validate_chain": false}', ["validate_chain"]),
    }


BAD_CASE_IDS = ["unknown_evaluator", "unknown_bare_word", "missing_file", "missing_ca_file", "malformed_pin",
                "pin_wrong_length", "no_certificate_in_file", "no_crl_in_file", "bad_ocsp",
                "option_on_wrong_evaluator"]


@pytest.mark.parametrize("case", BAD_CASE_IDS)
def test_check_rejects_bad_trust_at_the_node(tmp_path, tp, case):
    trust, phrases = _bad_cases(tp, tmp_path)[case]
    path = tmp_path / "bad.yaml"
    path.write_text(f'listen: ["{HOST}:{pick_port()}"]\n'
                    "policies:\n"
                    f'  "{HOST}":\n'
                    f"    trust: {trust}\n")
    r = run_check(path)
    out = r.stdout + r.stderr
    assert r.returncode != 0, f"accepted:\n{path.read_text()}\n{out}"
    assert re.search(r"bad\.yaml:4:\d+", out), f"no bad.yaml:4:COL in:\n{out}"
    for p in phrases:
        assert p in out, f"{p!r} not in:\n{out}"


def test_check_rejects_missing_client_certificate_file(tmp_path, tp):
    path = tmp_path / "bad.yaml"
    path.write_text(f'listen: ["{HOST}:{pick_port()}"]\n'
                    "policies:\n"
                    f'  "{HOST}":\n'
                    "    client_certificate:\n"
                    f"      certificate: {tp.client.cert}\n"
                    "      key: /nonexistent/e2e/client.key\n")
    r = run_check(path)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert re.search(r"bad\.yaml:6:\d+: .*key", out), f"no error at the key node (bad.yaml:6:COL):\n{out}"


# ------------------------------------------------------------------------------------------
# TLS connection reuse to the origin
# ------------------------------------------------------------------------------------------

REUSE_N = 1000


@pytest.mark.deadline(120)
def test_tls_reuse_sequential_over_one_client_connection(tproxy, counting_server):
    proxy, _ = tproxy({HOST: {"trust": "default"}}, workers=1)
    server = counting_server["count"]
    t = tag()
    started = time.monotonic()
    deadline = started + 90
    with RawConn(HOST, proxy.port, timeout=20) as c:
        for i in range(REUSE_N):
            assert time.monotonic() < deadline, f"only {i} requests in 90 s"
            c.send(request_bytes("GET", server.url(f"/1k?{t}&i={i}")))
            r = c.read_response(timeout=20)
            assert r is not None and r.status == 200 and r.body == counting_server.file_1k, (i, r)
    elapsed = time.monotonic() - started
    assert wait_until(lambda: len(server.lines_for(t)) >= REUSE_N, 5), len(server.lines_for(t))
    figs = handshake_figures(server.lines_for(t))
    print(f"\nTLS reuse, sequential (workers: 1, 1 client connection): {figs}, {elapsed:.1f} s")
    assert figs["requests"] == REUSE_N, figs
    assert figs["handshakes"] <= 4, f"upstream TLS connections were not reused: {figs}"


@pytest.mark.deadline(150)
def test_tls_reuse_concurrent_clients(tproxy, counting_server):
    workers, clients = 2, 64
    proxy, _ = tproxy({"localhost": {"upstream": {"scheme": "https"}, "trust": "default"}}, workers=workers)
    server = counting_server["count"]
    t = tag()
    todo: queue.Queue[int] = queue.Queue()
    for i in range(REUSE_N):
        todo.put(i)
    errors: list[str] = []
    barrier = threading.Barrier(clients)
    started = time.monotonic()
    deadline = started + 100

    def client():
        s = session_via(proxy.url)
        try:
            barrier.wait(15)
        except threading.BrokenBarrierError:
            pass
        try:
            while time.monotonic() < deadline and len(errors) < 20:
                try:
                    i = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    r = s.get(f"http://localhost:{server.port}/1k?{t}&i={i}", timeout=20)
                    if r.status_code != 200 or r.content != counting_server.file_1k:
                        errors.append(f"#{i}: {r.status_code} {r.content[:200]!r}")
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(f"#{i}: {e!r}")
        finally:
            s.close()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(max(0.1, deadline + 5 - time.monotonic()))
    elapsed = time.monotonic() - started
    assert not any(th.is_alive() for th in threads), "client threads still running after the deadline"
    assert not errors, errors[:10]
    assert todo.empty(), f"{todo.qsize()} requests not sent within the time limit"
    assert wait_until(lambda: len(server.lines_for(t)) >= REUSE_N, 5), len(server.lines_for(t))
    figs = handshake_figures(server.lines_for(t))
    print(f"\nTLS reuse, concurrent ({clients} client connections, workers: {workers}): {figs}, {elapsed:.1f} s")
    assert figs["requests"] == REUSE_N, figs
    # Each client connection needs at most one upstream connection at a time, per pool: the
    # first burst to an origin goes through libcurl (which asks it for h2 by ALPN); once it
    # chose HTTP/1.1 the native transport's pool takes over, with connections of its own.
    bound = 2 * (workers + clients)
    assert figs["handshakes"] <= bound, f"more than {bound} upstream TLS handshakes: {figs}"


# ------------------------------------------------------------------------------------------
# CONNECT tunnels are not evaluated; reload replaces trust, pooled connections included
# ------------------------------------------------------------------------------------------

def test_connect_tunnel_is_unaffected_by_trust(tproxy, tp, ts):
    """A CONNECT to a host whose trust would fail is still tunnelled byte-for-byte: the client
    sees the origin's own certificate (no interception configured)."""
    server = ts["good"]
    proxy, _ = tproxy({HOST: {"trust": {"public_keys": [tp.good2.pin]}}},
                      access={"connect_ports": [server.port]})
    raw = socket.create_connection((HOST, proxy.port), timeout=10)
    try:
        head = connect_through(raw, f"{HOST}:{server.port}")
        assert head.startswith(b"HTTP/1.1 200"), head
        ctx = ssl.create_default_context(cafile=str(tp.ca1.pem))
        tls = ctx.wrap_socket(raw, server_hostname=HOST)
        der = tls.getpeercert(binary_form=True)
        assert der == tp.good_der.read_bytes(), "the tunnel did not present the origin's own certificate"
        t = tag()
        tls.sendall(f"GET /1k?{t} HTTP/1.1\r\nHost: {HOST}:{server.port}\r\nConnection: close\r\n\r\n".encode())
        got = b""
        while len(got) < 1 << 20:
            d = tls.recv(65536)
            if not d:
                break
            got += d
        assert got.startswith(b"HTTP/1.1 200") and got.endswith(ts.file_1k), got[:300]
        tls.close()
    finally:
        raw.close()


@pytest.mark.parametrize("direction", ["pass_then_fail", "fail_then_pass"])
def test_reload_replaces_trust_for_pooled_connections(tproxy, tp, ts, httpbin, direction):
    """After SIGHUP the new trust applies to the next request on the same client connection,
    even though an upstream connection to the origin is pooled from before the reload."""
    good, bad = {"public_keys": [tp.good.pin]}, {"public_keys": [tp.good2.pin]}
    first, second = (good, bad) if direction == "pass_then_fail" else (bad, good)

    def policies(trust, gen):
        return {"default": {"adapters": [{"headers": {"set": {"X-Gen": gen}}}]}, HOST: {"trust": trust}}

    proxy, _ = tproxy(policies(first, "one"), workers=1)
    server, fresh = ts["good"], ts["stapled"]  # same leaf; only `server` is used before the reload
    with RawConn(HOST, proxy.port, timeout=20) as c:
        def fetch(srv):
            t = tag()
            c.send(request_bytes("GET", srv.url(f"/1k?{t}")))
            return c.read_response(timeout=20), t

        r, t = fetch(server)
        if first is good:
            assert r.status == 200 and r.body == ts.file_1k, r
        else:
            assert_trust_failure(r, f"{HOST}:{server.port}", "public_keys", "public key pin mismatch")
        set_sections(proxy, policies=policies(second, "two"))
        sighup(proxy)

        def gen():
            c.send(request_bytes("GET", httpbin.url + "/headers"))
            rr = c.read_response(timeout=20)
            return json.loads(rr.body)["headers"].get("X-Gen") if rr is not None and rr.status == 200 else None

        assert wait_until(lambda: gen() == "two", 5, 0.1), f"reload not applied:\n{proxy.stderr()}"
        r_fresh, t_fresh = fetch(fresh)     # no pooled connection to this port
        r, t = fetch(server)                # a connection from before the reload may be pooled
        if second is good:
            assert r_fresh.status == 200 and r_fresh.body == ts.file_1k, r_fresh
            assert r.status == 200 and r.body == ts.file_1k, r
        else:
            assert_trust_failure(r_fresh, f"{HOST}:{fresh.port}", "public_keys", "public key pin mismatch")
            served = server.lines_for(t)
            assert r.status == 502 and not served, (
                f"the new trust (wrong pin) applied to a new upstream connection but not to the pooled one: "
                f"got {r.status}; origin log for the request: {served}; origin log:\n{server.log_text()}")
            assert_trust_failure(r, f"{HOST}:{server.port}", "public_keys", "public key pin mismatch")


# ------------------------------------------------------------------------------------------
# Redirects followed by Sluice: each hop is evaluated by the trust of its own host
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("pin_ok", [True, False], ids=["target_pin_ok", "target_pin_wrong"])
def test_followed_redirect_uses_the_targets_trust(tproxy, tp, ts, httpbin, pin_ok):
    server = ts["good"]
    t = tag()
    target = server.url(f"/1k?{t}", "localhost")
    proxy, log = tproxy({
        HOST: {"redirect": {"follow": {"max": 5}}},   # httpbin's host; its own trust is the default
        "localhost": {"trust": {"public_keys": [tp.good.pin if pin_ok else tp.good2.pin]}},
    })
    r = get(proxy, f"{httpbin.url}/redirect-to?url={quote(target, safe='')}")
    if pin_ok:
        assert r is not None and r.status == 200 and r.body == ts.file_1k, r
        assert len(logged(server, t)) == 1
    else:
        assert_trust_failure(r, f"localhost:{server.port}", "public_keys", "public key pin mismatch")
        time.sleep(0.2)  # window: the redirect target that failed trust must not serve (and log) the request
        assert server.lines_for(t) == [], f"the redirect target was served despite its trust: {server.log_text()}"
        e = log.wait_for()[0]
        assert e.get("trust_failure") == {"evaluator": "public_keys", "reason": "public key pin mismatch"}, e


# ------------------------------------------------------------------------------------------
# The OAuth token endpoint is evaluated like any upstream
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("pin_ok", [True, False], ids=["right-pin", "wrong-pin"])
def test_token_endpoint_uses_its_hosts_trust(tproxy, tp, ts, httpbin, monkeypatch, pin_ok):
    """The token POST goes to https://localhost:PORT/token under localhost's trust; the
    request itself goes to httpbin over plain HTTP (127.0.0.1)."""
    monkeypatch.setenv("E2E_TRUST_OAUTH_SECRET", "trust-oauth-secret")
    token_url = ts["good"].url("/token", "localhost")
    pin = tp.good.pin if pin_ok else "sha256/" + base64.b64encode(b"\x07" * 32).decode()
    proxy, _ = tproxy({
        "localhost": {"trust": {"public_keys": [pin]}},
        HOST: {"adapters": [{"oauth2": {"grant": "client_credentials", "token_url": token_url,
                                        "client_id": "trust-e2e", "client_secret": "${E2E_TRUST_OAUTH_SECRET}"}}]},
    })
    r = get(proxy, f"http://{HOST}:{httpbin.port}/headers")
    if pin_ok:
        assert r is not None and r.status == 200, r
        assert json.loads(r.body)["headers"].get("Authorization") == "Bearer tls-token-1", r.body
    else:
        assert r is not None and r.status == 502, r
        body = r.body.decode()
        assert "adapter oauth2 failed" in body, body
        assert "TLS trust evaluation failed" in body and "public key pin mismatch" in body, body
        assert "trust-oauth-secret" not in body


# ------------------------------------------------------------------------------------------
# The shared cache and trust (docs/caching.md, "https entries and reloads")
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("tier", ["memory", "disk"])
def test_cached_https_entry_does_not_outlive_a_trust_change(tproxy, ts, tmp_path, tier):
    cache = {"modify": {"freshness": "1m"}}
    if tier == "memory":
        store, path, body = {"memory": "16MiB"}, "/1k", ts.file_1k
    else:
        # memory keeps bodies up to 1/8 of its size: 256 KiB goes to disk
        store = {"memory": "1MiB", "disk": {"path": str(tmp_path / "disk"), "size": "16MiB"}}
        path, body = "/256k", os.urandom(256 * 1024)
        (ts.www / "256k").write_bytes(body)
    proxy, log = tproxy({HOST: {"trust": {"disabled": True, "insecure": True}, "cache": cache}},
                        cache_store=store)
    t = tag()
    url = ts["self"].url(f"{path}?{t}")
    first, hit = get(proxy, url), get(proxy, url)
    assert first.status == 200 and hit.status == 200 and hit.body == body
    # a disk entry this process wrote under the current trust is a hit too (not validated)
    assert hit.header("cache-status").startswith("Sluice; hit"), hit.headers
    assert ("detail=disk" in hit.header("cache-status")) == (tier == "disk"), hit.headers
    # nginx writes its access-log line after the response: wait for it (one request reached it)
    assert wait_until(lambda: len(ts["self"].lines_for(t)) == 1, 5), ts["self"].lines_for(t)
    lines = log.wait_for(n=2)
    assert all(e.get("insecure") is True for e in lines), f"a hit under insecure trust is not marked: {lines}"
    # The reload makes the self-signed origin untrusted: the stored copy must not answer for it.
    set_sections(proxy, policies={HOST: {"trust": "default", "cache": cache}})
    sighup(proxy)
    last = []

    def refused():
        last[:] = [get(proxy, url)]
        return last[0].status == 502
    assert wait_until(refused, 10, 0.2), f"still answered after the reload: {last[0]!r}"
    assert_trust_failure(last[0], f"{HOST}:{ts['self'].port}", "default", "untrusted certificate")
    assert len(ts["self"].lines_for(t)) == 1
