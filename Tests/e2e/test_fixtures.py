"""The upstreams themselves, accessed directly (no Sluice): if these fail, the fault is in the
test environment, not in the proxy."""

import hashlib
import json
import socket
import time

import pytest

from support import HOST, run_curl, session_via, wait_until
from rawhttp import RawConn, chunked, request_bytes


def test_httpbin_direct(httpbin):
    r = session_via(None).post(httpbin.url + "/post", data=b"hello", timeout=10)
    assert r.status_code == 200
    assert r.json()["data"] == "hello"


def test_httpbin_streams_chunked(httpbin):
    with RawConn(HOST, httpbin.port) as c:
        c.send(request_bytes("GET", "/stream/3", host=f"{HOST}:{httpbin.port}"))
        r = c.read_response()
    assert r.status == 200 and r.framing == "chunked"
    assert len(r.body.splitlines()) == 3


def test_httpbin_drip_is_slow(httpbin):
    t0 = time.monotonic()
    r = session_via(None).get(httpbin.url + "/drip?numbytes=5&duration=1&delay=0", timeout=10)
    assert r.content == b"*****"
    assert time.monotonic() - t0 >= 0.8


def test_nginx_plain_and_tls(nginx, pki):
    assert session_via(None).get(nginx.url("/1k"), timeout=10).content == nginx.file_1k
    r = run_curl(["--cacert", str(pki.ca_pem), nginx.tls_url("/1k")], timeout=20)
    assert r.returncode == 0, r.stderr
    assert r.stdout == nginx.file_1k


def test_nginx_gzip_static(nginx):
    r = run_curl(["-H", "Accept-Encoding: gzip", "-H", "Via: 1.1 x", "-D", "-", nginx.url("/data.json")])
    head, _, body = r.stdout.partition(b"\r\n\r\n")
    assert b"content-encoding: gzip" in head.lower()
    assert body == nginx.json_gz


def test_upload_sink_chunked_and_length(upload_sink):
    data = b"abc" * 100000
    with RawConn(HOST, upload_sink.port) as c:
        c.send(request_bytes("PUT", "/u", host="x", body=data))
        r1 = c.read_response()
        c.send(request_bytes("POST", "/u", host="x", headers={"Transfer-Encoding": "chunked"})
               + chunked([data[:1000], data[1000:]]))
        r2 = c.read_response()
    for r in (r1, r2):
        j = json.loads(r.body)
        assert j["sha256"] == hashlib.sha256(data).hexdigest() and j["bytes"] == len(data)
    assert json.loads(r2.body)["chunked"] is True


def test_recorder_records(recorder):
    with RawConn(HOST, recorder.port) as c:
        c.send(request_bytes("POST", "/x", host="h", body=b"12345", headers={"X-Foo": "1"}))
        assert c.read_response().body == b"recorded"
    assert wait_until(lambda: b"X-Foo: 1" in recorder.received(), 5), recorder.received()
    assert recorder.requests()[0]["body"] == b"12345"


def test_reset_server_truncates(reset_server):
    with RawConn(HOST, reset_server.port) as c:
        c.send(request_bytes("GET", "/", host="h"))
        r = c.read_response(allow_truncated=True)
    assert r.status == 200 and not r.complete and len(r.body) == 1000


def test_stall_server_never_answers(stall_server):
    with RawConn(HOST, stall_server.port, timeout=1) as c:
        c.send(request_bytes("GET", "/", host="h"))
        with pytest.raises(TimeoutError):
            c.read_response(timeout=1)


def test_slow_forever_detects_close(slow_forever_server):
    c = RawConn(HOST, slow_forever_server.port)
    c.send(request_bytes("GET", "/", host="h"))
    assert c.read_head().status == 200
    c.close()
    t_close = time.monotonic()
    rec = slow_forever_server.connections[0]
    wait_until(lambda: rec.closed_at is not None, 5)  # the assert below says what did not happen
    assert rec.closed_at is not None and rec.closed_at - t_close < 1.0, rec.note


def test_blackhole_connect_hangs(blackhole):
    if not blackhole.connect_hangs(1.0):
        pytest.skip("this kernel completes connects to a listener with a full accept queue")


def test_closed_port_refuses(closed_port):
    s = socket.socket()
    s.settimeout(2)
    with pytest.raises(ConnectionRefusedError):
        s.connect((HOST, closed_port))
    s.close()


def test_httpbin_accepts_chunked_body(httpbin):
    r = session_via(None).post(httpbin.url + "/post", data=iter([b"a", b"b"]), timeout=10)
    assert r.status_code == 200 and r.json()["data"] == "ab"


def test_nginx_wrong_name_certificate(nginx, pki):
    bad = run_curl(["--cacert", str(pki.ca_pem), f"https://{HOST}:{nginx.https_wrong_name_port}/1k"], timeout=20)
    assert bad.returncode == 60, bad.stderr  # the name does not match
    good = run_curl(["--cacert", str(pki.ca_pem), "--resolve", f"wrong.test:{nginx.https_wrong_name_port}:{HOST}",
                     f"https://wrong.test:{nginx.https_wrong_name_port}/1k"], timeout=20)
    assert good.returncode == 0 and good.stdout == nginx.file_1k, good.stderr
