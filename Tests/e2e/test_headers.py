"""Hop-by-hop header handling (RFC 9110 §7.6.1), Via, Proxy-Authorization, and the Via loop
check, observed on a recording upstream that keeps every byte it received."""

import re
import time

import pytest

from faultservers import simple_response
from rawhttp import RawConn, request_bytes
from support import HOST, assert_connection_closed, assert_sluice_error, session_via

HOP_REQUEST_HEADERS = [
    ("Connection", "keep-alive, X-Foo"),
    ("X-Foo", "must-not-pass"),
    ("Keep-Alive", "timeout=5, max=100"),
    ("TE", "trailers"),
    ("Proxy-Authorization", "Basic c2VjcmV0OnNlY3JldA=="),
    ("Proxy-Connection", "keep-alive"),
    ("Upgrade-Insecure-Requests", "1"),  # end-to-end despite its name: must pass
    ("X-Keep", "must-pass"),
]


def _names(headers):
    return {k.lower() for k, _ in headers}


def test_request_hop_by_hop_headers_not_forwarded(proxy, recorder):
    with RawConn(HOST, proxy.port) as c:
        c.send(request_bytes("GET", f"http://{HOST}:{recorder.port}/hop", headers=HOP_REQUEST_HEADERS))
        r = c.read_response()
    assert r.status == 200 and r.body == b"recorded"
    reqs = recorder.requests()
    assert len(reqs) == 1
    hdrs = reqs[0]["headers"]
    raw = reqs[0]["raw_head"].decode("latin-1")
    names = _names(hdrs)
    for gone in ("x-foo", "keep-alive", "te", "proxy-authorization", "proxy-connection"):
        assert gone not in names, f"{gone} reached the upstream:\n{raw}"
    assert "c2VjcmV0OnNlY3JldA" not in raw, f"proxy credentials reached the upstream:\n{raw}"
    for v in [v for k, v in hdrs if k.lower() == "connection"]:
        assert "x-foo" not in v.lower(), f"Connection still names X-Foo:\n{raw}"
    # and the end-to-end ones did pass
    assert ("X-Keep", "must-pass") in hdrs, raw
    assert "upgrade-insecure-requests" in names, raw
    vias = [v for k, v in hdrs if k.lower() == "via"]
    assert vias and "sluice" in vias[-1].lower(), f"no Via naming sluice:\n{raw}"


def test_via_appended_to_existing_via(proxy, recorder):
    with RawConn(HOST, proxy.port) as c:
        c.send(request_bytes("GET", f"http://{HOST}:{recorder.port}/via", headers={"Via": "1.0 upstream-proxy"}))
        assert c.read_response().status == 200
    hdrs = recorder.requests()[0]["headers"]
    via = ", ".join(v for k, v in hdrs if k.lower() == "via")
    assert via.lower().startswith("1.0 upstream-proxy"), via
    assert "sluice" in via.lower().split("upstream-proxy", 1)[1], via


def test_response_hop_by_hop_headers_stripped(proxy, recorder):
    recorder.response = simple_response(200, b"resp", extra=[
        ("Connection", "close, X-Bar"),
        ("X-Bar", "1"),
        ("Keep-Alive", "timeout=5"),
        ("Proxy-Connection", "close"),
        ("X-Keep-Resp", "yes"),
    ])
    with RawConn(HOST, proxy.port) as c:
        c.send(request_bytes("GET", f"http://{HOST}:{recorder.port}/resp"))
        r = c.read_response()
        assert r.status == 200 and r.body == b"resp"
        assert r.header("x-bar") is None, f"X-Bar (named in upstream's Connection) reached the client: {r!r}"
        assert r.header("keep-alive") is None, r
        assert r.header("proxy-connection") is None, r
        assert "x-bar" not in r.connection_tokens(), r
        assert r.header("x-keep-resp") == "yes", r
        # the upstream's "Connection: close" is about the upstream connection, not the client's
        c.send(request_bytes("GET", f"http://{HOST}:{recorder.port}/again"))
        r2 = c.read_response()
        assert r2 is not None and r2.status == 200, "client connection closed because the upstream's was"
    assert len(recorder.requests()) == 2


def test_response_via_added(proxy, httpbin):
    r = session_via(proxy.url).get(httpbin.url + "/get", timeout=10)
    assert "sluice" in r.headers.get("Via", "").lower(), r.headers


def test_via_loop_detected(proxy, recorder):
    """Send Sluice a request carrying the Via it adds itself: 508, nothing forwarded."""
    with RawConn(HOST, proxy.port) as c:
        c.send(request_bytes("GET", f"http://{HOST}:{recorder.port}/first"))
        assert c.read_response().status == 200
    own_via = [v for k, v in recorder.requests()[0]["headers"] if k.lower() == "via"]
    assert own_via, "no Via added"
    before = recorder.connection_count()
    with RawConn(HOST, proxy.port) as c:
        c.send(request_bytes("GET", f"http://{HOST}:{recorder.port}/loop", headers={"Via": own_via[-1]}))
        r = c.read_response()
        assert_sluice_error(r, 508, "loop")
        assert_connection_closed(c)
    time.sleep(0.3)  # window: the looping request must not reach the upstream in it
    assert recorder.connection_count() == before
    assert len(recorder.requests()) == 1


def test_via_loop_detected_inside_a_via_list(proxy, recorder):
    with RawConn(HOST, proxy.port) as c:
        c.send(request_bytes("GET", f"http://{HOST}:{recorder.port}/first"))
        assert c.read_response().status == 200
    own = [v for k, v in recorder.requests()[0]["headers"] if k.lower() == "via"][-1]
    before = recorder.connection_count(), len(recorder.received())
    with RawConn(HOST, proxy.port) as c:
        c.send(request_bytes("GET", f"http://{HOST}:{recorder.port}/loop",
                             headers=[("Via", f"1.0 first-hop, {own}"), ("Via", "1.1 later-hop")]))
        assert_sluice_error(c.read_response(), 508, "loop")
    time.sleep(0.3)  # window: the looping request must not reach the upstream in it
    assert (recorder.connection_count(), len(recorder.received())) == before


def test_foreign_via_is_not_a_loop(proxy, recorder):
    with RawConn(HOST, proxy.port) as c:
        c.send(request_bytes("GET", f"http://{HOST}:{recorder.port}/v", headers={"Via": "1.1 sluice-other, 1.1 squid"}))
        r = c.read_response()
    assert r.status == 200, r


# ------------------------------------------------------------------------------------------
# The response head Sluice relays is well-formed even when the upstream's is not
# ------------------------------------------------------------------------------------------

TOKEN_LINE = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[ \t]*[^\r\n\x00]*$")

BAD_RESPONSE_HEADS = {
    # RFC 9112 §5.2: obs-fold in a response -> 502, or replaced by SP before forwarding
    "obs_fold": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Fold: a\r\n b\r\n\r\nok",
    # RFC 9110 §5.5: CR, LF, NUL in a field value -> reject, or replace with SP
    "bare_cr_in_value": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Cr: a\rX-Injected: 1\r\n\r\nok",
    "nul_in_value": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Nul: a\x00b\r\n\r\nok",
    # RFC 9112 §5.1: "a proxy MUST remove any such whitespace [before the colon] from a
    # response message before forwarding the message downstream"
    "space_before_colon": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Sp : x\r\n\r\nok",
    # bare LF line ends are tolerated by recipients, but what is forwarded uses CRLF
    "bare_lf_lines": b"HTTP/1.1 200 OK\nContent-Length: 2\nX-A: 1\n\nok",
}


@pytest.mark.parametrize("case", sorted(BAD_RESPONSE_HEADS))
def test_relayed_response_head_is_well_formed(proxy, recorder, case):
    recorder.response = BAD_RESPONSE_HEADS[case]
    with RawConn(HOST, proxy.port) as c:
        c.send(request_bytes("GET", f"http://{HOST}:{recorder.port}/{case}"))
        head = c.read_head(timeout=10)
        assert head is not None
        if head.status == 502:
            assert_sluice_error(c.read_body(head), 502, "upstream")
            return
        assert head.status == 200, head
        lines = head.raw_head[:-4].split(b"\r\n")[1:]
        bad = [ln for ln in lines if not TOKEN_LINE.match(ln)]
        assert not bad, f"malformed header lines relayed to the client: {bad!r}\nfull head: {head.raw_head!r}"
        assert c.read_body(head).body == b"ok"
