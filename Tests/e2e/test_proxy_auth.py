"""Proxy authentication (docs/configuration.md, "Proxy authentication"):
`access.proxy_auth: { basic: { users_file: PATH } }` with bcrypt (python `bcrypt`) and
SHA-256 crypt (`openssl passwd -5`) users; 407 with `Proxy-Authenticate` for missing or
wrong credentials (nothing reaches the origin), absolute-form and CONNECT, with real curl and
python requests; `Proxy-Authorization` never reaches the origin; the user in the access log;
SIGHUP re-reads the users file (a broken one keeps the old users); the hashing budget under
a flood of wrong passwords; the users file's located errors and the non-loopback rule
through `sluice check`.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import bcrypt
import pytest

from faultservers import RecordingServer, pick_port
from policy_support import AccessLog, monitors, run_check, sighup, stderr_len, stderr_since, until, write_yaml
from rawhttp import RawConn, request_bytes
from support import HOST, assert_sluice_error, run_curl, session_via

REALM = 'Basic realm="sluice"'


def bcrypt_hash(password: str, rounds: int = 4, prefix: str = "$2b$") -> str:
    h = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds)).decode()
    return prefix + h[4:]


def sha256_crypt(password: str) -> str:
    return subprocess.run(["openssl", "passwd", "-5", password], capture_output=True, text=True,
                          check=True).stdout.strip()


class Users:
    def __init__(self, path: Path):
        self.path = path
        self.passwords = {"alice": "alice-PW-1", "bob": "bob-PW-2", "yves": "yves-PW-3"}
        self.write({"alice": bcrypt_hash(self.passwords["alice"]),
                    "bob": sha256_crypt(self.passwords["bob"]),
                    "yves": bcrypt_hash(self.passwords["yves"], prefix="$2y$")})

    def write(self, hashes: dict[str, str], extra: str = "") -> None:
        self.path.write_text("# sluice users\n" + "".join(f"{u}:{h}\n" for u, h in hashes.items()) + extra)


@pytest.fixture
def users(tmp_path) -> Users:
    return Users(tmp_path / "users")


@pytest.fixture
def origin():
    s = RecordingServer()
    yield s
    s.stop()


@pytest.fixture
def authed(sluice_factory, users, tmp_path):
    log = tmp_path / "access.log"
    p = sluice_factory({"access": {"proxy_auth": {"basic": {"users_file": str(users.path)}}},
                        "monitors": monitors(access=log)})
    p.log = AccessLog(log)
    return p


def proxy_url(p, user: str | None = None, password: str | None = None) -> str:
    return f"http://{user}:{password}@{HOST}:{p.port}" if user else f"http://{HOST}:{p.port}"


def raw(p, data: bytes):
    with RawConn(HOST, p.port, timeout=10) as c:
        c.send(data)
        return c.read_response(method="CONNECT" if data.startswith(b"CONNECT") else "GET")


def basic(user: str, password: str) -> str:
    import base64
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def header(r, name: str) -> str | None:
    for k, v in r.headers:
        if k.lower() == name.lower():
            return v
    return None


# ------------------------------------------------------------------------------------------
# 407, and nothing reaches the origin
# ------------------------------------------------------------------------------------------

def test_missing_credentials_get_407_and_nothing_is_forwarded(authed, origin):
    r = session_via(proxy_url(authed)).get(origin.url + "/a", timeout=10)
    assert r.status_code == 407, (r.status_code, r.text)
    assert r.headers.get("Proxy-Authenticate") == REALM, r.headers
    assert r.text.startswith("sluice: proxy authentication required"), r.text
    c = run_curl(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-x", proxy_url(authed), origin.url + "/b"])
    assert c.stdout.decode().strip() == "407", (c.stdout, c.stderr)
    assert origin.connection_count() == 0, "an unauthenticated request reached the origin"


@pytest.mark.parametrize("user,password", [("alice", "wrong"), ("bob", "alice-PW-1"), ("nobody", "x"), ("alice", "")])
def test_wrong_credentials_get_407(authed, origin, user, password):
    r = session_via(proxy_url(authed, user, password)).get(origin.url + "/w", timeout=10)
    assert r.status_code == 407 and r.headers.get("Proxy-Authenticate") == REALM, (r.status_code, r.headers)
    assert "invalid user name or password" in r.text, r.text
    assert origin.connection_count() == 0


def test_other_schemes_get_407(authed, origin):
    r = raw(authed, request_bytes("GET", origin.url + "/s", {"Proxy-Authorization": "Bearer abc"}))
    assert_sluice_error(r, 407, "proxy authentication required")
    assert origin.connection_count() == 0


# ------------------------------------------------------------------------------------------
# The right users
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("user", ["alice", "bob", "yves"])  # $2b$, $5$, $2y$
def test_right_credentials_pass_and_proxy_authorization_is_not_forwarded(authed, origin, users, user):
    r = session_via(proxy_url(authed, user, users.passwords[user])).get(origin.url + f"/ok-{user}", timeout=10)
    assert r.status_code == 200, (r.status_code, r.text)
    reqs = origin.requests()
    assert len(reqs) == 1
    names = [k.lower() for k, _ in reqs[0]["headers"]]
    assert "proxy-authorization" not in names, reqs[0]["raw_head"]
    assert users.passwords[user].encode() not in origin.received()
    e = authed.log.wait_for(lambda e: e.get("url", "").endswith(f"/ok-{user}"))[0]
    assert e["user"] == user and e["status"] == 200, e


def test_proxy_authorization_is_not_forwarded_on_the_adapter_path(sluice_factory, users, origin):
    # An oauth2/headers policy builds a request model (ForwardedHeaders.forwardedFields):
    # the field is dropped there too, even when an adapter tries to set it.
    p = sluice_factory({"access": {"proxy_auth": {"basic": {"users_file": str(users.path)}}},
                        "policies": {"default": {"adapters": [
                            {"headers": {"set": {"X-Adapted": "1", "Proxy-Authorization": "Basic Zm9vOmJhcg=="}}},
                            {"api_key": {"query": "k", "value": "v"}}]}}})
    r = session_via(proxy_url(p, "alice", users.passwords["alice"])).get(origin.url + "/adapted", timeout=10)
    assert r.status_code == 200, (r.status_code, r.text)
    req = origin.requests()[0]
    names = [k.lower() for k, _ in req["headers"]]
    assert "x-adapted" in names and "proxy-authorization" not in names, req["raw_head"]


def test_curl_with_proxy_user(authed, origin, users):
    c = run_curl(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-x", proxy_url(authed),
                  "--proxy-user", f"bob:{users.passwords['bob']}", origin.url + "/curl"])
    assert c.stdout.decode().strip() == "200", (c.stdout, c.stderr)


def test_access_log_names_no_user_on_407(authed, origin, users):
    session_via(proxy_url(authed, "alice", "wrong")).get(origin.url + "/denied-log", timeout=10)
    e = authed.log.wait_for(lambda e: e.get("url", "").endswith("/denied-log"))[0]
    assert e["status"] == 407 and e["user"] is None, e
    text = authed.log.text()
    assert "wrong" not in text and basic("alice", "wrong").split()[1] not in text


def test_keep_alive_connection_and_changed_credentials(authed, origin, users):
    good = basic("alice", users.passwords["alice"])
    with RawConn(HOST, authed.port, timeout=10) as c:
        for i in range(3):
            c.send(request_bytes("GET", origin.url + f"/ka{i}", {"Proxy-Authorization": good}))
            assert c.read_response().status == 200
        # The same connection presenting other credentials is checked again.
        c.send(request_bytes("GET", origin.url + "/ka-bad", {"Proxy-Authorization": basic("alice", "nope")}))
        assert c.read_response().status == 407
        c.send(request_bytes("GET", origin.url + "/ka-none"))
        assert c.read_response().status == 407
    assert len(origin.requests()) == 3


# ------------------------------------------------------------------------------------------
# CONNECT
# ------------------------------------------------------------------------------------------

def test_connect_needs_credentials(sluice_factory, users, nginx, pki):
    p = sluice_factory({"access": {"proxy_auth": {"basic": {"users_file": str(users.path)}}}})
    target = f"{HOST}:{nginx.https_port}"
    r = raw(p, f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    assert_sluice_error(r, 407, "proxy authentication required")
    assert header(r, "Proxy-Authenticate") == REALM
    r = raw(p, f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: {basic('alice', 'x')}\r\n\r\n".encode())
    assert r.status == 407
    c = run_curl(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-p", "-x", proxy_url(p), "--cacert", str(pki.ca_pem),
                  f"https://{target}/1k.bin"])
    assert c.stdout.decode().strip() in ("000", "407"), (c.stdout, c.stderr)  # curl: CONNECT tunnel failed, 407
    c = run_curl(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-p", "-x", proxy_url(p, "alice", users.passwords["alice"]),
                  "--cacert", str(pki.ca_pem), f"https://{target}/"])
    assert c.returncode == 0 and c.stdout.decode().strip() != "000", (c.returncode, c.stdout, c.stderr)
    s = session_via(proxy_url(p, "bob", users.passwords["bob"]))
    s.verify = str(pki.ca_pem)
    assert s.get(f"https://{target}/", timeout=10).status_code < 500


# ------------------------------------------------------------------------------------------
# Routes are not proxy requests
# ------------------------------------------------------------------------------------------

def test_routes_do_not_ask_for_proxy_credentials(sluice_factory, users, origin):
    rport = pick_port()
    sluice_factory({"access": {"proxy_auth": {"basic": {"users_file": str(users.path)}}},
                    "routes": [{"listen": f"{HOST}:{rport}", "upstream": origin.url}]})
    until(lambda: _open(rport), what="route listener")
    with RawConn(HOST, rport, timeout=10) as c:
        c.send(request_bytes("GET", "/route", host=f"{HOST}:{rport}"))
        assert c.read_response().status == 200


def _open(port: int) -> bool:
    from support import port_open
    return port_open(port)


# ------------------------------------------------------------------------------------------
# Reload
# ------------------------------------------------------------------------------------------

def test_sighup_rereads_the_users_file_and_a_broken_one_keeps_the_old(authed, origin, users):
    old = session_via(proxy_url(authed, "alice", users.passwords["alice"]))
    assert old.get(origin.url + "/r1", timeout=10).status_code == 200
    users.write({"carol": bcrypt_hash("carol-PW")})
    sighup(authed)
    new = session_via(proxy_url(authed, "carol", "carol-PW"))
    until(lambda: new.get(origin.url + "/r2", timeout=10).status_code == 200, what="carol accepted after SIGHUP")
    # alice is gone, even though her credentials were cached before the reload.
    assert session_via(proxy_url(authed, "alice", users.passwords["alice"])).get(origin.url + "/r3", timeout=10).status_code == 407
    offset = stderr_len(authed)
    users.write({"dave": bcrypt_hash("dave-PW")}, extra="eve:$apr1$abcdefgh$82JubPF2dQkt1tVfvLnXS.\n")
    sighup(authed)
    until(lambda: "reload failed" in stderr_since(authed, offset), what="reload refused")
    err = stderr_since(authed, offset)
    assert re.search(re.escape(str(users.path)) + r":3:5: error: .*MD5", err), err
    assert new.get(origin.url + "/r4", timeout=10).status_code == 200, "a failed reload must keep the old users"
    assert session_via(proxy_url(authed, "dave", "dave-PW")).get(origin.url + "/r5", timeout=10).status_code == 407


# ------------------------------------------------------------------------------------------
# A flood of wrong passwords
# ------------------------------------------------------------------------------------------

def test_wrong_password_flood_is_bounded(sluice_factory, users, origin):
    # Cost 12: ~0.2-0.4 s of CPU per check here. Without the budget, 40 distinct wrong
    # passwords would hold the one worker's loop for 10 s or more.
    users.write({"alice": bcrypt_hash(users.passwords["alice"], rounds=12)})
    p = sluice_factory({"workers": 1, "access": {"proxy_auth": {"basic": {"users_file": str(users.path)}}}})
    good = basic("alice", users.passwords["alice"])
    assert raw(p, request_bytes("GET", origin.url + "/warm", {"Proxy-Authorization": good})).status == 200
    started = time.monotonic()
    busy = 0
    for i in range(40):
        r = raw(p, request_bytes("GET", origin.url + f"/flood{i}", {"Proxy-Authorization": basic("alice", f"guess{i}")}))
        assert r.status == 407
        busy += b"try again" in r.body
    took = time.monotonic() - started
    assert busy >= 30 and took < 6, (busy, took)
    t0 = time.monotonic()
    assert raw(p, request_bytes("GET", origin.url + "/after", {"Proxy-Authorization": good})).status == 200
    assert time.monotonic() - t0 < 1.0, "a verified user was slowed by the flood"
    assert len(origin.requests()) == 2


# ------------------------------------------------------------------------------------------
# Configuration errors (sluice check)
# ------------------------------------------------------------------------------------------

def check_text(tmp_path: Path, text: str) -> subprocess.CompletedProcess:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return run_check(path)


def located(r: subprocess.CompletedProcess, path: str, line: int, col: int, phrase: str) -> None:
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    m = re.search(re.escape(path) + r":(\d+):(\d+): error: (.*)", r.stderr)
    assert m and (int(m.group(1)), int(m.group(2))) == (line, col), r.stderr
    assert phrase in m.group(3), m.group(3)


def test_non_loopback_listener_needs_proxy_auth_or_narrow_allow_clients(tmp_path, users):
    everyone = 'access:\n  allow_clients: [0.0.0.0/0, "::/0"]\n'
    r = check_text(tmp_path, "workers: 1\nlisten: [127.0.0.1:3128, 0.0.0.0:3129]\n" + everyone)
    located(r, str(tmp_path / "c.yaml"), 2, 26, "add access.proxy_auth")
    # The default allow_clients (loopback) is narrow: such a listener only serves this host.
    assert check_text(tmp_path, "listen: [0.0.0.0:3128]\n").returncode == 0
    r = check_text(tmp_path, 'listen: ["[::]:3128"]\naccess:\n  allow_clients: [10.0.0.0/8, "::/0"]\n')
    located(r, str(tmp_path / "c.yaml"), 1, 10, "narrow access.allow_clients")
    assert check_text(tmp_path, "listen: [0.0.0.0:3128]\naccess:\n  allow_clients: [10.0.0.0/8]\n").returncode == 0
    assert check_text(tmp_path, f"listen: [0.0.0.0:3128]\naccess:\n  proxy_auth: {{ basic: {{ users_file: {users.path} }} }}\n"
                      ).returncode == 0
    assert check_text(tmp_path, "listen: [127.0.0.1:3128]\naccess:\n  allow_clients: [0.0.0.0/0]\n").returncode == 0
    # Routes: proxy_auth does not guard them.
    r = check_text(tmp_path, f"access:\n  allow_clients: [0.0.0.0/0]\n  proxy_auth: {{ basic: {{ users_file: {users.path} }} }}\n"
                   "routes:\n  - listen: 0.0.0.0:8080\n    upstream: http://127.0.0.1:9000\n")
    located(r, str(tmp_path / "c.yaml"), 5, 13, "proxy_auth does not apply to routes")


def test_users_file_errors_are_located(tmp_path, users):
    users.write({"alice": bcrypt_hash("x")}, extra="bob:$apr1$abcdefgh$82JubPF2dQkt1tVfvLnXS.\ncarol:plain\n")
    r = check_text(tmp_path, f"access:\n  proxy_auth:\n    basic:\n      users_file: {users.path}\n")
    located(r, str(users.path), 3, 5, "MD5")
    assert f"{users.path}:4:7: error: user carol: not a hash" in r.stderr, r.stderr
    r = check_text(tmp_path, f"access:\n  proxy_auth:\n    basic:\n      users_file: {tmp_path}/missing\n")
    located(r, str(tmp_path / "c.yaml"), 4, 19, "cannot read")
    r = check_text(tmp_path, "access:\n  proxy_auth: { basic: {} }\n")
    located(r, str(tmp_path / "c.yaml"), 2, 15, "users_file")


def test_running_with_a_broken_users_file_fails_at_start(tmp_path, users, sluice_bin):
    users.write({}, extra="alice:$1$ab$e2KlfqG5YBMTjSz7XF.Eu1\n")
    cfg = write_yaml(tmp_path / "run.yaml", {"listen": [f"{HOST}:{pick_port()}"],
                                             "access": {"proxy_auth": {"basic": {"users_file": str(users.path)}}}})
    r = subprocess.run([sluice_bin, "run", "--config", str(cfg)], capture_output=True, text=True, timeout=20,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 1 and f"{users.path}:2:7: error: " in r.stderr, (r.returncode, r.stderr)
