"""Hot reload (docs/configuration.md, "Reloading"): SIGHUP re-reads --config; a valid file
replaces policies, monitors and routes for new requests, in-flight requests finish, route
listeners open and close; an invalid file changes nothing and is reported with file:line:col;
and reloads under keep-alive load lose no request."""

import re
import threading
import time

import pytest
import yaml

from faultservers import pick_port
from policy_support import (AccessLog, read_config, set_sections, sighup, stderr_since, stderr_len,
                            until, write_config_text)
from rawhttp import RawConn, request_bytes
from support import HOST, port_open, session_via, wait_until


def gen_policies(value: str) -> dict:
    return {"default": {"adapters": [{"headers": {"set": {"X-Gen": value}}}]}}


def gen_of(proxy_url: str, httpbin, timeout: float = 10) -> str | None:
    r = session_via(proxy_url).get(httpbin.url + "/headers", timeout=timeout)
    assert r.status_code == 200, r.text
    return r.json()["headers"].get("X-Gen")


def wait_gen(proxy, httpbin, value: str, timeout: float = 5.0) -> None:
    last = []

    def ok():
        last[:] = [gen_of(proxy.url, httpbin)]
        return last[0] == value

    assert wait_until(ok, timeout, 0.1), f"X-Gen still {last} {timeout}s after SIGHUP, expected {value!r}\n" \
                                         f"stderr:\n{proxy.stderr()}"




def test_valid_change_applies_to_new_requests(sluice_factory, httpbin):
    proxy = sluice_factory({"policies": gen_policies("one")})
    assert gen_of(proxy.url, httpbin) == "one"
    set_sections(proxy, policies=gen_policies("two"))
    sighup(proxy)
    wait_gen(proxy, httpbin, "two")
    for _ in range(5):
        assert gen_of(proxy.url, httpbin) == "two"
    assert proxy.alive()


def test_reload_removing_policies(sluice_factory, httpbin):
    proxy = sluice_factory({"policies": gen_policies("one")})
    assert gen_of(proxy.url, httpbin) == "one"
    set_sections(proxy, policies=None)
    sighup(proxy)
    until(lambda: gen_of(proxy.url, httpbin) is None, 5, 0.1, "policies removed by reload")


def test_inflight_request_finishes_across_reload(sluice_factory, httpbin):
    proxy = sluice_factory({"policies": gen_policies("one")})
    with RawConn(HOST, proxy.port, timeout=20) as c:
        c.send(request_bytes("GET", f"{httpbin.url}/drip?numbytes=20&duration=2&delay=0"))
        head = c.read_head(timeout=10)
        assert head.status == 200
        set_sections(proxy, policies=gen_policies("two"))
        sighup(proxy)
        wait_gen(proxy, httpbin, "two")
        body, complete = c._read_exact(20, time.monotonic() + 15)
    assert complete, f"in-flight body truncated after reload: {body!r}"
    assert body == b"*" * 20, f"in-flight body after reload: {body!r}"


@pytest.mark.parametrize("bad,line,col", [
    ("policies:\n  default:\n    adapters: [ {headers: {set: {X-Gen: three}}\n", 3, None),   # YAML syntax
    ("policies:\n  default:\n    adaptors: []\n", 3, 5),                                   # unknown key
    ("policies:\n  default:\n    adapters:\n      - bearer: ${E2E_SURELY_UNSET_VAR}\n", 4, None),  # unset secret
], ids=["bad-yaml", "unknown-key", "unset-secret"])
def test_invalid_file_keeps_old_config(sluice_factory, httpbin, monkeypatch, bad, line, col):
    monkeypatch.delenv("E2E_SURELY_UNSET_VAR", raising=False)
    proxy = sluice_factory({"policies": gen_policies("one")})
    assert gen_of(proxy.url, httpbin) == "one"
    good_text = proxy.config_path.read_text()
    cfg = read_config(proxy)
    cfg.pop("policies")
    prefix = yaml.safe_dump(cfg, sort_keys=False)
    bad_line = line + prefix.count("\n")
    write_config_text(proxy, prefix + bad)
    off = stderr_len(proxy)
    sighup(proxy)
    path = re.escape(str(proxy.config_path))
    pat = re.compile(path + r":(\d+):(\d+)")
    until(lambda: pat.search(stderr_since(proxy, off)), 5, 0.05, "reload error with file:line:col on stderr")
    m = pat.search(stderr_since(proxy, off))
    if col is not None:
        assert (int(m.group(1)), int(m.group(2))) == (bad_line, col), stderr_since(proxy, off)
    else:
        assert abs(int(m.group(1)) - bad_line) <= 1, stderr_since(proxy, off)
    assert proxy.alive(), "sluice exited on an invalid reload"
    for _ in range(5):
        assert gen_of(proxy.url, httpbin) == "one", "an invalid file must change nothing"
    # and a good file afterwards is picked up
    write_config_text(proxy, good_text.replace("X-Gen: one", "X-Gen: four"))
    sighup(proxy)
    wait_gen(proxy, httpbin, "four")


def test_route_listener_added_and_removed(sluice_factory, httpbin):
    proxy = sluice_factory()
    rport = pick_port()
    assert not port_open(rport)
    set_sections(proxy, routes=[{"listen": f"{HOST}:{rport}", "upstream": httpbin.url}])
    sighup(proxy)
    until(lambda: port_open(rport), 5, 0.1, f"route listener {rport} opened by reload")
    with RawConn(HOST, rport) as c:
        c.send(request_bytes("GET", "/get?via=route", host=f"{HOST}:{rport}"))
        r = c.read_response()
    assert r.status == 200 and b'"via": "route"' in r.body, r
    set_sections(proxy, routes=None)
    sighup(proxy)
    until(lambda: not port_open(rport), 5, 0.1, f"route listener {rport} closed by reload")
    # the forward listener is unaffected
    assert session_via(proxy.url).get(httpbin.url + "/get", timeout=10).status_code == 200


def test_listen_address_added_by_reload(sluice_factory, httpbin):
    proxy = sluice_factory()
    extra = pick_port()
    cfg = read_config(proxy)
    set_sections(proxy, listen=cfg["listen"] + [f"{HOST}:{extra}"])
    sighup(proxy)
    until(lambda: port_open(extra), 5, 0.1, f"listener {extra} opened by reload")
    assert session_via(f"http://{HOST}:{extra}").get(httpbin.url + "/get", timeout=10).status_code == 200
    set_sections(proxy, listen=cfg["listen"])
    sighup(proxy)
    until(lambda: not port_open(extra), 5, 0.1, f"listener {extra} closed by reload")
    assert session_via(proxy.url).get(httpbin.url + "/get", timeout=10).status_code == 200


def test_monitor_added_by_reload(sluice_factory, httpbin, tmp_path):
    proxy = sluice_factory()
    log = AccessLog(tmp_path / "reloaded-access.log")
    set_sections(proxy, monitors=[{"access_log": {"path": str(log.path)}}])
    sighup(proxy)

    def logged():
        # A request sent before the reload applied is not logged: send another until one is.
        if any("mon=1" in e.get("url", "") for e in log.lines()):
            return True
        session_via(proxy.url).get(httpbin.url + "/get?mon=1", timeout=10)
        return False

    until(logged, 6, 0.1, "access log added by reload")


def test_workers_change_is_reported_as_ignored(sluice_factory, httpbin):
    proxy = sluice_factory({"workers": 2})
    off = stderr_len(proxy)
    set_sections(proxy, workers=3, policies=gen_policies("w"))
    sighup(proxy)
    wait_gen(proxy, httpbin, "w")  # the rest of the file still applies
    until(lambda: "workers" in stderr_since(proxy, off), 3, 0.05, "a log line saying workers was ignored")


@pytest.mark.deadline(60)
@pytest.mark.parametrize("with_log", [False, True], ids=["no-monitor", "access-log"])
def test_reloads_under_keepalive_load_lose_nothing(sluice_factory, httpbin, tmp_path, with_log):
    """4 keep-alive clients for ~8 s while 20 SIGHUPs alternate two valid configs: every
    request gets a 200 whose X-Gen is one of the two; connections are not dropped; with an
    access log in both configs, every request is logged exactly once across the swaps."""
    log = AccessLog(tmp_path / "load-access.log")
    extra = {"monitors": [{"access_log": {"path": str(log.path)}}]} if with_log else {}
    proxy = sluice_factory({"policies": gen_policies("a"), **extra})
    cfg = read_config(proxy)
    texts = {}
    for v in ("a", "b"):
        cfg["policies"] = gen_policies(v)
        texts[v] = yaml.safe_dump(cfg, sort_keys=False)

    stop = threading.Event()
    lock = threading.Lock()
    stats = {"ok": 0, "fail": [], "seen": set(), "reconnects": 0}

    def client(n: int):
        c = RawConn(HOST, proxy.port, timeout=10)
        i = 0
        try:
            while not stop.is_set() and i < 5000:
                i += 1
                try:
                    c.send(request_bytes("GET", f"{httpbin.url}/headers?c={n}&i={i}"))
                    r = c.read_response(timeout=10)
                except Exception as e:  # noqa: BLE001 - every failure is recorded
                    r = None
                    err = f"{type(e).__name__}: {e}"
                else:
                    err = "connection closed without a response" if r is None else None
                with lock:
                    if r is not None and r.status == 200:
                        stats["ok"] += 1
                        import json
                        stats["seen"].add(json.loads(r.body)["headers"].get("X-Gen"))
                    else:
                        stats["fail"].append(err or f"status {r.status}: {r.body[:200]!r}")
                if r is None or r.status != 200 or "close" in r.connection_tokens():
                    c.close()
                    c = RawConn(HOST, proxy.port, timeout=10)
                    with lock:
                        stats["reconnects"] += 1
        finally:
            c.close()

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(4)]
    for t in threads:
        t.start()
    try:
        for k in range(20):
            time.sleep(0.4)  # time passing: 20 reloads spread over 8 s of client traffic
            write_config_text(proxy, texts["b" if k % 2 == 0 else "a"])
            sighup(proxy)
        time.sleep(0.5)  # time passing: the clients keep going through the last configuration for 0.5 s
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=15)
    assert proxy.alive(), "sluice died during reloads"
    assert not stats["fail"], f"{len(stats['fail'])} failed of {stats['ok'] + len(stats['fail'])}: " \
                              f"{stats['fail'][:5]}\nstderr:\n{proxy.stderr()[-3000:]}"
    assert stats["ok"] > 100, f"only {stats['ok']} requests in 8 s"
    assert stats["seen"] <= {"a", "b"} and stats["seen"] == {"a", "b"}, \
        f"X-Gen values seen: {stats['seen']} (both configs should have served requests)"
    assert stats["reconnects"] == 0, f"{stats['reconnects']} keep-alive connections were closed by reloads"
    if with_log:
        n = stats["ok"]
        until(lambda: len(log.lines()) >= n, 5, 0.1, f"{n} access-log lines")
        time.sleep(0.5)  # window: no line may be logged twice, nor one more than the requests
        lines = log.lines()
        keys = [e["url"] for e in lines]
        assert len(lines) == n and len(set(keys)) == n, \
            f"{n} requests but {len(lines)} log lines ({len(set(keys))} distinct URLs)"


def test_reload_rereads_file_secrets(sluice_factory, httpbin, tmp_path):
    pw = tmp_path / "rotating-password"
    pw.write_text("first-pw\n")
    proxy = sluice_factory({"policies": {HOST: {"adapters": [
        {"basic": {"username": "rot", "password": f"file:{pw}"}}]}}})
    s = session_via(proxy.url)
    assert s.get(httpbin.url + "/basic-auth/rot/first-pw", timeout=10).status_code == 200
    pw.write_text("second-pw\n")
    sighup(proxy)
    until(lambda: s.get(httpbin.url + "/basic-auth/rot/second-pw", timeout=10).status_code == 200,
          5, 0.1, "the rotated secret file used after SIGHUP")


def test_route_upstream_changed_by_reload(sluice_factory, httpbin):
    """Same route listener, new upstream base: new requests go to the new base."""
    rport = pick_port()
    proxy = sluice_factory({"routes": [{"listen": f"{HOST}:{rport}", "upstream": httpbin.url + "/anything/old"}]})
    until(lambda: port_open(rport), 5, 0.1, "route listener open")

    def landed() -> str:
        with RawConn(HOST, rport) as c:
            c.send(request_bytes("GET", "/p", host=f"{HOST}:{rport}"))
            r = c.read_response()
        assert r is not None and r.status == 200, r
        import json
        return json.loads(r.body)["url"]

    assert landed() == httpbin.url + "/anything/old/p"
    set_sections(proxy, routes=[{"listen": f"{HOST}:{rport}", "upstream": httpbin.url + "/anything/new"}])
    sighup(proxy)
    until(lambda: landed() == httpbin.url + "/anything/new/p", 5, 0.1, "route upstream replaced by reload")


def test_monitor_removed_by_reload(sluice_factory, httpbin, tmp_path):
    log = AccessLog(tmp_path / "removed-access.log")
    proxy = sluice_factory({"monitors": [{"access_log": {"path": str(log.path)}}]})
    s = session_via(proxy.url)
    assert s.get(httpbin.url + "/get?before=1", timeout=10).status_code == 200
    log.wait_for(lambda e: "before=1" in e.get("url", ""))
    set_sections(proxy, monitors=None, policies=gen_policies("nomon"))
    sighup(proxy)
    wait_gen(proxy, httpbin, "nomon")  # the new config is live
    for i in range(3):
        assert s.get(httpbin.url + f"/get?after={i}", timeout=10).status_code == 200
    time.sleep(0.6)  # window: none of these requests may reach the removed access log
    late = [e["url"] for e in log.lines() if "after=" in e.get("url", "")]
    assert not late, f"requests after the monitor was removed were still logged: {late}"
