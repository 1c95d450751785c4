"""The `deflate` adapter (docs/configuration.md, "Adapters"): the request body is compressed
with zlib-wrapped deflate as it streams and `Content-Encoding: deflate` is set; a
Content-Length body below `min_bytes` is sent as is, a chunked body is always compressed;
`duplicate_header` (error | replace | skip) decides what happens to a request that already
has a Content-Encoding. Checked byte-for-byte at the recording upstream."""

import gzip
import os
import time
import zlib

import pytest

from policy_support import header_values
from rawhttp import RawConn, chunked, request_bytes
from support import HOST, MiB, assert_sluice_error

TEXT = b"sluice deflate test line, fairly compressible.\n" * 4000  # ~190 KB


def deflate_proxy(sluice_factory, adapter):
    return sluice_factory({"policies": {HOST: {"adapters": [adapter]}}})


def post(proxy, url: str, body: bytes, headers: list | None = None, use_chunked: bool = False,
         chunk: int = 64 * 1024, timeout: float = 30):
    hdrs = list(headers or []) + [("Content-Type", "application/octet-stream")]
    if use_chunked:
        hdrs.append(("Transfer-Encoding", "chunked"))
        parts = [body[i:i + chunk] for i in range(0, len(body), chunk)]
        data = request_bytes("POST", url, hdrs) + chunked(parts)
    else:
        data = request_bytes("POST", url, hdrs, body=body)
    with RawConn(HOST, proxy.port, timeout=timeout) as c:
        c.send(data)
        return c.read_response(method="POST", timeout=timeout)


def the_request(recorder) -> dict:
    reqs = recorder.requests()
    assert len(reqs) == 1, f"upstream saw {len(reqs)} requests"
    q = reqs[0]
    assert q["complete"], f"upstream did not receive a complete body: {q['raw_head']!r}"
    return q


def assert_framing_sane(q: dict) -> None:
    cl = header_values(q["headers"], "Content-Length")
    te = header_values(q["headers"], "Transfer-Encoding")
    assert not (cl and te), f"both Content-Length and Transfer-Encoding upstream: {q['raw_head']!r}"
    if cl:
        assert int(cl[0]) == len(q["body"]), f"Content-Length {cl} but {len(q['body'])} body bytes"


def assert_deflated(q: dict, original: bytes) -> None:
    assert header_values(q["headers"], "Content-Encoding") == ["deflate"], q["raw_head"]
    body = bytes(q["body"])
    assert body[:1] == b"\x78", f"not a zlib stream (header byte {body[:2]!r}); raw deflate or gzip?"
    assert_framing_sane(q)
    d = zlib.decompressobj()
    out = d.decompress(body) + d.flush()
    assert d.eof, "zlib stream not terminated"
    assert d.unused_data == b"", f"{len(d.unused_data)} bytes after the zlib stream"
    assert out == original, f"decompressed {len(out)} bytes, expected {len(original)} (differs)"


def test_content_length_body_is_compressed(sluice_factory, recorder):
    proxy = deflate_proxy(sluice_factory, "deflate")
    body = TEXT + os.urandom(64 * 1024)
    r = post(proxy, recorder.url + "/cl", body)
    assert r is not None and r.status == 200 and r.body == b"recorded", r
    q = the_request(recorder)
    assert_deflated(q, body)
    assert len(q["body"]) < len(body), "a compressible body did not get smaller"


def test_chunked_5mib_random_body_is_compressed(sluice_factory, recorder):
    proxy = deflate_proxy(sluice_factory, {"deflate": {"min_bytes": "1MiB"}})
    body = os.urandom(5 * MiB)
    r = post(proxy, recorder.url + "/chunked", body, use_chunked=True, chunk=100_000, timeout=60)
    assert r is not None and r.status == 200, r
    assert_deflated(the_request(recorder), body)


def test_content_length_5mib_random_body_is_compressed(sluice_factory, recorder):
    proxy = deflate_proxy(sluice_factory, {"deflate": {"min_bytes": 0}})
    body = os.urandom(5 * MiB)
    r = post(proxy, recorder.url + "/cl-big", body, timeout=60)
    assert r is not None and r.status == 200, r
    assert_deflated(the_request(recorder), body)


def test_body_below_min_bytes_is_sent_unchanged(sluice_factory, recorder):
    proxy = deflate_proxy(sluice_factory, {"deflate": {"min_bytes": "1KiB"}})
    small = os.urandom(1023)
    r = post(proxy, recorder.url + "/small", small)
    assert r is not None and r.status == 200, r
    q = the_request(recorder)
    assert header_values(q["headers"], "Content-Encoding") == [], q["raw_head"]
    assert header_values(q["headers"], "Content-Length") == ["1023"], q["raw_head"]
    assert bytes(q["body"]) == small


def test_body_of_exactly_min_bytes_is_compressed(sluice_factory, recorder):
    proxy = deflate_proxy(sluice_factory, {"deflate": {"min_bytes": "1KiB"}})
    body = b"a" * 1024
    r = post(proxy, recorder.url + "/exact", body)
    assert r is not None and r.status == 200, r
    assert_deflated(the_request(recorder), body)


def test_small_chunked_body_is_always_compressed(sluice_factory, recorder):
    proxy = deflate_proxy(sluice_factory, {"deflate": {"min_bytes": "1MiB"}})
    body = b"tiny chunked body"
    r = post(proxy, recorder.url + "/tiny", body, use_chunked=True, chunk=5)
    assert r is not None and r.status == 200, r
    assert_deflated(the_request(recorder), body)


def test_request_without_body_is_untouched(sluice_factory, recorder):
    proxy = deflate_proxy(sluice_factory, "deflate")
    with RawConn(HOST, proxy.port) as c:
        c.send(request_bytes("GET", recorder.url + "/nobody"))
        r = c.read_response()
    assert r is not None and r.status == 200, r
    q = the_request(recorder)
    assert q["method"] == "GET" and bytes(q["body"]) == b"", q["raw_head"]


@pytest.mark.parametrize("adapter", ["deflate", {"deflate": {}}, {"deflate": {"duplicate_header": "error"}}],
                         ids=["bare-word", "empty-options", "explicit-error"])
def test_duplicate_header_error_fails_with_502_and_sends_nothing(sluice_factory, recorder, adapter):
    proxy = deflate_proxy(sluice_factory, adapter)
    gz = gzip.compress(TEXT)
    r = post(proxy, recorder.url + "/dup", gz, headers=[("Content-Encoding", "gzip")])
    assert_sluice_error(r, 502, "adapter deflate")
    assert "failed" in r.body.decode(), r
    time.sleep(0.5)  # window: the failed adapter's request must not reach the upstream in it
    assert recorder.connection_count() == 0 and recorder.received() == b"", \
        f"a failed adapter must send nothing upstream; upstream got {recorder.received()[:300]!r}"


def test_duplicate_header_replace(sluice_factory, recorder):
    proxy = deflate_proxy(sluice_factory, {"deflate": {"duplicate_header": "replace"}})
    gz = gzip.compress(TEXT)
    r = post(proxy, recorder.url + "/replace", gz, headers=[("Content-Encoding", "gzip")])
    assert r is not None and r.status == 200, r
    q = the_request(recorder)
    assert_deflated(q, gz)  # exactly one Content-Encoding, deflate; the gzip bytes inside


def test_duplicate_header_skip(sluice_factory, recorder):
    proxy = deflate_proxy(sluice_factory, {"deflate": {"duplicate_header": "skip", "min_bytes": 0}})
    gz = gzip.compress(TEXT)
    r = post(proxy, recorder.url + "/skip", gz, headers=[("Content-Encoding", "gzip")])
    assert r is not None and r.status == 200, r
    q = the_request(recorder)
    assert header_values(q["headers"], "Content-Encoding") == ["gzip"], q["raw_head"]
    assert header_values(q["headers"], "Content-Length") == [str(len(gz))], q["raw_head"]
    assert bytes(q["body"]) == gz


def test_deflate_only_for_its_host(sluice_factory, recorder, httpbin):
    """A deflate adapter on another host's entry leaves 127.0.0.1's bodies alone."""
    proxy = sluice_factory({"policies": {"localhost": {"adapters": ["deflate"]}}})
    r = post(proxy, recorder.url + "/other", TEXT)
    assert r is not None and r.status == 200, r
    q = the_request(recorder)
    assert header_values(q["headers"], "Content-Encoding") == []
    assert bytes(q["body"]) == TEXT
