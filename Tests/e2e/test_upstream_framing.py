"""The upstream response is a security boundary: whatever an http:// origin sends, the client
gets either Sluice's own 502 (docs/errors.md: `sluice: upstream HOST:PORT failed: …`), or a
response cut off before it is complete (the connection closes) — or, for a response that is
valid, that response correctly framed. Never bytes it could frame differently from Sluice: no
part of a bad response may reach the client as a second response.

The origin (framing_servers.FramingOrigin) writes exact bytes per path. Most bad responses
carry a complete second response behind them (SMUGGLED, with `X-Smuggled: yes`) and leave the
upstream connection open: an engine that misreads where the first response ends, or that puts
such a connection back into its pool, answers the next request with it. So after each exchange
the client connection must be closed, or its next request must get a fresh, correct answer
from the origin (`X-Fresh: yes`, the body naming that request) — and the smuggled bytes must
never appear in anything the client received.

Every test runs once per upstream engine: `native` (Sluice's own HTTP/1.1 client, the default
for http:// origins) and `curl` (libcurl), chosen with `policies.default.upstream.engine`.
SLUICE_E2E_ENGINE=native|curl (see conftest.py) runs only that engine's half. The native engine
is strict: every bad response is a 502 (or, once the head has been relayed, a cut). Where
libcurl legitimately accepts something (RFC 9112 lets a recipient tolerate bare LF, a proxy
replace obs-fold or a NUL with SP, a client drop any number of 1xx heads) the expected outcome
for `curl` says so, with the reason; the smuggling checks apply to both engines alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

import pytest

from conftest import E2E_ENGINE
from framing_servers import Answer, FramingOrigin, fresh_body
from rawhttp import ProtocolError, RawConn, Response, Truncated, request_bytes
from support import HOST, assert_sluice_error, wait_until

ENGINES = ("native", "curl")
# SLUICE_E2E_ENGINE (checked by conftest.py) narrows the run to one engine: `make e2e-curl`.
RUN_ENGINES = (E2E_ENGINE,) if E2E_ENGINE else ENGINES

# A complete response hidden behind a bad one. Its marks must never reach the client.
SMUGGLED = b"HTTP/1.1 200 OK\r\nX-Smuggled: yes\r\nContent-Type: text/plain\r\nContent-Length: 9\r\n\r\nsmuggled!"
SMUGGLE_MARKS = (b"X-Smuggled", b"smuggled!")

# Outcomes, as observed by the client.
REJECT = "reject"  # Sluice's own 502 naming the origin; nothing of the origin's answer relayed
CUT = "cut"        # a head and part of the body, then the connection closed (never complete)
CLOSED = "closed"  # the connection closed before any response byte
PASS = "pass"      # a complete, correctly framed response
# What a truncated upstream body may become: 502 while nothing had reached the client, else a cut.
TRUNCATION = frozenset({REJECT, CUT, CLOSED})


class ConnRec(RawConn):
    """A RawConn that also keeps every byte it received (`seen`), for the smuggling check."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.seen = bytearray()

    def _fill(self, deadline, n=65536):
        before = len(self.buf)
        ok = super()._fill(deadline, n)
        if ok:
            self.seen += self.buf[before:]
        return ok


# ------------------------------------------------------------------------------------------
# Cases
# ------------------------------------------------------------------------------------------

def body_is(expected: bytes) -> Callable[[Response], None]:
    def check(r: Response) -> None:
        assert r.status == 200, r
        assert r.body == expected, f"body {r.body[:200]!r}, expected {expected[:200]!r}"
    return check


@dataclass
class Case:
    wire: bytes
    expect: dict[str, str | frozenset]   # engine -> outcome (or set of acceptable outcomes)
    why: str = ""                         # why libcurl's outcome differs, when it does
    after: str = "keep"                   # the origin's connection after the answer
    method: str = "GET"
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    check: Callable[[Response], None] | None = None  # for PASS
    hint: str = ""  # regex the native engine's 502 reason must match (names the problem)


def both(outcome) -> dict:
    return {"native": outcome, "curl": outcome}


def strict_native(curl) -> dict:
    """The native engine refuses the response; libcurl's outcome is `curl` (see `why`)."""
    return {"native": REJECT, "curl": curl}


CHUNKED_HELLO = b"5\r\nhello\r\n0\r\n\r\n"
BIG_FIELDS = b"".join(b"X-Big-%03d: " % i + b"v" * 1000 + b"\r\n" for i in range(80))  # ~80 KiB
assert len(BIG_FIELDS) > 64 * 1024
INTERIM_FLOOD = 50
TE_TWICE_WHY = ("libcurl 7.88 decodes the chunked coding once however often it is listed; Sluice relays "
                "the decoded body re-chunked, and the bytes after the last chunk are never used")

BAD: dict[str, Case] = {
    # RFC 9112 §6.1: both fields "ought to be handled as an error"; a CL-reading recipient sees
    # one response (the chunked text and SMUGGLED as its body), a TE-reading one sees two.
    "content_length_and_transfer_encoding": Case(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
        + b"Content-Length: %d\r\n" % (len(CHUNKED_HELLO) + len(SMUGGLED))
        + b"Transfer-Encoding: chunked\r\n\r\n" + CHUNKED_HELLO + SMUGGLED,
        strict_native(PASS),
        why="libcurl lets Transfer-Encoding override Content-Length, and Sluice drops the Content-Length "
            "before relaying: what RFC 9112 §6.3 asks of an intermediary that chooses to forward",
        check=lambda r: (body_is(b"hello")(r), _assert_no_length(r)), hint=r"content-length|transfer-encoding"),
    # RFC 9112 §6.3: a proxy MUST close the upstream connection, discard the response, and 502.
    "two_different_content_lengths": Case(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n"
        + b"Content-Length: %d\r\n\r\n" % (5 + len(SMUGGLED)) + b"hello" + SMUGGLED,
        both(REJECT), hint=r"content-length"),
    "bare_lf_line_ends": Case(
        b"HTTP/1.1 200 OK\nContent-Type: text/plain\nContent-Length: 5\n\nhello" + SMUGGLED,
        strict_native(PASS),
        why="libcurl takes a bare LF as a line end (RFC 9112 §2.2 lets a recipient); Sluice then "
            "writes the head with CRLF, so the client's framing is Sluice's",
        check=body_is(b"hello"), hint=r"\bLF\b|CRLF|line|bare"),
    # one bare LF inside a CRLF head: a CRLF-only parser reads `X-A` with the value
    # "1\nContent-Length: 5" and no length at all, a lenient one reads a length of 5.
    "bare_lf_inside_a_crlf_head": Case(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-A: 1\nContent-Length: 5\r\n\r\nhello" + SMUGGLED,
        strict_native(PASS),
        why="libcurl splits the line at the LF (as for bare_lf_line_ends)",
        check=body_is(b"hello"), hint=r"\bLF\b|CRLF|line|bare"),
    # RFC 9112 §5.2: a proxy MUST either reject obs-fold (502) or replace it with SP. The fold
    # hides a Transfer-Encoding line from a parser that joins, shows it to one that does not.
    "obs_fold": Case(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nX-Folded: a\r\n"
        b" Transfer-Encoding: chunked\r\n\r\nhello" + SMUGGLED,
        strict_native(PASS),
        why="Sluice joins libcurl's fold line to the field it continues with one SP (RFC 9112 §5.2's "
            "other choice): the client gets `X-Folded: a Transfer-Encoding: chunked`, one field",
        check=lambda r: (body_is(b"hello")(r), _assert_folded_joined(r)), hint=r"fold|continuation|whitespace|line"),
    "header_section_over_64k": Case(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n" + BIG_FIELDS + b"Content-Length: 5\r\n\r\nhello" + SMUGGLED,
        strict_native(PASS),
        why="libcurl's own limits are 100 KiB per line and 300 KiB per head; under them it relays",
        check=body_is(b"hello"), hint=r"large|long|size|limit|exceed|too"),
    "interim_flood": Case(
        b"HTTP/1.1 103 Early Hints\r\n\r\n" * INTERIM_FLOOD
        + b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello" + SMUGGLED,
        strict_native(PASS),
        why="libcurl reads any number of 1xx heads and drops them; the final 200 is well-formed",
        check=body_is(b"hello"), hint=r"1xx|interim|informational|10[0-9]|too many"),
    # the origin promises a chunk of 0x64 = 100 bytes, sends 10, closes
    "truncated_chunked_body": Case(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n64\r\n" + b"t" * 10,
        both(TRUNCATION), after="close"),
    "truncated_content_length_body": Case(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\n" + b"t" * 10,
        both(TRUNCATION), after="close"),
    # RFC 9110 §5.5: a NUL in a field value: reject, or replace it with SP. libcurl itself
    # refuses the head ("Nul byte in header"), so both engines answer 502.
    "nul_in_field_value": Case(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Nul: a\x00b\r\nContent-Length: 5\r\n\r\nhello" + SMUGGLED,
        both(REJECT), hint=r"NUL|control|character|byte|invalid"),
    # RFC 9112 §7: a sender MUST NOT apply chunked more than once.
    "transfer_encoding_chunked_chunked": Case(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked, chunked\r\n\r\n"
        + CHUNKED_HELLO + SMUGGLED,
        strict_native(PASS), why=TE_TWICE_WHY, check=body_is(b"hello"),
        hint=r"chunked|transfer-encoding|transfer coding"),
    # RFC 9112 §5.1: no whitespace between a field name and the colon. A reader that takes the
    # line for `Content-Length` sees one response; one that ignores it reads to the close and
    # sees SMUGGLED as body, so each engine must frame what it relays as it read it.
    "whitespace_before_colon": Case(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length : 5\r\n\r\nhello" + SMUGGLED,
        both(REJECT), hint=r"whitespace|colon"),
    "transfer_encoding_chunked_twice": Case(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + CHUNKED_HELLO + SMUGGLED,
        strict_native(PASS), why=TE_TWICE_WHY, check=body_is(b"hello"),
        hint=r"chunked|transfer-encoding|transfer coding"),
}

# RFC 9112 §4: status-line = HTTP-version SP 3DIGIT SP [ reason-phrase ]; HTTP-name is "HTTP",
# case-sensitive. Each is followed by a valid head and body, then SMUGGLED.
INVALID_STATUS_LINES = {
    "two_digit_code": (b"HTTP/1.1 20 OK", REJECT, ""),
    "four_digit_code": (b"HTTP/1.1 2000 OK", REJECT, ""),
    "code_600": (b"HTTP/1.1 600 Beyond", REJECT, ""),
    "code_099": (b"HTTP/1.1 099 Below", REJECT, ""),
    "no_space_after_code": (b"HTTP/1.1 200OK", PASS,
                            "libcurl reads the three digits and does not look for the SP; the status line "
                            "Sluice writes for the client is well-formed (its reason phrase comes out as `K`)"),
    # libcurl would take it (it compares "HTTP/" ignoring case), but Sluice's head collector
    # does not see a status line in it: 502 from both engines.
    "lowercase_http_name": (b"http/1.1 200 OK", REJECT, ""),
    "no_version": (b"200 OK", REJECT, ""),
}
for _name, (_line, _curl, _why) in INVALID_STATUS_LINES.items():
    BAD[f"invalid_status_line_{_name}"] = Case(
        _line + b"\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello" + SMUGGLED,
        strict_native(_curl), why=_why, check=body_is(b"hello"), hint=r"status|code|HTTP/")

GOOD: dict[str, Case] = {
    "chunked_with_trailers": Case(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n"
        b"5\r\nhello\r\n6\r\n world\r\n0\r\nX-Checksum: abc\r\n\r\n",
        both(PASS), check=body_is(b"hello world")),
    # no length, no chunking: the body ends with the connection; an HTTP/1.1 client gets it framed
    "close_delimited_body": Case(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n" + b"c" * 20000,
        both(PASS), after="close", check=lambda r: (body_is(b"c" * 20000)(r), _assert_not_close_framed(r))),
    # RFC 9112 §6.3: a 204 or 304 ends at its head; what follows is not its body.
    "no_content_204_then_stray_bytes": Case(
        b"HTTP/1.1 204 No Content\r\nX-A: 1\r\n\r\n" + SMUGGLED,
        both(PASS), check=lambda r: _assert_bodiless(r, 204)),
    "not_modified_304_with_length_then_stray_bytes": Case(
        b'HTTP/1.1 304 Not Modified\r\nETag: "v1"\r\nContent-Length: 5\r\n\r\n' + SMUGGLED,
        both(PASS), headers=[("If-None-Match", '"v1"')], check=lambda r: _assert_bodiless(r, 304)),
    "head_with_content_length_1000": Case(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 1000\r\n\r\n",
        both(PASS), method="HEAD", check=lambda r: _assert_head_answer(r)),
    # `Connection` may name only hop-by-hop fields; naming the length must not take away the
    # framing Sluice relays the body by.
    "connection_names_content_length": Case(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: content-length\r\nContent-Length: 5\r\n\r\nhello",
        both(PASS), check=lambda r: (body_is(b"hello")(r), _assert_length(r, 5))),
    "continue_100_then_200": Case(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello",
        both(PASS), method="POST", body=b"payload", check=body_is(b"hello")),
}


def _assert_folded_joined(r: Response) -> None:
    assert r.header("transfer-encoding") is None or r.framing == "chunked", r
    lines = r.raw_head.split(b"\r\n")
    assert not any(ln[:1] in (b" ", b"\t") for ln in lines), f"a folded line reached the client: {r.raw_head!r}"
    folded = r.headers_named("x-folded")
    assert folded and all("transfer-encoding" in v.lower() for v in folded), r


def _assert_length(r: Response, n: int) -> None:
    assert r.header("content-length") == str(n) and r.framing == "length", r


def _assert_no_length(r: Response) -> None:
    assert r.header("content-length") is None, f"Content-Length relayed beside Transfer-Encoding: {r!r}"


def _assert_not_close_framed(r: Response) -> None:
    assert r.framing in ("chunked", "length"), f"an HTTP/1.1 client got a close-delimited body: {r!r}"


def _assert_bodiless(r: Response, status: int) -> None:
    assert r.status == status, r
    assert r.body == b"" and r.framing == "none", r
    assert r.header("transfer-encoding") is None, f"a {status} with Transfer-Encoding: {r!r}"


def _assert_head_answer(r: Response) -> None:
    assert r.status == 200 and r.body == b"", r
    cl = r.header("content-length")
    assert cl in (None, "1000"), f"HEAD answer's Content-Length {cl!r}, the origin said 1000: {r!r}"


# ------------------------------------------------------------------------------------------
# Fixtures
# ------------------------------------------------------------------------------------------

@pytest.fixture(params=RUN_ENGINES)
def engine(request) -> str:
    return request.param


@pytest.fixture
def origin():
    s = FramingOrigin()
    yield s
    s.stop()


@pytest.fixture
def fproxy(sluice_factory, engine):
    """Sluice whose default policy picks `engine` for upstream HTTP/1.1."""
    return sluice_factory({"policies": {"default": {"upstream": {"engine": engine}}}})


# ------------------------------------------------------------------------------------------
# The exchange and its checks
# ------------------------------------------------------------------------------------------

def is_sluice_error(r: Response | None) -> bool:
    return r is not None and r.status >= 500 and r.body.startswith(b"sluice: ")


def exchange(proxy, origin: FramingOrigin, name: str, case: Case) -> tuple[str, Response | None, ConnRec]:
    """Sends the case's request through Sluice; returns (outcome, response, connection)."""
    url = origin.script(f"/{name}", Answer(case.wire, after=case.after))
    c = ConnRec(HOST, proxy.port, timeout=15)
    c.send(request_bytes(case.method, url, headers=case.headers, body=case.body))
    try:
        r = c.read_response(method=case.method, allow_truncated=True, timeout=15)
    except (ProtocolError, Truncated) as e:
        c.close()
        pytest.fail(f"[{name}] the client received bytes it cannot frame: {e}\nreceived: {bytes(c.seen[:2000])!r}")
    if r is None:
        return CLOSED, r, c
    if is_sluice_error(r):
        return REJECT, r, c
    return (PASS if r.complete else CUT), r, c


def describe(outcome: str, r: Response | None, c: ConnRec) -> str:
    return f"observed {outcome}: {r!r}; connection {'closed' if c.eof else 'open'}; received {bytes(c.seen[:600])!r}"


def check_outcome(engine: str, name: str, case: Case, outcome: str, r: Response | None, c: ConnRec,
                  origin: FramingOrigin) -> None:
    want = case.expect[engine]
    allowed = want if isinstance(want, frozenset) else frozenset({want})
    why = f" ({case.why})" if engine == "curl" and case.why else ""
    assert outcome in allowed, f"[{engine}] {name}: expected {'/'.join(sorted(allowed))}{why}; {describe(outcome, r, c)}"
    if outcome == REJECT:
        # docs/errors.md: 502, `sluice: upstream HOST:PORT failed: REASON`
        assert_sluice_error(r, 502, f"upstream {HOST}:{origin.port} failed:")
        reason = r.body.decode().split("failed:", 1)[1].strip()
        assert reason, f"the 502 does not say what was wrong: {r.body!r}"
        if engine == "native" and case.hint:
            assert re.search(case.hint, reason, re.I), \
                f"the 502's reason {reason!r} does not name the problem (expected /{case.hint}/)"
        for mark in SMUGGLE_MARKS + (b"X-Big-", b"X-Folded", b"X-Nul"):
            assert mark not in r.raw_head, f"the origin's fields reached the client in the 502's head: {r.raw_head!r}"
    elif outcome == CUT:
        assert r.status < 500, r
        assert c.eof, f"a cut-off response left the connection open: {describe(outcome, r, c)}"
        if r.framing == "chunked":
            assert not bytes(c.seen).endswith(b"0\r\n\r\n"), "a cut-off chunked body ended with the last chunk"
        if r.framing == "length":
            assert len(r.body) < int(r.header("content-length")), r
        assert r.framing != "close", f"a cut-off body the client cannot tell from a complete one: {r!r}"
    elif outcome == PASS:
        assert r.framing in ("length", "chunked", "none"), \
            f"an HTTP/1.1 client got a response only the connection's end frames: {r!r}"
        for interim in r.interim:
            assert 100 <= interim.status < 200, interim
        assert case.check is not None, f"{name}: no check for a relayed response"
        case.check(r)


def check_no_smuggling(engine: str, name: str, outcome: str, r: Response | None, c: ConnRec,
                       origin: FramingOrigin) -> None:
    """The connection is closed, or the next request on it gets a fresh answer from the origin
    (not the smuggled one); the smuggled marks never reached the client."""
    try:
        announced_close = r is not None and "close" in r.connection_tokens()
        if c.eof or announced_close:
            assert c.wait_closed(5), f"[{engine}] {name}: `Connection: close` but the connection stayed open"
        else:
            nxt = f"/next-after-{name}"
            c.send(request_bytes("GET", f"{origin.url}{nxt}"))
            try:
                r2 = c.read_response(timeout=15, allow_truncated=True)
            except (ProtocolError, Truncated) as e:
                pytest.fail(f"[{engine}] {name}: the next request's answer cannot be framed: {e}\n"
                            f"received: {bytes(c.seen[-2000:])!r}")
            assert r2 is not None, (f"[{engine}] {name}: the connection stayed open after {outcome} "
                                    f"but closed on the next request without an answer")
            assert r2.header("x-smuggled") is None, f"[{engine}] {name}: the smuggled response reached the client: {r2!r}"
            seen = origin.requests(nxt)
            assert len(seen) == 1, f"[{engine}] {name}: the origin got {len(seen)} requests for {nxt}; answer {r2!r}"
            assert r2.status == 200 and r2.complete and r2.header("x-fresh") == "yes", \
                f"[{engine}] {name}: the next request did not get the origin's fresh answer: {r2!r}"
            assert r2.body == fresh_body(nxt, seen[0].seq), f"[{engine}] {name}: next answer {r2!r}"
            if outcome != PASS:
                # RFC 9112 §6.3: after a response it discards, a proxy MUST close the upstream
                # connection: a new request never reuses it.
                bad = origin.conn_of(f"/{name}")
                assert bad is not None and seen[0].conn != bad.n, \
                    f"[{engine}] {name}: the connection that carried the bad response was reused"
        received = bytes(c.seen)
        for mark in SMUGGLE_MARKS:
            assert mark not in received, f"[{engine}] {name}: {mark!r} reached the client: {received[-2000:]!r}"
    finally:
        c.close()
    if outcome in (REJECT, CUT, CLOSED):
        bad = origin.conn_of(f"/{name}")
        assert bad is not None, f"{name}: the origin never got the request"
        if origin.answers[f"/{name}"].after == "keep":
            assert wait_until(lambda: bad.peer_closed, 5), \
                f"[{engine}] {name}: Sluice kept the upstream connection that carried a bad response open"


# ------------------------------------------------------------------------------------------
# Tests
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(BAD))
def test_bad_upstream_response_is_never_relayed_as_framed(fproxy, origin, engine, name):
    case = BAD[name]
    outcome, r, c = exchange(fproxy, origin, name, case)
    try:
        check_outcome(engine, name, case, outcome, r, c, origin)
    except BaseException:
        c.close()
        raise
    check_no_smuggling(engine, name, outcome, r, c, origin)


@pytest.mark.parametrize("name", list(GOOD))
def test_valid_upstream_response_is_relayed_correctly_framed(fproxy, origin, engine, name):
    case = GOOD[name]
    outcome, r, c = exchange(fproxy, origin, name, case)
    try:
        check_outcome(engine, name, case, outcome, r, c, origin)
    except BaseException:
        c.close()
        raise
    check_no_smuggling(engine, name, outcome, r, c, origin)


# ------------------------------------------------------------------------------------------
# Interim responses (RFC 9110 §15.2): forwarded to HTTP/1.1 clients, never stored
# ------------------------------------------------------------------------------------------

INTERIMS = (b"HTTP/1.1 102 Processing\r\n\r\n"
            b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload; as=style\r\nConnection: X-Hop\r\n"
            b"X-Hop: dropped\r\n\r\n")
FINAL = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nCache-Control: max-age=60\r\nContent-Length: 5\r\n\r\nhello"


def test_interim_responses_reach_http11_clients_and_are_not_stored(sluice_factory, origin, engine):
    proxy = sluice_factory({"policies": {"default": {"upstream": {"engine": engine}}},
                            "cache_store": {"memory": "8MiB"}})
    url = origin.script("/early", Answer(INTERIMS + FINAL))
    c = RawConn(HOST, proxy.port, timeout=15)
    c.send(request_bytes("GET", url))
    r = c.read_response(timeout=15)
    c.close()
    assert r is not None and r.status == 200 and r.body == b"hello", r
    assert [i.status for i in r.interim] == [102, 103], r.interim
    early = r.interim[1]
    assert early.header("link") == "</style.css>; rel=preload; as=style", early
    assert early.header("x-hop") is None and early.header("connection") is None, "hop-by-hop fields are not forwarded"
    assert (early.header("via") or "").startswith("1.1 "), "a forwarded message carries Sluice's Via (RFC 9110 §7.6.3)"
    assert r.header("link") is None, "the interim head's fields are not the final response's"
    # The stored response is the final one alone: a hit has no interim head and no Link.
    c = RawConn(HOST, proxy.port, timeout=15)
    c.send(request_bytes("GET", url))
    hit = c.read_response(timeout=15)
    c.close()
    assert hit.status == 200 and hit.body == b"hello" and hit.header("cache-status").startswith("Sluice; hit"), hit
    assert hit.interim == [] and hit.header("link") is None, hit
    # An HTTP/1.0 client never gets a 1xx (§15.2): a fresh URL, so the origin answers again.
    url10 = origin.script("/early10", Answer(INTERIMS + FINAL))
    c = RawConn(HOST, proxy.port, timeout=15)
    c.send(request_bytes("GET", url10, version="HTTP/1.0"))
    r10 = c.read_response(timeout=15)
    c.close()
    assert r10.status == 200 and r10.body == b"hello" and r10.interim == [], r10
