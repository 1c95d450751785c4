"""Request signers (adapters `aws_sigv4` and `http_signature`): every request Sluice signs is
checked by an origin that verifies it with an independent implementation (signing_origins.py:
botocore for AWS Signature Version 4, the `http-message-signatures` package for RFC 9421),
and by moto's S3 with its signature checking on. The signers run on every try, after every
other adapter: each retry and each followed redirect gets a fresh date and a new signature.

  aws_sigv4       GET (s3, and another service whose path is encoded twice), a PUT body
                  hashed into x-amz-content-sha256, a query that needs encoding, a retry after
                  503, a followed 307, `payload: unsigned` with a chunked upload, a session
                  token (environment and inline credentials), a shared credentials file and
                  profile, a client's Authorization replaced, `max_body` (413, nothing sent);
                  moto: PUT and GET an object through Sluice with a client holding no
                  credentials, and SignatureDoesNotMatch with a wrong secret.
  http_signature  hmac-sha256 GET and POST (Content-Digest covered), ed25519 POST,
                  created/expires/nonce, a retry after 503, a wrong key on the origin (403).
  sluice check    the signers named by `--host`, no secret printed, located errors for a
                  missing `service` and for `aws_sigv5`.

The `verifying` tests talk to the origins (and moto) directly, without Sluice: they show that
each verifier accepts what its reference implementation signs and refuses tampered requests,
so that a pass through Sluice means something.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import os
import re
import secrets as pysecrets
import subprocess
import sys
import time

import pytest
import requests
from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from http_message_signatures import HTTPMessageSigner, MappingKeyResolver, algorithms

from conftest import spawn, stop_process, wait_port
from faultservers import pick_port
from policy_support import run_check, write_yaml
from rawhttp import chunked, request_bytes
from resilience_support import fetch
from signing_origins import (UNSIGNED_PAYLOAD, AwsKey, Received, Rfc9421Origin, SigV4Origin, ed25519_public_key,
                             hmac_key, verify_sigv4)
from support import HOST, clean_env, session_via, tail

REGION = "eu-west-1"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
# the default exclude_headers (Envoy's, and user-agent, which botocore-based verifiers such as
# moto never sign): never signed
EXCLUDED = ("x-forwarded-for", "x-forwarded-proto", "x-amzn-trace-id", "user-agent")
# backoff 1.1 s before the retry: X-Amz-Date and `created` have whole seconds, so the two tries differ
RETRY = {"limit": 2, "statuses": [503],
         "backoff": {"base": 2, "scale": "1100ms", "max_delay": "3s", "jitter": "none"}}
REDIRECT = {"follow": {"max": 3}}


# ------------------------------------------------------------------------------------------
# Fixtures and helpers
# ------------------------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def _no_ambient_aws(monkeypatch):
    """Sluice and `sluice check` inherit os.environ (clean_env): credentials of the machine
    running the tests must not stand in for the ones a test gives."""
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)


def new_key(token: bool = False) -> AwsKey:
    # a secret with '/' and '+' in it, as real ones have
    return AwsKey(f"AKIAE2E{pysecrets.token_hex(6).upper()}",
                  base64.b64encode(os.urandom(30)).decode(),
                  f"IQoJE2E//{base64.b64encode(os.urandom(48)).decode()}" if token else None)


def aws_env(key: AwsKey) -> dict[str, str]:
    env = {"AWS_ACCESS_KEY_ID": key.access_key_id, "AWS_SECRET_ACCESS_KEY": key.secret_access_key}
    if key.session_token:
        env["AWS_SESSION_TOKEN"] = key.session_token
    return env


@pytest.fixture
def origins():
    """make(cls, *args, **kw) -> a started verifying origin, stopped at teardown."""
    made = []

    def make(cls, *args, **kw):
        o = cls(*args, **kw)
        made.append(o)
        return o

    yield make
    for o in made:
        o.stop()


def sigv4(service: str = "s3", region: str = REGION, **kw) -> dict:
    return {"aws_sigv4": {"service": service, "region": region, **kw}}


def http_signature(**kw) -> dict:
    return {"http_signature": {"key_id": "test-key", "algorithm": "hmac-sha256", "key": "${E2E_HMAC_KEY}", **kw}}


def start(sluice_factory, policy: dict, env: dict[str, str] | None = None):
    """Sluice with `policy` for 127.0.0.1 (every origin here is reached as 127.0.0.1)."""
    return sluice_factory({"policies": {HOST: policy}}, env=env)


def call(p, method: str, url: str, timeout: float = 20, **kw) -> requests.Response:
    """One request through Sluice; the client never follows redirects and has no credentials."""
    return session_via(p.url).request(method, url, timeout=timeout, allow_redirects=False, **kw)


def only(origin, n: int = 1, path: str | None = None, timeout: float = 10.0):
    """The origin's requests (of path), asserting there are exactly n once n were answered."""
    seen = origin.wait_requests(n, path, timeout)
    assert len(seen) == n, f"origin saw {len(seen)} requests, expected {n}: " \
                           f"{[(s.method, s.target, s.status, s.reason) for s in seen]}"
    return seen


def assert_valid(s, what: str = "request") -> dict:
    assert s.valid, f"{what} {s.method} {s.target}: the origin refused the signature: {s.reason}\n" \
                    f"{json.dumps(s.summary, indent=1, sort_keys=True)}"
    return s.summary


def assert_sluice_413(r) -> None:
    """Sluice's own 413: text/plain, `sluice: ...` (docs/errors.md)."""
    assert r is not None, "no response to a body over max_body"
    assert r.status == 413, f"expected 413 for a body over max_body, got {r!r}"
    assert (r.header("content-type") or "").replace(" ", "").lower() == "text/plain;charset=utf-8", r
    assert r.body.startswith(b"sluice: "), r


@pytest.fixture
def hmac_secret(monkeypatch) -> str:
    """A random 32-byte HMAC key, base64, as ${E2E_HMAC_KEY}."""
    secret = base64.b64encode(os.urandom(32)).decode()
    monkeypatch.setenv("E2E_HMAC_KEY", secret)
    return secret


def ed25519_pem(tmp_path) -> str:
    path = tmp_path / "ed25519.pem"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(path)], check=True,
                   capture_output=True, timeout=30)
    return str(path)


# ------------------------------------------------------------------------------------------
# The verifiers themselves (no Sluice)
# ------------------------------------------------------------------------------------------

def botocore_signed(origin, method: str, path: str, key: AwsKey, body: bytes = b"", service: str = "s3",
                    region: str = REGION, headers: dict | None = None) -> dict:
    """Headers botocore's signer gives this request now (S3SigV4Auth for s3)."""
    req = AWSRequest(method=method, url=origin.url + path, data=body, headers=dict(headers or {}))
    cls = S3SigV4Auth if service == "s3" else SigV4Auth
    cls(Credentials(key.access_key_id, key.secret_access_key, key.session_token), service, region).add_auth(req)
    return dict(req.headers.items())


def direct(method: str, url: str, **kw) -> requests.Response:
    return session_via(None).request(method, url, timeout=10, allow_redirects=False, **kw)


def test_verifying_sigv4_origin_accepts_botocore_and_the_aws_known_answer(origins):
    # AWS's documented example (IAM ListUsers, 20150830T123600Z): the verifier's own plumbing
    # reproduces the published signature
    doc = Received("GET", "/?Action=ListUsers&Version=2010-05-08", [
        ("Host", "iam.amazonaws.com"),
        ("Content-Type", "application/x-www-form-urlencoded; charset=utf-8"),
        ("X-Amz-Date", "20150830T123600Z"),
        ("Authorization", "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/iam/aws4_request, "
                          "SignedHeaders=content-type;host;x-amz-date, "
                          "Signature=5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7")], b"", False)
    k = AwsKey("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
    verify_sigv4(doc, {k.access_key_id: k}, "iam", "us-east-1",
                 now=datetime.datetime(2015, 8, 30, 12, 36, tzinfo=datetime.timezone.utc))

    key, tok = new_key(), new_key(token=True)
    o = origins(SigV4Origin, [key, tok])
    body = os.urandom(3000)
    cases = [
        ("GET", "/v/get", b"", key, {}),
        ("GET", "/v/q?zeta=1&alpha=two%20words&caf%C3%A9=x%2Fy&alpha=0&empty=", b"", key, {}),
        ("PUT", "/v/put", body, key, {"Content-Type": "application/octet-stream", "x-amz-meta-e2e": "1"}),
        ("GET", "/v/token", b"", tok, {}),
    ]
    for method, path, b, k, hs in cases:
        r = direct(method, o.url + path, data=b, headers=botocore_signed(o, method, path, k, b, headers=hs))
        assert r.status_code == 200, f"{method} {path}: {r.status_code} {r.text}"
        assert r.json()["valid"] is True and r.json()["access_key"] == k.access_key_id, r.json()
    assert [s.valid for s in o.requests()] == [True] * 4
    q = o.requests("/v/q")[0].summary
    assert q["canonical_query"] == "alpha=0&alpha=two%20words&caf%C3%A9=x%2Fy&empty=&zeta=1", q
    assert o.requests("/v/token")[0].summary["security_token"] == tok.session_token

    # a service other than s3: the path is normalised and encoded a second time
    o2 = origins(SigV4Origin, [key], service="execute-api", region="us-east-1")
    path = "/v1/with%20space/item"
    r = direct("GET", o2.url + path, headers=botocore_signed(o2, "GET", path, key, service="execute-api",
                                                             region="us-east-1"))
    assert r.status_code == 200, r.text
    assert "\n/v1/with%2520space/item\n" in r.json()["canonical_request"], r.json()["canonical_request"]

    # UNSIGNED-PAYLOAD with a chunked upload
    req = AWSRequest(method="PUT", url=o.url + "/v/unsigned", data=b"")
    req.context["client_config"] = Config(s3={"payload_signing_enabled": False})
    S3SigV4Auth(Credentials(key.access_key_id, key.secret_access_key), "s3", REGION).add_auth(req)
    assert req.headers["X-Amz-Content-SHA256"] == UNSIGNED_PAYLOAD
    parts = [os.urandom(10000) for _ in range(5)]
    r = direct("PUT", o.url + "/v/unsigned", data=iter(parts), headers=dict(req.headers.items()))
    assert r.status_code == 200, r.text
    s = o.requests("/v/unsigned")[0]
    assert s.chunked and s.summary["content_sha256"] == UNSIGNED_PAYLOAD and s.sha256 == hashlib.sha256(
        b"".join(parts)).hexdigest(), s.summary


def rfc9421_signed(url: str, method: str, key_id: str, alg, key, body: bytes | None = None,
                   components=("@method", "@authority", "@path", "@query"), **kw) -> requests.PreparedRequest:
    prep = requests.Request(method, url, data=body).prepare()
    resolver = MappingKeyResolver(public_keys={}, private_keys={key_id: key})
    HTTPMessageSigner(signature_algorithm=alg, key_resolver=resolver).sign(
        prep, key_id=key_id, label="sig1", covered_component_ids=components, body=body, **kw)
    return prep


def test_verifying_rfc9421_origin_accepts_http_message_signatures(origins, tmp_path):
    secret = base64.b64encode(os.urandom(32)).decode()
    pem = ed25519_pem(tmp_path)
    o = origins(Rfc9421Origin, {"test-key": hmac_key(secret), "ed-key": ed25519_public_key(pem)})
    raw = base64.b64decode(secret)
    ed_priv = open(pem, "rb").read()
    body = json.dumps({"n": 1, "pad": "x" * 500}).encode()
    now = datetime.datetime.now()
    preps = [
        rfc9421_signed(o.url + "/v/get?b=2&a=1", "GET", "test-key", algorithms.HMAC_SHA256, raw),
        rfc9421_signed(o.url + "/v/post", "POST", "test-key", algorithms.HMAC_SHA256, raw, body,
                       expires=now + datetime.timedelta(seconds=300), nonce=pysecrets.token_hex(8)),
        rfc9421_signed(o.url + "/v/ed", "POST", "ed-key", algorithms.ED25519, ed_priv, body),
    ]
    for prep in preps:
        r = session_via(None).send(prep, timeout=10)
        assert r.status_code == 200 and r.json()["valid"], f"{prep.method} {prep.url}: {r.status_code} {r.text}"
    post = o.requests("/v/post")[0].summary
    assert post["digest_verified"] and post["components"][-1] == "content-digest" and post["nonce"], post
    assert post["expires"] - post["created"] == 300, post
    assert o.requests("/v/ed")[0].summary["keyid"] == "ed-key"


def _one_second_later(amz_date: str) -> str:
    t = datetime.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ") + datetime.timedelta(seconds=1)
    return t.strftime("%Y%m%dT%H%M%SZ")


def _flip_last(sig_header: str) -> str:
    return sig_header[:-1] + ("1" if sig_header.endswith("0") else "0")


def _other_body_with_its_hash(hs: dict, b: bytes):
    b = b.replace(b"100", b"999")
    return {**hs, "X-Amz-Content-SHA256": hashlib.sha256(b).hexdigest()}, b


# (name, scheme, how, reason): `how` makes a correctly signed request wrong in one way (None:
# signed with another secret; "expired": created and expires in the past); `reason` is part
# of what the verifier must say.
TAMPER_CASES = [
    ("sigv4-signature", "sigv4", lambda hs, b: ({**hs, "Authorization": _flip_last(hs["Authorization"])}, b),
     "does not match the one recomputed with botocore"),
    ("sigv4-body", "sigv4", lambda hs, b: (hs, b[:-1] + bytes([b[-1] ^ 1])), "is not the body's sha256"),
    ("sigv4-body-and-its-hash", "sigv4", _other_body_with_its_hash, "does not match the one recomputed"),
    ("sigv4-signed-header", "sigv4", lambda hs, b: ({**hs, "Content-Type": "text/evil"}, b),
     "does not match the one recomputed"),
    ("sigv4-date", "sigv4", lambda hs, b: ({**hs, "X-Amz-Date": _one_second_later(hs["X-Amz-Date"])}, b),
     "does not match the one recomputed"),
    ("sigv4-stale-date", "sigv4", lambda hs, b: ({**hs, "X-Amz-Date": "20200101T000000Z"}, b),
     "more than 15 minutes from now"),
    ("sigv4-unsigned-amz-header", "sigv4", lambda hs, b: ({**hs, "x-amz-meta-added": "1"}, b),
     "x-amz-meta-added is present but not signed"),
    ("sigv4-wrong-secret", "sigv4", None, "does not match the one recomputed"),
    ("9421-signature", "9421", lambda p: p.headers.__setitem__(
        "Signature", "sig1=:" + base64.b64encode(os.urandom(32)).decode() + ":"), "did not match"),
    ("9421-body", "9421", lambda p: setattr(p, "body", p.body[:-1] + b"!"), "Content-Digest does not match"),
    ("9421-method", "9421", lambda p: setattr(p, "method", "PUT"), "did not match"),
    ("9421-path", "9421", lambda p: setattr(p, "url", p.url.replace("/t/", "/u/")), "did not match"),
    ("9421-wrong-key", "9421", None, "did not match"),
    ("9421-expired", "9421", "expired", "expires"),
]


@pytest.mark.parametrize("name,scheme,how,reason", TAMPER_CASES, ids=[c[0] for c in TAMPER_CASES])
def test_verifying_origins_reject_a_tampered_signature(origins, name, scheme, how, reason):
    body = b'{"amount": 100}'
    if scheme == "sigv4":
        key = new_key()
        o = origins(SigV4Origin, [key])
        # the wrong-secret case: the same key id, another secret
        signer = AwsKey(key.access_key_id, "wrong" + key.secret_access_key) if how is None else key
        hs = botocore_signed(o, "PUT", "/t/obj", signer, body, headers={"Content-Type": "application/json"})
        if how is not None:
            hs, body = how(hs, body)
        r = direct("PUT", o.url + "/t/obj", data=body, headers=hs)
    else:
        secret = os.urandom(32)
        o = origins(Rfc9421Origin, {"test-key": ("hmac-sha256", secret)})
        kw = {}
        if how == "expired":
            kw["created"] = datetime.datetime.now() - datetime.timedelta(seconds=600)
            kw["expires"] = datetime.datetime.now() - datetime.timedelta(seconds=300)
        prep = rfc9421_signed(o.url + "/t/obj", "POST", "test-key", algorithms.HMAC_SHA256,
                              os.urandom(32) if how is None else secret, body, **kw)
        if callable(how):
            how(prep)
        r = session_via(None).send(prep, timeout=10)
    assert r.status_code == 403, f"{name}: the origin accepted a tampered request: {r.status_code} {r.text}"
    [s] = o.requests()
    assert not s.valid and s.status == 403, s.summary
    assert reason in s.reason, f"{name}: refused for another reason than expected ({reason!r}): {s.reason}"
    assert r.json()["valid"] is False and r.json()["reason"] == s.reason


def test_verifying_origins_answer_503_once_and_redirect(origins):
    key = new_key()
    o = origins(SigV4Origin, [key])
    path = "/fail-once/a"
    statuses = [direct("GET", o.url + path, headers=botocore_signed(o, "GET", path, key)).status_code
                for _ in range(2)]
    assert statuses == [503, 200], statuses
    r = direct("GET", o.url + "/redirect/b?x=1", headers=botocore_signed(o, "GET", "/redirect/b?x=1", key))
    assert r.status_code == 307 and r.headers["Location"] == "/redirected/b?x=1", r.headers
    assert [s.valid for s in o.requests()] == [True, True, True]


# ------------------------------------------------------------------------------------------
# moto (S3 with signature checking on)
# ------------------------------------------------------------------------------------------

MOTO_SETUP_CALLS = 4   # CreateUser, CreateAccessKey, PutUserPolicy, CreateBucket


class Moto:
    def __init__(self, port: int, key: AwsKey, bucket: str):
        self.port = port
        self.url = f"http://{HOST}:{port}"
        self.key = key
        self.bucket = bucket


def _botocore_client(service: str, url: str, key_id: str, secret: str):
    import botocore.session
    return botocore.session.get_session().create_client(
        service, endpoint_url=url, region_name="us-east-1", aws_access_key_id=key_id, aws_secret_access_key=secret,
        config=Config(connect_timeout=5, read_timeout=20, retries={"max_attempts": 1},
                      s3={"addressing_style": "path"}))


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    """moto's server on 127.0.0.1 with INITIAL_NO_AUTH_ACTION_COUNT=4: the first four actions
    (an IAM user, its access key, an s3:* user policy, the bucket) run unauthenticated, and
    every later request must carry a valid SigV4 signature by a key IAM knows."""
    d = tmp_path_factory.mktemp("moto")
    port = pick_port()
    log = open(d / "moto.log", "wb")
    with pytest.MonkeyPatch.context() as mp:
        for k in list(os.environ):
            if k.startswith("AWS_") or k.lower() in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
                mp.delenv(k)
        proc = spawn([sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)],
                     env=clean_env(INITIAL_NO_AUTH_ACTION_COUNT=str(MOTO_SETUP_CALLS)),
                     stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        try:
            wait_port(port, 60, proc)
            url = f"http://{HOST}:{port}"
            iam = _botocore_client("iam", url, "setup", "setup")
            iam.create_user(UserName="sluice-e2e")
            k = iam.create_access_key(UserName="sluice-e2e")["AccessKey"]
            iam.put_user_policy(UserName="sluice-e2e", PolicyName="s3-all", PolicyDocument=json.dumps(
                {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
            key = AwsKey(k["AccessKeyId"], k["SecretAccessKey"])
            bucket = f"sluice-e2e-{pysecrets.token_hex(4)}"
            _botocore_client("s3", url, key.access_key_id, key.secret_access_key).create_bucket(Bucket=bucket)
            # signature checking is on now: a wrong secret is refused (were it not, this would pass)
            import botocore.exceptions
            wrong = _botocore_client("s3", url, key.access_key_id, "wrong" + key.secret_access_key)
            with pytest.raises(botocore.exceptions.ClientError) as e:
                wrong.head_bucket(Bucket=bucket)
            assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403, e.value.response
            _botocore_client("s3", url, key.access_key_id, key.secret_access_key).head_bucket(Bucket=bucket)
        except BaseException as e:  # noqa: BLE001 - pytest.raises' failure too: stop moto, say why
            stop_process(proc)
            log.close()
            raise RuntimeError(f"moto did not come up with signature checking on: {e}\n{tail(d / 'moto.log')}") from e
    yield Moto(port, key, bucket)
    stop_process(proc)
    log.close()


def test_verifying_moto_checks_signatures(moto):
    """The control for the moto tests, without Sluice: botocore-signed requests with the key
    pass, the same with a wrong secret get SignatureDoesNotMatch."""
    s3 = _botocore_client("s3", moto.url, moto.key.access_key_id, moto.key.secret_access_key)
    s3.put_object(Bucket=moto.bucket, Key="direct", Body=b"direct bytes")
    assert s3.get_object(Bucket=moto.bucket, Key="direct")["Body"].read() == b"direct bytes"
    import botocore.exceptions
    bad = _botocore_client("s3", moto.url, moto.key.access_key_id, "x" + moto.key.secret_access_key)
    with pytest.raises(botocore.exceptions.ClientError) as e:
        bad.get_object(Bucket=moto.bucket, Key="direct")
    assert e.value.response["Error"]["Code"] == "SignatureDoesNotMatch", e.value.response


def test_moto_put_and_get_object_through_sluice(sluice_factory, moto):
    p = start(sluice_factory, {"adapters": [sigv4("s3", "us-east-1")]}, env=aws_env(moto.key))
    data = os.urandom(64 * 1024)
    url = f"{moto.url}/{moto.bucket}/through-sluice/{pysecrets.token_hex(4)}.bin"
    r = call(p, "PUT", url, data=data)
    assert r.status_code == 200, f"PUT through Sluice: {r.status_code} {r.text[:500]}"
    r = call(p, "GET", url)
    assert r.status_code == 200, f"GET through Sluice: {r.status_code} {r.text[:500]}"
    assert r.content == data, f"got {len(r.content)} bytes back, sha256 {hashlib.sha256(r.content).hexdigest()}"


def test_moto_wrong_secret_is_signature_does_not_match(sluice_factory, moto):
    wrong = AwsKey(moto.key.access_key_id, "wrong" + moto.key.secret_access_key)
    p = start(sluice_factory, {"adapters": [sigv4("s3", "us-east-1")]}, env=aws_env(wrong))
    r = call(p, "PUT", f"{moto.url}/{moto.bucket}/wrong-secret.bin", data=b"never stored")
    assert r.status_code == 403 and "<Code>SignatureDoesNotMatch</Code>" in r.text, f"{r.status_code} {r.text[:500]}"


# ------------------------------------------------------------------------------------------
# aws_sigv4 through Sluice
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("service,path", [("s3", "/bucket/obj"), ("execute-api", "/v1/with%20space/item")])
def test_sigv4_get(sluice_factory, origins, service, path):
    """s3: the path as sent; another service: normalised and encoded twice. The default
    exclude_headers are not signed; host, x-amz-date and x-amz-content-sha256 are."""
    key = new_key()
    o = origins(SigV4Origin, [key], service=service, region=REGION)
    p = start(sluice_factory, {"adapters": [sigv4(service)]}, env=aws_env(key))
    r = call(p, "GET", o.url + path, headers={"X-Forwarded-For": "192.0.2.7", "X-Forwarded-Proto": "https",
                                              "X-Amzn-Trace-Id": "Root=1-e2e"})
    assert r.status_code == 200, f"{r.status_code} {r.text}"
    [s] = only(o)
    v = assert_valid(s)
    assert {"host", "x-amz-date", "x-amz-content-sha256"} <= set(v["signed_headers"]), v["signed_headers"]
    assert not set(EXCLUDED) & set(v["signed_headers"]), f"excluded headers signed: {v['signed_headers']}"
    assert v["content_sha256"] == EMPTY_SHA256, v
    assert v["access_key"] == key.access_key_id and v["credential_scope"].endswith(f"/{REGION}/{service}/aws4_request")
    assert v["security_token"] is None, v


def test_sigv4_put_body_is_hashed_and_byte_exact(sluice_factory, origins):
    key = new_key()
    o = origins(SigV4Origin, [key])
    p = start(sluice_factory, {"adapters": [sigv4(payload="signed")]}, env=aws_env(key))
    body = os.urandom(256 * 1024)
    r = call(p, "PUT", o.url + "/bucket/put.bin", data=body, headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 200, f"{r.status_code} {r.text}"
    [s] = only(o)
    v = assert_valid(s)
    want = hashlib.sha256(body).hexdigest()
    assert s.sha256 == want and len(s.body) == len(body), "the body reached the origin changed"
    assert v["content_sha256"] == want, f"x-amz-content-sha256 {v['content_sha256']} is not the body's {want}"


def test_sigv4_query_that_needs_encoding(sluice_factory, origins):
    """Several parameters out of order, a repeated name, a space, UTF-8, a '/' and a '*' in
    values, lowercase hex escapes, an empty value: the origin canonicalises as AWS does
    (decode, re-encode, sort), and Sluice's signature must agree."""
    key = new_key()
    o = origins(SigV4Origin, [key])
    p = start(sluice_factory, {"adapters": [sigv4()]}, env=aws_env(key))
    query = "zeta=last&alpha=1&Beta=two%20words&caf%c3%a9=cr%C3%A8me&slash=a%2Fb&star=*&alpha=0&empty=&tilde=~x"
    r = call(p, "GET", o.url + "/bucket/list?" + query)
    assert r.status_code == 200, f"{r.status_code} {r.text}"
    [s] = only(o)
    v = assert_valid(s)
    assert v["canonical_query"] == ("Beta=two%20words&alpha=0&alpha=1&caf%C3%A9=cr%C3%A8me&empty=&slash=a%2Fb"
                                    "&star=%2A&tilde=~x&zeta=last"), v["canonical_query"]


def test_sigv4_retry_after_503_signs_each_try_afresh(sluice_factory, origins):
    key = new_key()
    o = origins(SigV4Origin, [key])
    p = start(sluice_factory, {"adapters": [sigv4()], "retry": RETRY}, env=aws_env(key))
    body = os.urandom(10 * 1024)
    r = call(p, "PUT", o.url + "/fail-once/retried.bin", data=body)
    assert r.status_code == 200 and r.headers.get("X-Try") == "2", f"{r.status_code} {r.headers} {r.text}"
    first, second = only(o, 2)
    assert first.status == 503 and second.status == 200
    a, b = assert_valid(first, "try 1"), assert_valid(second, "try 2")
    assert second.t - first.t >= 1.0, f"the retry came {second.t - first.t:.2f}s after the first try (backoff 1.1 s)"
    assert a["amz_date"] != b["amz_date"], f"both tries carry X-Amz-Date {a['amz_date']}"
    assert a["signature"] != b["signature"], "both tries carry the same signature"
    assert first.sha256 == second.sha256 == hashlib.sha256(body).hexdigest()
    assert a["content_sha256"] == b["content_sha256"] == hashlib.sha256(body).hexdigest()


def test_sigv4_followed_redirect_is_signed_for_the_new_path(sluice_factory, origins):
    key = new_key()
    o = origins(SigV4Origin, [key])
    p = start(sluice_factory, {"adapters": [sigv4()], "redirect": REDIRECT}, env=aws_env(key))
    body = b"replayed on the 307"
    r = call(p, "PUT", o.url + "/redirect/obj?v=1", data=body)
    assert r.status_code == 200, f"{r.status_code} {r.text}"
    hop1, hop2 = only(o, 2)
    assert (hop1.path, hop1.status) == ("/redirect/obj", 307) and (hop2.path, hop2.status) == ("/redirected/obj", 200)
    a, b = assert_valid(hop1, "hop 1"), assert_valid(hop2, "hop 2 (the new path)")
    assert hop2.method == "PUT" and hop2.body == body and hop2.query == "v=1"
    assert b["content_sha256"] == hashlib.sha256(body).hexdigest()
    assert a["signature"] != b["signature"]


def test_sigv4_unsigned_payload_streams_a_chunked_upload(sluice_factory, origins):
    key = new_key()
    o = origins(SigV4Origin, [key])
    p = start(sluice_factory, {"adapters": [sigv4(payload="unsigned")]}, env=aws_env(key))
    parts = [os.urandom(64 * 1024) for _ in range(16)]
    r = call(p, "PUT", o.url + "/bucket/stream.bin", data=iter(parts))   # a generator: requests sends it chunked
    assert r.status_code == 200, f"{r.status_code} {r.text}"
    [s] = only(o)
    v = assert_valid(s)
    assert v["content_sha256"] == UNSIGNED_PAYLOAD, v
    assert "x-amz-content-sha256" in v["signed_headers"], v["signed_headers"]
    assert s.sha256 == hashlib.sha256(b"".join(parts)).hexdigest(), "the streamed body reached the origin changed"
    assert s.chunked, "a chunked upload of unknown length should reach the origin chunked (streamed, not buffered)"


@pytest.mark.parametrize("source", ["environment", "inline"])
def test_sigv4_session_token_is_sent_and_signed(sluice_factory, origins, monkeypatch, source):
    key = new_key(token=True)
    o = origins(SigV4Origin, [key])
    if source == "environment":
        p = start(sluice_factory, {"adapters": [sigv4()]}, env=aws_env(key))
    else:
        monkeypatch.setenv("E2E_AWS_SECRET", key.secret_access_key)
        monkeypatch.setenv("E2E_AWS_TOKEN", key.session_token)
        p = start(sluice_factory, {"adapters": [sigv4(credentials={
            "access_key_id": key.access_key_id, "secret_access_key": "${E2E_AWS_SECRET}",
            "session_token": "${E2E_AWS_TOKEN}"})]})
    r = call(p, "GET", o.url + "/bucket/token")
    assert r.status_code == 200, f"{r.status_code} {r.text}"
    [s] = only(o)
    v = assert_valid(s)
    assert s.headers_named("x-amz-security-token") == [key.session_token]
    assert "x-amz-security-token" in v["signed_headers"], v["signed_headers"]


@pytest.mark.parametrize("profile", ["e2e-profile", None])
def test_sigv4_credentials_from_a_shared_credentials_file(sluice_factory, origins, tmp_path, profile):
    """An INI file with two profiles; Sluice's environment has no AWS variables. Without
    `profile`, the `default` one."""
    default, named = new_key(), new_key()
    creds = tmp_path / "credentials"
    creds.write_text(f"[default]\naws_access_key_id = {default.access_key_id}\n"
                     f"aws_secret_access_key = {default.secret_access_key}\n\n"
                     f"[e2e-profile]\naws_access_key_id = {named.access_key_id}\n"
                     f"aws_secret_access_key = {named.secret_access_key}\n")
    creds.chmod(0o600)
    o = origins(SigV4Origin, [default, named])
    source = {"file": str(creds)} if profile is None else {"file": str(creds), "profile": profile}
    p = start(sluice_factory, {"adapters": [sigv4(credentials=source)]})
    r = call(p, "GET", o.url + "/bucket/profile")
    assert r.status_code == 200, f"{r.status_code} {r.text}"
    [s] = only(o)
    v = assert_valid(s)
    assert v["access_key"] == (named if profile else default).access_key_id, v


def test_sigv4_replaces_the_clients_authorization(sluice_factory, origins):
    key = new_key()
    o = origins(SigV4Origin, [key])
    p = start(sluice_factory, {"adapters": [sigv4()]}, env=aws_env(key))
    r = call(p, "GET", o.url + "/bucket/auth", headers={"Authorization": "Basic Y2xpZW50OnNlY3JldA=="})
    assert r.status_code == 200, f"{r.status_code} {r.text}"
    [s] = only(o)
    assert_valid(s)
    auths = s.headers_named("authorization")
    assert len(auths) == 1 and auths[0].startswith("AWS4-HMAC-SHA256 "), auths


@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_sigv4_body_over_max_body_is_413_and_not_sent(sluice_factory, origins, framing):
    key = new_key()
    o = origins(SigV4Origin, [key])
    p = start(sluice_factory, {"max_body": "1KiB", "adapters": [sigv4()]}, env=aws_env(key))

    def send(path: str, body: bytes):
        url = o.url + path
        if framing == "length":
            return fetch(p, "PUT", url, body=body)[0]
        half = len(body) // 2
        return fetch(p, "PUT", url, raw=request_bytes("PUT", url, {"Transfer-Encoding": "chunked"},
                                                      body=chunked([body[:half], body[half:]])))[0]

    r = send("/bucket/at-the-limit", os.urandom(1024))       # exactly max_body: signed and sent
    assert r is not None and r.status == 200, r
    assert_valid(only(o, 1, "/bucket/at-the-limit")[0])
    r = send("/bucket/over", os.urandom(1025))
    assert_sluice_413(r)
    time.sleep(0.5)  # window: nothing of the refused request may reach the origin in it
    assert o.requests("/bucket/over") == [], "a body over max_body reached the origin"


# ------------------------------------------------------------------------------------------
# http_signature through Sluice
# ------------------------------------------------------------------------------------------

DEFAULT_COMPONENTS = ["@method", "@authority", "@path", "@query"]


def assert_created_now(v: dict, slack: float = 10.0) -> None:
    assert isinstance(v["created"], int) and abs(v["created"] - time.time()) <= slack, \
        f"created {v['created']} is not within {slack}s of now ({time.time():.0f})"


def test_http_signature_hmac_get_with_the_default_components(sluice_factory, origins, hmac_secret):
    o = origins(Rfc9421Origin, {"test-key": hmac_key(hmac_secret)})
    p = start(sluice_factory, {"adapters": [http_signature()]})
    r = call(p, "GET", o.url + "/h/get?b=2&a=1")
    assert r.status_code == 200, f"{r.status_code} {r.text}"
    [s] = only(o)
    v = assert_valid(s)
    assert v["label"] == "sig1" and v["keyid"] == "test-key", v
    assert v["components"] == DEFAULT_COMPONENTS, v["components"]
    assert v["covered"]['"@query"'] == "?b=2&a=1" and v["covered"]['"@authority"'] == f"{HOST}:{o.port}", v["covered"]
    assert_created_now(v)
    assert v["content_digest"] is None and v["expires"] is None and v["nonce"] is None, v


def test_http_signature_hmac_post_covers_content_digest_and_content_type(sluice_factory, origins, hmac_secret):
    components = ["@method", "@authority", "@path", "@query", "content-digest", "content-type"]
    o = origins(Rfc9421Origin, {"test-key": hmac_key(hmac_secret)})
    p = start(sluice_factory, {"adapters": [http_signature(components=components)]})
    body = json.dumps({"order": 42, "items": ["a", "b"], "pad": "é" * 300}).encode()
    r = call(p, "POST", o.url + "/h/post", data=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 200, f"{r.status_code} {r.text}"
    [s] = only(o)
    v = assert_valid(s)
    assert v["components"] == components, v["components"]
    assert s.body == body, "the body reached the origin changed"
    assert v["content_digest"] == "sha-256=:" + base64.b64encode(hashlib.sha256(body).digest()).decode() + ":", v
    assert v["digest_verified"] is True
    assert v["covered"]['"content-type"'] == "application/json"


def test_http_signature_ed25519_post_default_components_add_content_digest(sluice_factory, origins, tmp_path):
    pem = ed25519_pem(tmp_path)
    o = origins(Rfc9421Origin, {"ed-key": ed25519_public_key(pem)})
    p = start(sluice_factory, {"adapters": [{"http_signature": {"key_id": "ed-key", "algorithm": "ed25519",
                                                                "key": f"file:{pem}"}}]})
    body = os.urandom(20 * 1024)
    r = call(p, "POST", o.url + "/h/ed?x=1", data=body)
    assert r.status_code == 200, f"{r.status_code} {r.text}"
    [s] = only(o)
    v = assert_valid(s)
    assert v["keyid"] == "ed-key" and v["alg"] in (None, "ed25519"), v
    assert v["components"] == DEFAULT_COMPONENTS + ["content-digest"], v["components"]
    assert v["digest_verified"] is True and s.sha256 == hashlib.sha256(body).hexdigest()


def test_http_signature_created_expires_and_nonce(sluice_factory, origins, hmac_secret):
    o = origins(Rfc9421Origin, {"test-key": hmac_key(hmac_secret)})
    p = start(sluice_factory, {"adapters": [http_signature(created=True, expires="300s", nonce=True, label="sig1")]})
    for i in range(2):
        r = call(p, "GET", o.url + f"/h/params-{i}")
        assert r.status_code == 200, f"{r.status_code} {r.text}"
    a, b = (assert_valid(s) for s in only(o, 2))
    for v in (a, b):
        assert {"created", "expires", "nonce", "keyid"} <= set(v["params"]), v["params"]
        assert_created_now(v)
        assert v["expires"] - v["created"] == 300, v
        assert isinstance(v["nonce"], str) and len(v["nonce"]) >= 8, v["nonce"]
    assert a["nonce"] != b["nonce"], f"two signatures share the nonce {a['nonce']!r}"


def test_http_signature_retry_after_503_signs_each_try_afresh(sluice_factory, origins, hmac_secret):
    o = origins(Rfc9421Origin, {"test-key": hmac_key(hmac_secret)})
    p = start(sluice_factory, {"adapters": [http_signature(nonce=True)], "retry": RETRY})
    body = b'{"replayed": true}'
    r = call(p, "PUT", o.url + "/fail-once/h", data=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 200 and r.headers.get("X-Try") == "2", f"{r.status_code} {r.headers} {r.text}"
    first, second = only(o, 2)
    assert first.status == 503 and second.status == 200
    a, b = assert_valid(first, "try 1"), assert_valid(second, "try 2")
    assert second.t - first.t >= 1.0, f"the retry came {second.t - first.t:.2f}s after the first try (backoff 1.1 s)"
    assert a["created"] != b["created"], f"both tries have created={a['created']}"
    assert a["nonce"] != b["nonce"] and a["signature"] != b["signature"]
    assert a["digest_verified"] and b["digest_verified"] and first.body == second.body == body


def test_http_signature_wrong_key_on_the_origin_is_403(sluice_factory, origins, hmac_secret):
    """The control: an origin holding another secret refuses what Sluice signs."""
    o = origins(Rfc9421Origin, {"test-key": ("hmac-sha256", os.urandom(32))})
    p = start(sluice_factory, {"adapters": [http_signature()]})
    r = call(p, "POST", o.url + "/h/wrong", data=b"payload")
    assert r.status_code == 403, f"{r.status_code} {r.text}"
    [s] = only(o)
    assert not s.valid and "http-message-signatures" in s.reason, s.summary


# ------------------------------------------------------------------------------------------
# sluice check
# ------------------------------------------------------------------------------------------

class CheckSecrets:
    def __init__(self, tmp_path, monkeypatch):
        self.inline = new_key(token=True)
        self.env = new_key(token=True)
        self.file = new_key()
        self.hmac = base64.b64encode(os.urandom(32)).decode()
        for k, v in {"E2E_AWS_SECRET": self.inline.secret_access_key, "E2E_AWS_TOKEN": self.inline.session_token,
                     "E2E_HMAC_KEY": self.hmac, **aws_env(self.env)}.items():
            monkeypatch.setenv(k, v)
        self.creds = tmp_path / "credentials"
        self.creds.write_text(f"[e2e]\naws_access_key_id = {self.file.access_key_id}\n"
                              f"aws_secret_access_key = {self.file.secret_access_key}\n")
        self.pem = ed25519_pem(tmp_path)

    def values(self) -> list[str]:
        pem_body = [line for line in open(self.pem).read().splitlines() if not line.startswith("-----")]
        return [self.inline.secret_access_key, self.inline.session_token, self.env.secret_access_key,
                self.env.session_token, self.file.secret_access_key, self.hmac,
                base64.b64decode(self.hmac).hex(), *pem_body]


def signer_config(port: int, s: CheckSecrets) -> dict:
    """Every documented key of both signers."""
    return {"listen": [f"127.0.0.1:{port}"], "policies": {
        "s3.e2e.test": {"adapters": [{"aws_sigv4": {
            "service": "s3", "region": "eu-west-1",
            "credentials": {"access_key_id": s.inline.access_key_id, "secret_access_key": "${E2E_AWS_SECRET}",
                            "session_token": "${E2E_AWS_TOKEN}"},
            "payload": "signed", "exclude_headers": list(EXCLUDED)}}], "max_body": "8MiB"},
        "env.e2e.test": {"adapters": [{"aws_sigv4": {"service": "execute-api", "region": "us-east-1",
                                                     "payload": "unsigned"}}]},
        "file.e2e.test": {"adapters": [{"aws_sigv4": {"service": "s3", "region": "eu-west-1",
                                                      "credentials": {"file": str(s.creds), "profile": "e2e"}}}]},
        "hmac.e2e.test": {"adapters": [{"http_signature": {
            "key_id": "test-key", "algorithm": "hmac-sha256", "key": "${E2E_HMAC_KEY}",
            "components": ["@method", "@authority", "@path", "@query", "content-digest", "content-type"],
            "created": True, "expires": "300s", "nonce": True, "label": "sig1"}}],
            "retry": RETRY, "redirect": REDIRECT},
        "ed.e2e.test": {"adapters": [{"http_signature": {"key_id": "ed-key", "algorithm": "ed25519",
                                                         "key": f"file:{s.pem}"}}]},
    }}


SIGNER_HOSTS = [("s3.e2e.test", "aws_sigv4"), ("env.e2e.test", "aws_sigv4"), ("file.e2e.test", "aws_sigv4"),
                ("hmac.e2e.test", "http_signature"), ("ed.e2e.test", "http_signature")]


def test_check_accepts_every_documented_signer_key(sluice_bin, tmp_path, monkeypatch):
    s = CheckSecrets(tmp_path, monkeypatch)
    cfg = write_yaml(tmp_path / "signers.yaml", signer_config(23989, s))
    r = run_check(cfg)
    assert r.returncode == 0, f"sluice check rejected the documented signer keys:\n{r.stdout}{r.stderr}"


@pytest.mark.parametrize("host,signer", SIGNER_HOSTS, ids=[h for h, _ in SIGNER_HOSTS])
def test_check_host_names_the_signer_and_prints_no_secret(sluice_bin, tmp_path, monkeypatch, host, signer):
    s = CheckSecrets(tmp_path, monkeypatch)
    cfg = write_yaml(tmp_path / "signers.yaml", signer_config(23989, s))
    r = run_check(cfg, host=host)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert re.search(rf"\b{signer}\b", r.stdout), f"{host}: adapter {signer} not named:\n{r.stdout}"
    for v in s.values():
        assert v not in out, f"{host}: a secret appears in `sluice check --host` output: {v[:12]}...\n{out}"


def located_error(r, path: str, lines: tuple[int, ...]) -> str:
    assert r.returncode == 1, f"exit {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"
    m = re.search(re.escape(path) + r":(\d+):(\d+): error: (.*)", r.stderr)
    assert m, f"no '{path}:LINE:COL: error: ...' in stderr:\n{r.stderr}"
    assert int(m.group(1)) in lines, f"error at line {m.group(1)}, expected one of {lines}: {m.group(0)}"
    return m.group(3)


def test_check_rejects_aws_sigv4_without_service(sluice_bin, tmp_path):
    p = tmp_path / "no-service.yaml"
    p.write_text('listen: ["127.0.0.1:23988"]\n'
                 "policies:\n"
                 "  127.0.0.1:\n"
                 "    adapters:\n"
                 "      - aws_sigv4:\n"          # line 5
                 "          region: x\n")        # line 6
    msg = located_error(run_check(p), str(p), (5, 6))
    assert "service" in msg, f"the error does not name `service`: {msg}"


def test_check_rejects_unknown_adapter_aws_sigv5_suggesting_aws_sigv4(sluice_bin, tmp_path):
    p = tmp_path / "sigv5.yaml"
    p.write_text('listen: ["127.0.0.1:23987"]\n'
                 "policies:\n"
                 "  127.0.0.1:\n"
                 "    adapters:\n"
                 "      - aws_sigv5:\n"          # line 5
                 "          service: s3\n"
                 "          region: eu-west-1\n")
    r = run_check(p)
    msg = located_error(r, str(p), (5,))
    assert "aws_sigv5" in msg, msg
    assert "aws_sigv4" in r.stderr.replace("aws_sigv5", ""), f"no did-you-mean for aws_sigv4: {r.stderr}"
