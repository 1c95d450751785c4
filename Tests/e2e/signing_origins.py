"""Purpose-built origins for test_signers.py: each one VERIFIES every request it receives with
an implementation independent of Sluice's, and records the outcome per request.

Both listen on 127.0.0.1 only and run in-process on threads (faultservers.ThreadedServer,
one thread per connection, keep-alive, every read bounded by CONN_IDLE_TIMEOUT), so a test
reads what the origin saw:

  SigV4Origin     AWS Signature Version 4 (the `Authorization: AWS4-HMAC-SHA256 ...` header
                  form). The signature is recomputed with botocore (S3SigV4Auth for service
                  `s3`: no path normalisation; SigV4Auth otherwise: normalised, encoded
                  again) at the request's own X-Amz-Date, over exactly the headers its
                  SignedHeaders names, and the query canonicalised the way AWS does it
                  (each name and value percent-decoded, re-encoded with everything but
                  A-Z a-z 0-9 - _ . ~ as uppercase %XX, sorted). The payload hash is the
                  request's `x-amz-content-sha256`, which is checked against the body itself
                  unless it is UNSIGNED-PAYLOAD.
  Rfc9421Origin   HTTP Message Signatures (RFC 9421) with the PyPI package
                  `http-message-signatures`: hmac-sha256 and ed25519 keys by key id; the
                  Content-Digest (RFC 9530) is checked against the body itself whether or not
                  the signature covers it, and a request with a body must cover it.

Behaviour by path, for both:
  /fail-once/...  the first request for each such path is answered 503 (after it was
                  verified and recorded); later ones as below
  /redirect/...   307 with `Location: /redirected/...` (the query kept)
  anything else   200 with the JSON summary of the verification when the signature is valid,
                  403 with the same summary when it is not

The summary (also kept in `Seen.summary`) has at least: valid, reason, method, path, query,
body_sha256, body_bytes, chunked; the SigV4 origin adds signed_headers, amz_date,
access_key, credential_scope, content_sha256, security_token, canonical_query, signature;
the RFC 9421 origin adds label, keyid, alg, created, expires, nonce, components,
content_digest, signature.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import json
import re
import socket
import time
import urllib.parse
from dataclasses import dataclass, field

import http_sf
from botocore.auth import SigV4Auth, S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.compat import HTTPHeaders
from botocore.credentials import Credentials
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.hazmat.primitives.serialization import load_pem_private_key, load_pem_public_key
from http_message_signatures import (ContentDigest, HTTPMessageVerifier, HTTPMessageSignaturesException,
                                     InvalidSignature, MappingKeyResolver, algorithms)

from faultservers import HOST, PeerClosed, Reader, ThreadedServer, header
from resilience_servers import response_bytes
from support import wait_until

# Nothing here waits forever: a connection idle this long is closed.
CONN_IDLE_TIMEOUT = 30.0
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
SIGV4_MAX_SKEW = datetime.timedelta(minutes=15)   # what AWS allows between X-Amz-Date and now


# ------------------------------------------------------------------------------------------
# What an origin received
# ------------------------------------------------------------------------------------------

@dataclass
class Received:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes
    chunked: bool

    @property
    def host(self) -> str:
        return header(self.headers, "host") or ""

    @property
    def split(self) -> urllib.parse.SplitResult:
        if "://" in self.target:
            return urllib.parse.urlsplit(self.target)
        return urllib.parse.urlsplit(f"http://{self.host}{self.target}")

    @property
    def path(self) -> str:
        return self.split.path

    @property
    def query(self) -> str:
        return self.split.query

    def values(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name.lower()]


@dataclass
class Seen:
    """One request as the origin received it, and what the verifier made of it."""
    seq: int
    t: float                    # monotonic, when the request was complete
    wall: float                 # time.time() at the same moment
    method: str
    target: str
    path: str
    query: str
    headers: list[tuple[str, str]]
    body: bytes
    chunked: bool
    valid: bool
    reason: str
    summary: dict = field(default_factory=dict)
    status: int = 0             # what the origin answered

    def header(self, name: str) -> str | None:
        return header(self.headers, name)

    def headers_named(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name.lower()]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.body).hexdigest()


class Rejected(Exception):
    """The verifier's reason for refusing a request."""


# ------------------------------------------------------------------------------------------
# The origin: reads requests, verifies, records, answers
# ------------------------------------------------------------------------------------------

class VerifyingOrigin(ThreadedServer):
    """Base class: `verify(Received) -> dict` raises Rejected (or any exception) for an invalid
    request and returns the scheme-specific part of the summary for a valid one."""

    name = "verifying-origin"
    backlog = 256

    def __init__(self):
        self._seen: list[Seen] = []
        self._counts: dict[str, int] = {}
        super().__init__()

    # -- records --------------------------------------------------------------------------
    def requests(self, path: str | None = None) -> list[Seen]:
        with self.lock:
            return [s for s in self._seen if path is None or s.path == path]

    def wait_requests(self, n: int, path: str | None = None, timeout: float = 10.0) -> list[Seen]:
        """The requests (of path) once at least n were answered, or what there is at timeout."""
        wait_until(lambda: len([s for s in self.requests(path) if s.status]) >= n, timeout, 0.02)
        return self.requests(path)

    # -- verification ---------------------------------------------------------------------
    def verify(self, req: Received) -> dict:
        raise NotImplementedError

    def _summarise(self, req: Received) -> tuple[bool, str, dict]:
        base = {"method": req.method, "target": req.target, "path": req.path, "query": req.query,
                "body_sha256": hashlib.sha256(req.body).hexdigest(), "body_bytes": len(req.body),
                "chunked": req.chunked}
        detail: dict = {}
        try:
            detail = self.verify(req)
            valid, reason = True, "ok"
        except Rejected as e:
            valid, reason = False, str(e)
            detail = getattr(e, "detail", {}) or {}
        except Exception as e:  # noqa: BLE001 - a verifier crash is an invalid request, with its cause
            valid, reason = False, f"{type(e).__name__}: {e}"
        return valid, reason, {"valid": valid, "reason": reason, **base, **detail}

    # -- serving --------------------------------------------------------------------------
    def handle(self, conn, rec):
        r = Reader(conn, timeout=CONN_IDLE_TIMEOUT)
        while not self.stopping.is_set():
            try:
                _, method, target, headers = r.read_head()
            except (PeerClosed, socket.timeout):
                return
            if (header(headers, "expect") or "").lower() == "100-continue":
                conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            body = bytearray()
            _, was_chunked = r.read_body(headers, body.extend)
            req = Received(method, target, headers, bytes(body), was_chunked)
            valid, reason, summary = self._summarise(req)
            with self.lock:
                n = self._counts.get(req.path, 0) + 1
                self._counts[req.path] = n
                seen = Seen(seq=len(self._seen) + 1, t=time.monotonic(), wall=time.time(), method=method,
                            target=target, path=req.path, query=req.query, headers=headers, body=req.body,
                            chunked=was_chunked, valid=valid, reason=reason, summary=summary)
                self._seen.append(seen)
            status, extra = self._decide(req, valid, n)
            seen.summary["try"] = n
            payload = json.dumps(seen.summary, sort_keys=True).encode()
            close = (header(headers, "connection") or "").lower() == "close"
            if close:
                extra.append(("Connection", "close"))
            wire = response_bytes(status, b"" if method == "HEAD" else payload, extra,
                                  content_type="application/json")
            seen.status = status
            conn.sendall(wire)
            if close:
                return

    def _decide(self, req: Received, valid: bool, n: int) -> tuple[int, list[tuple[str, str]]]:
        hs = [("X-Verified", "true" if valid else "false"), ("X-Try", str(n))]
        if req.path.startswith("/fail-once/") and n == 1:
            return 503, hs
        if req.path.startswith("/redirect/"):
            loc = "/redirected/" + req.path[len("/redirect/"):] + (f"?{req.query}" if req.query else "")
            return 307, hs + [("Location", loc)]
        return (200 if valid else 403), hs


# ------------------------------------------------------------------------------------------
# AWS Signature Version 4
# ------------------------------------------------------------------------------------------

@dataclass
class AwsKey:
    access_key_id: str
    secret_access_key: str
    session_token: str | None = None


_AUTH_RE = re.compile(r"AWS4-HMAC-SHA256 Credential=(?P<cred>[^,\s]+),\s*SignedHeaders=(?P<signed>[^,\s]+),"
                      r"\s*Signature=(?P<sig>[0-9a-f]{64})")


class _ExactHeaders:
    """botocore's SigV4Auth signs every header of the request but a few (user-agent, expect,
    x-amzn-trace-id, transfer-encoding): a verifier signs exactly the ones SignedHeaders names,
    with every field line of each, in the order received."""

    def __init__(self, credentials, service, region, signed: list[str], received: Received):
        super().__init__(credentials, service, region)
        self._signed = signed
        self._received = received

    def headers_to_sign(self, request):
        m = HTTPHeaders()
        for name in self._signed:
            for v in self._received.values(name):
                m[name] = v          # email.message: assignment appends a field line
        return m


class _S3Verify(_ExactHeaders, S3SigV4Auth):
    pass


class _SigV4Verify(_ExactHeaders, SigV4Auth):
    pass


def aws_query_pairs(query: str) -> list[tuple[str, str]]:
    """The query's name/value pairs percent-decoded (a '+' stays a '+'); a name without '='
    has the value ''. botocore re-encodes and sorts them (`_canonical_query_string_params`)."""
    pairs = []
    for part in query.split("&") if query else []:
        k, _, v = part.partition("=")
        pairs.append((urllib.parse.unquote(k), urllib.parse.unquote(v)))
    return pairs


def reject(reason: str, **detail) -> Rejected:
    e = Rejected(reason)
    e.detail = detail  # type: ignore[attr-defined]
    return e


def verify_sigv4(req: Received, keys: dict[str, AwsKey], service: str, region: str,
                 now: datetime.datetime | None = None) -> dict:
    """Raises Rejected with the reason, or returns the summary of a valid request."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    auths = req.values("authorization")
    amz_dates = req.values("x-amz-date")
    content_sha = req.values("x-amz-content-sha256")
    tokens = req.values("x-amz-security-token")
    body_sha = hashlib.sha256(req.body).hexdigest()
    d: dict = {"authorization_headers": len(auths), "amz_date": amz_dates[0] if amz_dates else None,
               "content_sha256": content_sha[0] if content_sha else None,
               "security_token": tokens[0] if tokens else None}
    if len(auths) != 1:
        raise reject(f"{len(auths)} Authorization headers, expected 1", **d)
    m = _AUTH_RE.fullmatch(auths[0].strip())
    if not m:
        raise reject(f"Authorization is not AWS4-HMAC-SHA256 Credential=...,SignedHeaders=...,Signature=...: "
                     f"{auths[0][:80]!r}", **d)
    cred = m["cred"].split("/")
    signed = m["signed"].split(";")
    d.update(access_key=cred[0], credential_scope="/".join(cred[1:]), signed_headers=signed, signature=m["sig"])
    if len(cred) != 5 or cred[4] != "aws4_request":
        raise reject(f"malformed credential scope {m['cred']!r}", **d)
    akid, date, c_region, c_service = cred[:4]
    if signed != sorted(set(signed)) or any(h != h.lower() for h in signed):
        raise reject(f"SignedHeaders not lowercase, sorted and unique: {m['signed']}", **d)
    if "host" not in signed:
        raise reject("host is not signed", **d)
    if len(amz_dates) != 1:
        raise reject(f"{len(amz_dates)} X-Amz-Date headers, expected 1", **d)
    try:
        t = datetime.datetime.strptime(amz_dates[0], "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.timezone.utc)
    except ValueError:
        raise reject(f"X-Amz-Date {amz_dates[0]!r} is not YYYYMMDDTHHMMSSZ", **d) from None
    if abs(now - t) > SIGV4_MAX_SKEW:
        raise reject(f"X-Amz-Date {amz_dates[0]} is more than 15 minutes from now", **d)
    if date != amz_dates[0][:8]:
        raise reject(f"credential scope date {date} is not X-Amz-Date's day {amz_dates[0][:8]}", **d)
    if (c_region, c_service) != (region, service):
        raise reject(f"credential scope {c_region}/{c_service}, expected {region}/{service}", **d)
    key = keys.get(akid)
    if key is None:
        raise reject(f"unknown access key {akid}", **d)
    for name, _ in req.headers:
        if name.lower().startswith("x-amz-") and name.lower() not in signed:
            raise reject(f"{name.lower()} is present but not signed", **d)
    for name in signed:
        if not req.values(name):
            raise reject(f"signed header {name} is absent from the request", **d)
    if service == "s3" and not content_sha:
        raise reject("x-amz-content-sha256 is required for s3", **d)
    if len(content_sha) > 1:
        raise reject("more than one x-amz-content-sha256", **d)
    if content_sha and content_sha[0] != UNSIGNED_PAYLOAD and content_sha[0] != body_sha:
        raise reject(f"x-amz-content-sha256 {content_sha[0]} is not the body's sha256 {body_sha}", **d)
    if key.session_token is not None:
        if tokens != [key.session_token]:
            raise reject("x-amz-security-token missing or not the session token", **d)
    elif tokens:
        raise reject("x-amz-security-token sent for a key without a session token", **d)

    # botocore recomputes the signature at the request's own date over the signed headers
    pairs = aws_query_pairs(req.query)
    aws_req = AWSRequest(method=req.method, url=f"http://{req.host}{req.path}", data=req.body,
                         headers={}, params=pairs)
    aws_req.context["timestamp"] = amz_dates[0]
    auth_cls = _S3Verify if service == "s3" else _SigV4Verify
    signer = auth_cls(Credentials(key.access_key_id, key.secret_access_key, key.session_token),
                      service, region, signed, req)
    for name in signed:                       # botocore reads x-amz-content-sha256 from request.headers
        for v in req.values(name):
            aws_req.headers[name] = v
    canonical = signer.canonical_request(aws_req)
    expected = signer.signature(signer.string_to_sign(aws_req, canonical), aws_req)
    d.update(canonical_query=signer.canonical_query_string(aws_req), canonical_request=canonical)
    if not hmac.compare_digest(expected, m["sig"]):
        raise reject("signature does not match the one recomputed with botocore", **d)
    return d


class SigV4Origin(VerifyingOrigin):
    """Accepts requests signed for (`service`, `region`) with one of `keys`."""

    name = "sigv4-origin"

    def __init__(self, keys: list[AwsKey], service: str = "s3", region: str = "eu-west-1"):
        self.keys = {k.access_key_id: k for k in keys}
        self.service = service
        self.region = region
        super().__init__()

    def verify(self, req: Received) -> dict:
        return verify_sigv4(req, self.keys, self.service, self.region)


# ------------------------------------------------------------------------------------------
# RFC 9421 HTTP Message Signatures
# ------------------------------------------------------------------------------------------

ALGORITHMS = {"hmac-sha256": algorithms.HMAC_SHA256, "ed25519": algorithms.ED25519}


def hmac_key(secret_b64: str) -> tuple[str, bytes]:
    """The verifier's key for an hmac-sha256 secret given (as in Sluice's config) in base64."""
    return "hmac-sha256", base64.b64decode(secret_b64)


def ed25519_public_key(pem_path) -> tuple[str, ed25519.Ed25519PublicKey]:
    """The verifier's key for an ed25519 PKCS#8 private key (PEM file, as `openssl genpkey`
    writes it), or a PEM public key."""
    data = open(pem_path, "rb").read()
    if b"PRIVATE KEY" in data:
        return "ed25519", load_pem_private_key(data, password=None).public_key()
    return "ed25519", load_pem_public_key(data)


class _Headers:
    """Field lines as received, in order (the interface http-message-signatures reads)."""

    def __init__(self, lines: list[tuple[str, str]]):
        self._lines = lines

    def items(self):
        return list(self._lines)

    def __iter__(self):
        return iter(dict.fromkeys(k for k, _ in self._lines))

    def __contains__(self, name):
        return any(k.lower() == str(name).lower() for k, _ in self._lines)


class _Message:
    def __init__(self, method: str, url: str, headers: list[tuple[str, str]]):
        self.method = method
        self.url = url
        self.headers = _Headers(headers)


def _signature_inputs(req: Received) -> dict:
    """label -> (component ids, params) from Signature-Input, as http_sf parses it."""
    sig_input = ", ".join(req.values("signature-input"))
    if not sig_input:
        raise reject("no Signature-Input")
    try:
        parsed = http_sf.parse(sig_input.encode(), tltype="dictionary")
    except Exception as e:  # noqa: BLE001
        raise reject(f"Signature-Input is not a structured dictionary: {e}") from None
    out = {}
    for label, (member, params) in parsed.items():
        if not isinstance(member, list):
            raise reject(f"Signature-Input member {label} is not an inner list")
        out[label] = ([v for v, _ in member], dict(params))
    return out


def verify_rfc9421(req: Received, keys: dict[str, tuple[str, object]], max_age_s: int = 300) -> dict:
    """Raises Rejected with the reason, or returns the summary of a valid request. keys:
    key id -> (algorithm name, verification key: HMAC secret bytes or an Ed25519 public key)."""
    inputs = _signature_inputs(req)
    digest_hdr = ", ".join(req.values("content-digest")) or None
    sigs = ", ".join(req.values("signature"))
    d: dict = {"labels": sorted(inputs), "content_digest": digest_hdr, "signature_header": sigs or None}
    if len(inputs) != 1:
        raise reject(f"{len(inputs)} signatures in Signature-Input, expected 1", **d)
    [(label, (components, params))] = inputs.items()
    d.update(label=label, components=components, keyid=params.get("keyid"), alg=params.get("alg"),
             created=params.get("created"), expires=params.get("expires"), nonce=params.get("nonce"),
             params=sorted(params))
    try:
        sig_dict = http_sf.parse(sigs.encode(), tltype="dictionary") if sigs else {}
    except Exception as e:  # noqa: BLE001
        raise reject(f"Signature is not a structured dictionary: {e}", **d) from None
    sig_value = sig_dict.get(label, (None, None))[0]
    d["signature"] = base64.b64encode(sig_value).decode() if isinstance(sig_value, bytes) else None
    # the body against its Content-Digest, whether or not the signature covers it
    if digest_hdr is not None:
        try:
            ContentDigest.verify(digest_hdr, req.body)
        except InvalidSignature as e:
            raise reject(f"Content-Digest: {e}", **d) from None
    elif req.body:
        raise reject("a body without Content-Digest", **d)
    keyid = params.get("keyid")
    if keyid not in keys:
        raise reject(f"unknown keyid {keyid!r}", **d)
    alg_name, key = keys[keyid]
    if params.get("alg") not in (None, alg_name):
        raise reject(f"alg {params.get('alg')!r} is not this key's {alg_name}", **d)
    verifier = HTTPMessageVerifier(signature_algorithm=ALGORITHMS[alg_name],
                                   key_resolver=MappingKeyResolver(public_keys={keyid: key}, private_keys={}))
    url = req.target if "://" in req.target else f"http://{req.host}{req.target}"
    try:
        [result] = verifier.verify(_Message(req.method, url, req.headers), body=req.body,
                                   max_age=datetime.timedelta(seconds=max_age_s))
    except (InvalidSignature, HTTPMessageSignaturesException) as e:
        raise reject(f"http-message-signatures: {e}", **d) from None
    d["digest_verified"] = result.body is not None
    d["covered"] = {k: v for k, v in result.covered_components.items()}
    return d


class Rfc9421Origin(VerifyingOrigin):
    """Accepts requests carrying one RFC 9421 signature by a key in `keys`
    (key id -> (algorithm name, verification key))."""

    name = "rfc9421-origin"

    def __init__(self, keys: dict[str, tuple[str, object]], max_age_s: int = 300):
        self.keys = dict(keys)
        self.max_age_s = max_age_s
        super().__init__()

    def verify(self, req: Received) -> dict:
        return verify_rfc9421(req, self.keys, self.max_age_s)


__all__ = ["HOST", "AwsKey", "Received", "Seen", "SigV4Origin", "Rfc9421Origin", "VerifyingOrigin",
           "verify_sigv4", "verify_rfc9421", "aws_query_pairs", "hmac_key", "ed25519_public_key",
           "UNSIGNED_PAYLOAD"]
