"""Monitors (docs/configuration.md, "Monitors"): the JSON-lines access log (fields and their
values for known exchanges, errors, redirects, CONNECT tunnels, aborted clients), the debug
monitor's curl lines, and redaction: no secret value (bearer token, basic password, api_key
values, redact_query parameters, URL userinfo) in the access log, debug output, stderr,
error responses, or `sluice check --host` output."""

import json
import re
import socket
import ssl
import time
from datetime import datetime, timezone

from policy_support import (AccessLog, debug_lines, monitors, run_check, secret_env,  # noqa: F401
                            wait_debug)
from rawhttp import RawConn, request_bytes
from support import HOST, connect_through, session_via, tail, wait_until

TIME_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")
FIELDS = ("time", "id", "client", "method", "url", "policy", "status", "bytes_in", "bytes_out",
          "attempts", "timings", "redirects", "outcome")
TIMINGS = ("dns", "connect", "tls", "first_byte", "total")


def assert_entry_shape(e: dict, tunnel: bool = False) -> None:
    missing = [f for f in FIELDS if f not in e and not (tunnel and f == "timings")]
    assert not missing, f"access-log line lacks {missing}: {e}"
    assert TIME_RE.match(e["time"]), f"time {e['time']!r} is not RFC 3339 UTC with milliseconds"
    t = datetime.strptime(e["time"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
    assert abs((datetime.now(timezone.utc) - t).total_seconds()) < 120, f"time {e['time']} is not now"
    assert isinstance(e["id"], (str, int)) and str(e["id"]), e
    assert re.match(r"^(\d{1,3}(\.\d{1,3}){3}|\[[0-9a-f:]+\]):\d+$", e["client"]), e["client"]
    for k in ("status", "bytes_in", "bytes_out", "attempts", "redirects"):
        assert isinstance(e[k], int) and e[k] >= 0, f"{k}={e[k]!r} in {e}"
    assert e["outcome"] in ("ok", "error", "client_aborted", "upstream_aborted", "tunnel"), e
    if "upstream_protocol" in e:  # written with the engine, null in the same cases
        assert e.get("upstream_engine", "absent") in ("native", "curl", None), e
        if e["upstream_protocol"] is None:
            assert e["upstream_engine"] is None, e
    tm = e.get("timings")
    if tunnel and tm is None:
        return  # a tunnel has no HTTP try; its line may leave timings out
    assert isinstance(tm, dict) and all(k in tm for k in TIMINGS), f"timings {tm!r}"
    for k in TIMINGS:
        assert isinstance(tm[k], (int, float)) and tm[k] >= 0, f"timings.{k}={tm[k]!r}"


def log_proxy(sluice_factory, tmp_path, extra: dict | None = None, debug=None):
    log = tmp_path / "access.log"
    cfg = {"monitors": monitors(access=log, debug=debug)}
    cfg.update(extra or {})
    return sluice_factory(cfg), AccessLog(log)


# ------------------------------------------------------------------------------------------
# access_log
# ------------------------------------------------------------------------------------------

def test_access_log_known_post(sluice_factory, httpbin, tmp_path):
    proxy, log = log_proxy(sluice_factory, tmp_path, {"policies": {
        HOST: {"adapters": [{"headers": {"set": {"X-Logged": "1"}}}]}}})
    url = httpbin.url + "/anything/log?x=1"
    with RawConn(HOST, proxy.port) as c:
        client = "%s:%d" % c.sock.getsockname()[:2]
        c.send(request_bytes("POST", url, {"Content-Type": "text/plain"}, body=b"b" * 1000))
        r = c.read_response(method="POST")
        t_done = time.monotonic()
    assert r.status == 200, r
    e = log.wait_for(lambda e: e.get("method") == "POST")[0]
    # the writer flushes at least every 200 ms; allow generous slack for a loaded machine
    assert time.monotonic() - t_done < 1.5, "the access-log line took over 1.5 s to reach the file"
    assert_entry_shape(e)
    assert e["client"] == client, e
    assert e["url"] == url, e
    assert e["policy"] == HOST, e
    assert e["status"] == 200
    assert e["bytes_in"] == 1000, e
    assert e["bytes_out"] == len(r.body), (e, len(r.body))
    assert e["attempts"] == 1 and e["redirects"] == 0, e
    assert e["outcome"] == "ok", e
    assert e.get("error") in (None, ""), e
    tm = e["timings"]
    assert tm["total"] > 0 and all(tm[k] <= tm["total"] for k in TIMINGS), tm


def test_access_log_one_line_each_with_unique_ids_and_default_policy(sluice_factory, httpbin, tmp_path):
    proxy, log = log_proxy(sluice_factory, tmp_path, {"policies": {HOST: {"redirect": "do_not_follow"}}})
    s = session_via(proxy.url)
    for i in range(3):
        assert s.get(f"http://localhost:{httpbin.port}/get?n={i}", timeout=10).status_code == 200
    lines = log.wait_for(lambda e: "/get?n=" in e.get("url", ""), n=3)
    time.sleep(0.4)  # window: no fourth line may reach the file in it (the writer flushes every 200 ms)
    assert len(log.lines()) == 3, f"expected exactly 3 lines:\n{log.text()}"
    for e in lines:
        assert_entry_shape(e)
        assert e["policy"] == "default" and e["method"] == "GET" and e["bytes_in"] == 0, e
    assert len({str(e["id"]) for e in lines}) == 3, f"ids not unique: {[e['id'] for e in lines]}"
    assert [e["url"] for e in lines] == [f"http://localhost:{httpbin.port}/get?n={i}" for i in range(3)]


def test_access_log_counts_redirects(sluice_factory, httpbin, tmp_path):
    proxy, log = log_proxy(sluice_factory, tmp_path, {"policies": {HOST: {"redirect": {"follow": {"max": 5}}}}})
    r = session_via(proxy.url).get(httpbin.url + "/redirect/3", timeout=15, allow_redirects=False)
    assert r.status_code == 200
    e = log.wait_for()[0]
    assert_entry_shape(e)
    assert e["redirects"] == 3 and e["status"] == 200, e
    assert e["url"] == httpbin.url + "/redirect/3", e


def test_access_log_upstream_refused(sluice_factory, closed_port, tmp_path):
    proxy, log = log_proxy(sluice_factory, tmp_path)
    r = session_via(proxy.url).get(f"http://127.0.0.1:{closed_port}/x", timeout=15)
    assert r.status_code == 502
    e = log.wait_for()[0]
    assert_entry_shape(e)
    assert e["status"] == 502 and e["outcome"] == "error", e
    assert "refused" in (e.get("error") or "").lower(), e


def test_access_log_client_aborted(sluice_factory, httpbin, tmp_path):
    proxy, log = log_proxy(sluice_factory, tmp_path)
    with RawConn(HOST, proxy.port) as c:
        c.send(request_bytes("GET", f"{httpbin.url}/drip?numbytes=20&duration=4&delay=0"))
        assert c.read_head(timeout=10).status == 200
    e = log.wait_for(timeout=10)[0]
    assert_entry_shape(e)
    assert e["outcome"] == "client_aborted", e
    assert e["bytes_out"] < 20, e


def test_access_log_connect_tunnel(sluice_factory, nginx, pki, tmp_path):
    proxy, log = log_proxy(sluice_factory, tmp_path)
    raw = socket.create_connection((HOST, proxy.port), timeout=10)
    try:
        head = connect_through(raw, f"{HOST}:{nginx.https_port}")
        assert head.startswith(b"HTTP/1.1 200"), head
        ctx = ssl.create_default_context(cafile=str(pki.ca_pem))
        tls = ctx.wrap_socket(raw, server_hostname=HOST)
        tls.sendall(f"GET /1k HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n".encode())
        got = b""
        while True:
            d = tls.recv(65536)
            if not d:
                break
            got += d
        assert got.endswith(nginx.file_1k)
        tls.close()
    finally:
        raw.close()
    e = log.wait_for(lambda e: e.get("method") == "CONNECT", timeout=10)[0]
    assert_entry_shape(e, tunnel=True)
    assert e["outcome"] == "tunnel", e
    assert str(nginx.https_port) in e["url"], e
    assert e["bytes_in"] > 100 and e["bytes_out"] > 1024, f"tunnel byte counts {e}"


def test_access_log_never_contains_userinfo(sluice_factory, httpbin, tmp_path):
    proxy, log = log_proxy(sluice_factory, tmp_path, debug=tmp_path / "debug.log")
    with RawConn(HOST, proxy.port) as c:
        c.send(request_bytes("GET", f"http://alice:hunter2pw@127.0.0.1:{httpbin.port}/get",
                             host=f"127.0.0.1:{httpbin.port}"))
        r = c.read_response()
    assert r is not None and r.status == 400, r
    assert b"hunter2pw" not in r.body
    # a normal request afterwards, so the log has flushed something
    assert session_via(proxy.url).get(httpbin.url + "/get?after=1", timeout=10).status_code == 200
    log.wait_for(lambda e: "after=1" in e.get("url", ""))
    wait_debug(tmp_path / "debug.log", lambda m: "after=1" in m.group(3))  # the debug log has flushed past it too
    for text, where in ((log.text(), "access log"), (tail(tmp_path / "debug.log"), "debug log"),
                        (proxy.stderr(), "stderr")):
        assert "hunter2pw" not in text and "alice:" not in text, f"userinfo in {where}:\n{text}"


# ------------------------------------------------------------------------------------------
# debug
# ------------------------------------------------------------------------------------------

def test_debug_curl_line_per_try(sluice_factory, httpbin, tmp_path):
    dbg = tmp_path / "debug.log"
    proxy, log = log_proxy(sluice_factory, tmp_path, {"policies": {
        "default": {"adapters": [{"headers": {"set": {"X-Added-By-Policy": "visible"}}}]}}}, debug=dbg)
    s = session_via(proxy.url)
    r = s.get(httpbin.url + "/get?d=1", timeout=10, headers={
        "Authorization": "Bearer client-secret-xyz", "Cookie": "sess=cookievalue123",
        "Proxy-Authorization": "Basic cHJveHk6cGFzcw==", "X-Plain": "shown"})
    assert r.status_code == 200
    r = s.post(httpbin.url + "/post", data=b"abc", timeout=10)
    assert r.status_code == 200

    get_line = wait_debug(dbg, lambda m: "/get?d=1" in m.group(3))[0]
    post_line = wait_debug(dbg, lambda m: "/post" in m.group(3))[0]
    assert get_line.group(2) == "1" and post_line.group(2) == "1", "first try is `try 1`"
    cmd = get_line.group(3)
    assert cmd.startswith("-X GET "), cmd
    assert cmd.rstrip().endswith(f"'{httpbin.url}/get?d=1'"), cmd
    assert "-H 'X-Plain: shown'" in cmd, cmd
    assert "-H 'X-Added-By-Policy: visible'" in cmd, f"adapter edits should show in the try's command: {cmd}"
    for name in ("Authorization", "Cookie", "Proxy-Authorization"):
        assert re.search(rf"-H '{name}: <redacted>'", cmd, re.I) or name not in cmd, \
            f"{name} not redacted: {cmd}"
    for leak in ("client-secret-xyz", "cookievalue123", "cHJveHk6cGFzcw=="):
        assert leak not in cmd, cmd
    assert post_line.group(3).startswith("-X POST "), post_line.group(3)
    assert get_line.group(1) != post_line.group(1), "two requests share a debug id"
    # the debug id is the request id of the access log
    ids = {str(e["id"]) for e in log.wait_for(n=2)}
    assert {get_line.group(1), post_line.group(1)} <= ids, (ids, get_line.group(1), post_line.group(1))
    time.sleep(0.3)  # window: no third try line may reach the debug log in it
    assert len(debug_lines(tail(dbg))) == 2, f"expected exactly 2 tries:\n{tail(dbg)}"


def test_debug_to_stderr(sluice_factory, httpbin):
    proxy = sluice_factory({"monitors": [{"debug": {"path": "stderr"}}]})
    assert session_via(proxy.url).get(httpbin.url + "/get?on=stderr", timeout=10).status_code == 200
    wait_debug(proxy.stderr, lambda m: "on=stderr" in m.group(3))


def test_access_log_to_stdout(sluice_factory, httpbin):
    proxy = sluice_factory({"monitors": [{"access_log": {"path": "stdout"}}]})
    assert session_via(proxy.url).get(httpbin.url + "/get?on=stdout", timeout=10).status_code == 200

    def found():
        for line in proxy.stdout().splitlines():
            try:
                if "on=stdout" in json.loads(line).get("url", ""):
                    return True
            except ValueError:
                continue
        return False

    assert wait_until(found, 5), f"no access-log line on stdout:\n{proxy.stdout()}"


# ------------------------------------------------------------------------------------------
# Redaction everywhere
# ------------------------------------------------------------------------------------------

def test_no_secret_in_any_output(sluice_factory, httpbin, closed_port, tmp_path, secret_env):
    sec = secret_env
    log = AccessLog(tmp_path / "access.log")
    proxy = sluice_factory({
        "redact_query": ["signature"],
        "monitors": [{"access_log": {"path": str(log.path)}}, {"debug": {"path": "stderr"}}],
        "policies": {
            HOST: {"adapters": [
                {"bearer": "${E2E_TOKEN}"},
                {"api_key": {"header": "X-Api-Key", "value": "${E2E_HEADER_KEY}"}},
                {"api_key": {"query": "api_key", "value": "${E2E_QUERY_KEY}"}},
            ]},
            "localhost": {"adapters": [{"basic": {"username": sec.user, "password": "${E2E_PASSWORD}"}}]},
        },
    })
    s = session_via(proxy.url)
    # 1. the secrets really travel upstream
    r = s.get(httpbin.url + "/anything/one?signature=SIGVALzz81&x=1", timeout=10)
    j = r.json()
    assert j["headers"]["Authorization"] == f"Bearer {sec.token}"
    assert j["headers"]["X-Api-Key"] == sec.header_key
    assert j["args"]["api_key"] == sec.query_key and j["args"]["signature"] == "SIGVALzz81"
    # 2. a secret value in the client's own URL path
    assert s.get(f"{httpbin.url}/anything/{sec.token}", timeout=10).status_code == 200
    # 3. the api_key query name sent by the client
    assert s.get(httpbin.url + "/anything/three?api_key=CLIENTKEYqq7", timeout=10).status_code == 200
    # 4. basic on another host
    r = s.get(f"http://localhost:{httpbin.port}/anything/four", timeout=10)
    assert r.json()["headers"]["Authorization"] == f"Basic {sec.basic_b64}"
    # 5. an error: refused upstream, same policy (secrets in the try's headers)
    r = s.get(f"http://127.0.0.1:{closed_port}/anything?signature=SIGVALzz81", timeout=10)
    assert r.status_code == 502
    sec.assert_absent(r.text, "a 502 error response")
    assert "SIGVALzz81" not in r.text

    lines = log.wait_for(n=5, timeout=10)
    tries = sum(e["attempts"] for e in lines)
    # the debug lines (one per try) flush on their own: all of them are in stderr before it is searched
    assert wait_until(lambda: len(debug_lines(proxy.stderr())) >= tries, 10), \
        f"expected {tries} debug lines, one per try:\n{proxy.stderr()}"
    one = next(e for e in lines if "/anything/one" in e["url"])
    assert "signature=<redacted>" in one["url"], one["url"]
    three = next(e for e in lines if "/anything/three" in e["url"])
    assert "api_key=<redacted>" in three["url"], three["url"]
    two = [e for e in lines if e["url"].startswith(f"{httpbin.url}/anything/") and "one" not in e["url"]
           and "three" not in e["url"]]
    assert any("<redacted>" in e["url"] for e in two), f"token in the path not redacted: {[e['url'] for e in two]}"
    assert len(debug_lines(proxy.stderr())) >= 5, f"debug lines missing:\n{proxy.stderr()}"

    outputs = {"access log": log.text(), "stderr (debug)": proxy.stderr(), "stdout": proxy.stdout()}
    for host in (HOST, "localhost"):
        c = run_check(proxy.config_path, host)
        assert c.returncode == 0, c.stderr
        assert "<redacted>" in c.stdout, f"check --host {host} shows no <redacted>:\n{c.stdout}"
        outputs[f"check --host {host}"] = c.stdout + c.stderr
    for where, text in outputs.items():
        sec.assert_absent(text, where)
        for v in ("SIGVALzz81", "CLIENTKEYqq7"):
            assert v not in text, f"redacted query value {v} appears in {where}"


def test_access_log_adapter_failure(sluice_factory, recorder, tmp_path):
    proxy, log = log_proxy(sluice_factory, tmp_path, {"policies": {HOST: {"adapters": ["deflate"]}}})
    with RawConn(HOST, proxy.port) as c:
        c.send(request_bytes("POST", recorder.url + "/fail", {"Content-Encoding": "gzip"}, body=b"x" * 100))
        r = c.read_response(method="POST")
    assert r.status == 502, r
    e = log.wait_for()[0]
    assert e["status"] == 502 and e["outcome"] == "error", e
    assert "deflate" in (e.get("error") or ""), e
    assert e["attempts"] == 0, f"nothing was sent upstream, so no try: {e}"


def test_access_log_bytes_in_counts_client_bytes_of_chunked_deflated_body(sluice_factory, recorder, tmp_path):
    from rawhttp import chunked
    proxy, log = log_proxy(sluice_factory, tmp_path, {"policies": {HOST: {"adapters": ["deflate"]}}})
    body = b"0123456789" * 500
    with RawConn(HOST, proxy.port) as c:
        c.send(request_bytes("POST", recorder.url + "/chunked", {"Transfer-Encoding": "chunked"})
               + chunked([body[:1234], body[1234:]]))
        r = c.read_response(method="POST")
    assert r.status == 200, r
    e = log.wait_for()[0]
    assert_entry_shape(e)
    assert e["bytes_in"] == 5000, f"bytes_in counts request body bytes read from the client: {e}"
    assert e["bytes_out"] == len(b"recorded"), e


# ------------------------------------------------------------------------------------------
# X-Request-Id
# ------------------------------------------------------------------------------------------

def test_x_request_id_is_kept_or_generated_sent_upstream_and_logged(sluice_factory, httpbin, tmp_path):
    proxy, log = log_proxy(sluice_factory, tmp_path, {"policies": {
        "localhost": {"adapters": [{"headers": {"set": {"X-Edited": "1"}}}, {"deflate": {"min_bytes": 100000}}]}}})
    s = session_via(proxy.url)
    # (httpbin hides X-Request-Id from /headers unless show_env=1)
    # the client's own id travels unchanged and is logged
    r = s.get(httpbin.url + "/headers?kept=1&show_env=1", headers={"X-Request-Id": "client-chosen-42"}, timeout=10)
    assert r.json()["headers"]["X-Request-Id"] == "client-chosen-42"
    # without one, Sluice makes one: the fast path (no adapters) ...
    ids = [s.get(httpbin.url + f"/headers?made={i}&show_env=1", timeout=10).json()["headers"]["X-Request-Id"] for i in range(3)]
    # ... and the adapter path (a request model)
    ids.append(s.get(f"http://localhost:{httpbin.port}/headers?model=1&show_env=1", timeout=10).json()["headers"]["X-Request-Id"])
    assert len(set(ids)) == 4, ids
    assert all(re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]+", i) for i in ids), ids
    assert len({i.split("-")[0] for i in ids}) == 1, "one process, one tag"
    entries = log.wait_for(lambda e: "/headers?" in e.get("url", ""), n=5)
    by_url = {e["url"].split("?")[1].split("&")[0]: e for e in entries}
    assert by_url["kept=1"]["request_id"] == "client-chosen-42"
    for i in range(3):
        e = by_url[f"made={i}"]
        assert e["request_id"] == ids[i], (e, ids)
        assert int(e["request_id"].split("-")[1], 16) == int(e["id"]), "the made id carries the access log's id"
    assert by_url["model=1"]["request_id"] == ids[3]


def test_x_request_id_is_the_same_on_every_try(sluice_factory, tmp_path):
    import http.server
    import threading as th
    seen: list[str] = []

    class Flaky(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.headers.get("X-Request-Id", ""))
            code = 503 if len(seen) < 3 else 200
            self.send_response(code)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer((HOST, 0), Flaky)
    t = th.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        proxy, log = log_proxy(sluice_factory, tmp_path, {"policies": {
            "default": {"retry": {"limit": 3, "backoff": {"scale": "1ms"}}}}})
        r = session_via(proxy.url).get(f"http://{HOST}:{srv.server_address[1]}/flaky", timeout=10)
        assert r.status_code == 200 and len(seen) == 3
        assert len(set(seen)) == 1 and seen[0], seen
        [e] = log.wait_for(lambda e: "/flaky" in e.get("url", ""))
        assert e["request_id"] == seen[0] and e["attempts"] == 3, e
    finally:
        srv.shutdown()
