"""Parent proxy (`upstream_proxy` in a policy; docs/configuration.md, "Parent proxy"): Sluice
behind another proxy — a second Sluice, Squid, and a purpose-built parent that demands
credentials. Plain HTTP goes to the parent in absolute form, https and CONNECT tunnels go
through a CONNECT to it; `no_proxy` and `upstream_proxy: none` reach origins directly; the
parent is never taken from Sluice's own environment."""

import base64
import json
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from faultservers import pick_port
from policy_support import AccessLog, monitors
from support import HOST, assert_sluice_error, clean_env, port_open, run_curl, session_via, wait_until


def via_hops(headers: dict) -> list[str]:
    return [h.strip() for h in headers.get("Via", "").split(",") if h.strip()]


def chain(sluice_factory, tmp_path, child_policy: dict | None = None, parent_extra: dict | None = None):
    """A parent Sluice (with an access log) and a child Sluice whose default policy sends
    everything through it. Returns (child, parent, parent_log)."""
    parent_log = tmp_path / "parent-access.log"
    parent = sluice_factory({"monitors": monitors(access=parent_log), **(parent_extra or {})}, name="parent")
    policy = {"upstream_proxy": {"url": parent.url}}
    policy.update(child_policy or {})
    child = sluice_factory({"policies": {"default": policy}}, name="child")
    return child, parent, AccessLog(parent_log)


def test_plain_http_goes_through_a_parent_sluice(sluice_factory, tmp_path, httpbin):
    child, parent, parent_log = chain(sluice_factory, tmp_path)
    r = session_via(child.url).get(f"{httpbin.url}/headers?show_env=1", timeout=15)
    assert r.status_code == 200, r.text
    hops = via_hops(r.json()["headers"])
    assert len(hops) == 2 and all("sluice-" in h for h in hops), hops
    entries = parent_log.wait_for(lambda e: "/headers" in e.get("url", ""))
    assert entries[0]["method"] == "GET" and entries[0]["status"] == 200, entries


def test_connect_tunnel_through_a_parent_sluice(sluice_factory, tmp_path, nginx, pki):
    child, parent, parent_log = chain(sluice_factory, tmp_path)
    url = f"https://{HOST}:{nginx.https_port}/1k"
    # A CONNECT tunnel from the client, through the child, through the parent.
    out = run_curl(["-x", child.url, "--cacert", str(pki.ca_pem), "-o", "-", url])
    assert out.returncode == 0, out.stderr
    assert out.stdout == nginx.file_1k
    connects = parent_log.wait_for(lambda e: e.get("method") == "CONNECT")
    assert connects[0]["url"].endswith(f"{HOST}:{nginx.https_port}") or \
        f"{HOST}:{nginx.https_port}" in json.dumps(connects[0]), connects


def test_https_upgrade_through_a_parent_tunnels(sluice_factory, tmp_path, nginx):
    # upstream: { scheme: https } makes the child speak TLS to the origin: through the
    # parent, that is a CONNECT (the parent never sees the request inside).
    child, parent, parent_log = chain(
        sluice_factory, tmp_path,
        child_policy={"upstream": {"scheme": "https", "port": nginx.https_port}})
    r = session_via(child.url).get(f"http://{HOST}:{nginx.http_port}/1k", timeout=15)
    assert r.status_code == 200 and r.content == nginx.file_1k
    # The parent logs a tunnel when it closes: the child's pooled connection closes when
    # the child stops.
    child.expected_exit = True
    assert child.stop() == 0
    connects = parent_log.wait_for(lambda e: e.get("method") == "CONNECT")
    assert f"{nginx.https_port}" in json.dumps(connects[0]), connects


def test_no_proxy_and_none_reach_origins_directly(sluice_factory, tmp_path, httpbin):
    parent_log = tmp_path / "parent-access.log"
    parent = sluice_factory({"monitors": monitors(access=parent_log)}, name="parent")
    child = sluice_factory({"policies": {
        "default": {"upstream_proxy": {"url": parent.url, "no_proxy": [f"{HOST}"]}},
        "direct.localhost": {"upstream_proxy": "none"},
    }}, name="child")
    s = session_via(child.url)
    r = s.get(f"{httpbin.url}/headers?show_env=1&direct", timeout=15)
    assert r.status_code == 200 and len(via_hops(r.json()["headers"])) == 1, r.text
    r = s.get(f"http://localhost:{httpbin.port}/headers?show_env=1&via-parent", timeout=15)
    assert r.status_code == 200 and len(via_hops(r.json()["headers"])) == 2, r.text
    log = AccessLog(parent_log)
    log.wait_for(lambda e: "via-parent" in e.get("url", ""))
    assert not [e for e in log.lines() if "&direct" in e.get("url", "")], "no_proxy host went through the parent"


class AuthParent:
    """A parent proxy that demands Basic credentials: 407 without the right
    Proxy-Authorization, else it answers the absolute-form request itself with what it saw."""

    def __init__(self, user: str, password: str):
        self.expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((HOST, 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.seen: list[dict] = []
        self.stopped = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        self.sock.settimeout(0.2)
        while not self.stopped:
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._one, args=(c,), daemon=True).start()

    def _one(self, c: socket.socket):
        c.settimeout(10)
        with c:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = c.recv(65536)
                if not chunk:
                    return
                data += chunk
            head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
            fields = {}
            for line in head[1:]:
                name, _, value = line.partition(":")
                fields[name.strip().lower()] = value.strip()
            self.seen.append({"line": head[0], "fields": fields})
            if fields.get("proxy-authorization") != self.expected:
                c.sendall(b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"p\"\r\n"
                          b"Content-Length: 0\r\nConnection: close\r\n\r\n")
                return
            body = json.dumps({"line": head[0]}).encode()
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                      + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)

    def close(self):
        self.stopped = True
        self.sock.close()


@pytest.fixture
def auth_parent():
    p = AuthParent("svc", "s3cret")
    yield p
    p.close()


def test_parent_credentials_are_sent_and_a_407_is_sluices_failure(sluice_factory, tmp_path, auth_parent):
    parent_url = f"http://{HOST}:{auth_parent.port}"
    access = tmp_path / "access.log"
    child = sluice_factory({"monitors": monitors(access=access), "policies": {
        "default": {"upstream_proxy": {"url": parent_url, "auth": {"username": "svc", "password": "s3cret"}}},
        "noauth.example": {"upstream_proxy": {"url": parent_url}},
    }}, name="child")
    s = session_via(child.url)
    # The client's own Proxy-Authorization is for Sluice and never reaches the parent.
    r = s.get("http://origin.example/thing?x=1", headers={"Proxy-Authorization": "Basic Y2xpZW50OnNlY3JldA=="},
              timeout=15)
    assert r.status_code == 200, r.text
    assert r.json()["line"] == "GET http://origin.example/thing?x=1 HTTP/1.1", r.text
    assert auth_parent.seen[-1]["fields"]["proxy-authorization"] == auth_parent.expected
    r = s.get("http://noauth.example/", timeout=15)
    assert_sluice_error_response(r, 502, "parent proxy")
    assert "407" in r.text
    log = access.read_text()
    assert "s3cret" not in log and "c2Vj" not in log, "parent credentials must never be logged"


def assert_sluice_error_response(r, status: int, phrase: str):
    assert r.status_code == status, (r.status_code, r.text)
    assert r.text.startswith("sluice: ") and phrase in r.text, r.text


def test_unreachable_parent_is_a_502_naming_it(sluice_factory):
    dead = pick_port()
    child = sluice_factory({"policies": {"default": {"upstream_proxy": {"url": f"http://{HOST}:{dead}"}}}})
    r = session_via(child.url).get("http://origin.example/", timeout=15)
    assert_sluice_error_response(r, 502, f"parent proxy http://{HOST}:{dead} failed: connection refused")


def test_environment_proxy_variables_are_never_a_parent(sluice_factory, tmp_path, httpbin, auth_parent):
    # Every proxy variable points at a parent that would answer 407: Sluice ignores them.
    bogus = f"http://{HOST}:{auth_parent.port}"
    env = {k: bogus for k in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")}
    child = sluice_factory({}, env=env)
    r = session_via(child.url).get(f"{httpbin.url}/get", timeout=15)
    assert r.status_code == 200, r.text
    assert not auth_parent.seen, "Sluice took its parent from the environment"


SQUID_CONF = """\
http_port {host}:{port}
pid_filename {dir}/squid.pid
cache_log {dir}/cache.log
access_log stdio:{dir}/access.log
cache deny all
cache_mem 8 MB
coredump_dir {dir}
acl localnet src 127.0.0.0/8
acl SSL_ports port {tls_port}
acl CONNECT method CONNECT
http_access deny CONNECT !SSL_ports
http_access allow localnet
http_access deny all
shutdown_lifetime 1 seconds
"""


@pytest.fixture
def squid():
    if shutil.which("squid") is None:
        pytest.fail("squid is not installed (scripts/install-deps.sh test installs it)", pytrace=False)


def start_squid(d: Path, tls_port: int):
    port = pick_port()
    d.chmod(0o777)
    (d / "squid.conf").write_text(SQUID_CONF.format(host=HOST, port=port, dir=d, tls_port=tls_port))
    proc = subprocess.Popen(["squid", "-N", "-f", str(d / "squid.conf")], stdout=subprocess.DEVNULL,
                            stderr=open(d / "squid.stderr", "wb"), env=clean_env())
    if not wait_until(lambda: port_open(port), 20):
        proc.kill()
        raise AssertionError(f"squid did not start: {(d / 'squid.stderr').read_text()} "
                             f"{(d / 'cache.log').read_text() if (d / 'cache.log').exists() else ''}")
    return proc, port


def test_chained_through_squid(sluice_factory, squid, httpbin, nginx, pki):
    # Squid started as root drops to its own user: its files live outside pytest's
    # owner-only temporary tree.
    sq_dir = Path(tempfile.mkdtemp(prefix="sluice-squid-"))
    proc, port = start_squid(sq_dir, nginx.https_port)
    try:
        child = sluice_factory({"policies": {"default": {"upstream_proxy": {"url": f"http://{HOST}:{port}"}}}})
        r = session_via(child.url).get(f"{httpbin.url}/get?show_env=1&through=squid", timeout=20)
        assert r.status_code == 200 and r.json()["args"]["through"] == "squid", r.text
        hops = via_hops(r.json()["headers"])
        assert len(hops) == 2 and "sluice-" in hops[0] and "squid" in hops[1].lower(), hops
        out = run_curl(["-x", child.url, "--cacert", str(pki.ca_pem), "-o", "-",
                        f"https://{HOST}:{nginx.https_port}/1k"])
        assert out.returncode == 0 and out.stdout == nginx.file_1k, out.stderr
        assert wait_until(lambda: "CONNECT" in (sq_dir / "access.log").read_text(), 10), \
            (sq_dir / "access.log").read_text()
        # Squid logs URLs without their query (strip_query_terms).
        assert f"GET http://{HOST}:{httpbin.port}/get" in (sq_dir / "access.log").read_text()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(sq_dir, ignore_errors=True)
