"""SSRF guard (docs/configuration.md, "Server", `access.deny`): the deny list is checked on
every resolved address of every upstream connection Sluice opens, before the socket exists —
forwarded requests, redirects Sluice follows, oauth2 token fetches, gateway routes, hosts with
an `upstream: { scheme: https }` override — and the default list holds the cloud metadata
addresses.

Loopback only: the "internal" target is a counting origin on 127.0.0.9, an address no other
test uses, and the tests deny 127.0.0.9/32. Each refusal is paired with a control (the same
request without the deny entry reaches the target), so a refusal cannot come from a broken
fixture. The deny check runs on the address libcurl resolved, so a host name that resolves
into a denied network is refused the same way as a literal (test_connect.py covers a name,
`localhost`, resolving into a denied 127.0.0.0/8).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from faultservers import pick_port
from policy_support import monitors
from rawhttp import RawConn, request_bytes
from resilience_support import fetch
from support import HOST, assert_sluice_error, port_open, wait_until

INTERNAL = "127.0.0.9"
DENY_INTERNAL = {"access": {"deny": ["169.254.0.0/16", f"{INTERNAL}/32"]}}


class InternalOrigin:
    """An HTTP origin on 127.0.0.9 that counts requests and answers every one with a token
    document (so it can stand in for a token endpoint too)."""

    def __init__(self):
        self.count = 0
        lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                with lock:
                    owner.count += 1
                body = json.dumps({"access_token": "internal-token", "expires_in": 3600}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.port = pick_port()
        self.server = ThreadingHTTPServer((INTERNAL, self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://{INTERNAL}:{self.port}"

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def internal():
    o = InternalOrigin()
    yield o
    o.stop()


def get(proxy, url: str):
    r, _ = fetch(proxy, "GET", url)
    assert r is not None, f"no response for {url}"
    return r


# ------------------------------------------------------------------------------------------
# Redirects Sluice follows
# ------------------------------------------------------------------------------------------

def redirect_via(httpbin, target: str) -> str:
    return f"{httpbin.url}/redirect-to?url={target}"


def test_followed_redirect_to_a_denied_address_is_refused(sluice_factory, httpbin, internal):
    follow = {"policies": {"default": {"redirect": {"follow": {"max": 5}}}}}
    control = sluice_factory(follow, name="control")
    r = get(control, redirect_via(httpbin, internal.url + "/x"))
    assert r.status == 200 and internal.count == 1, (r.status, internal.count)

    proxy = sluice_factory({**follow, **DENY_INTERNAL})
    r = get(proxy, redirect_via(httpbin, internal.url + "/x"))
    assert_sluice_error(r, 403, "denied")
    assert f"destination {INTERNAL} is denied by access.deny" in r.body.decode(), r.body
    assert internal.count == 1, "the denied redirect target received a request"


def test_followed_redirect_with_rewrite_to_a_denied_address_is_refused(sluice_factory, httpbin, internal):
    rewrite = {"modify": {"max": 3, "rewrite": [{"from": "http://rewrite.invalid", "to": internal.url}]}}
    proxy = sluice_factory({"policies": {"default": {"redirect": rewrite}}, **DENY_INTERNAL})
    r = get(proxy, redirect_via(httpbin, "http://rewrite.invalid/y"))
    assert_sluice_error(r, 403, "denied")
    assert internal.count == 0


# ------------------------------------------------------------------------------------------
# oauth2 token fetches
# ------------------------------------------------------------------------------------------

def oauth_policy(token_url: str) -> dict:
    return {"adapters": [{"oauth2": {"grant": "client_credentials", "token_url": token_url,
                                     "client_id": "sluice", "client_secret": "not-a-secret-here"}}]}


def test_token_fetch_to_a_denied_address_is_refused(sluice_factory, httpbin, internal, tmp_path):
    control = sluice_factory({"policies": {HOST: oauth_policy(internal.url + "/token")}}, name="control")
    r = get(control, httpbin.url + "/bearer")
    assert r.status == 200 and internal.count == 1, (r.status, r.body[:200], internal.count)

    log = tmp_path / "access-deny.log"
    proxy = sluice_factory({"policies": {HOST: oauth_policy(internal.url + "/token")},
                            "monitors": monitors(access=log), **DENY_INTERNAL})
    r = get(proxy, httpbin.url + "/bearer")
    # The client's request is not what was denied: its adapter failed (502, errors.md).
    assert_sluice_error(r, 502, "adapter oauth2 failed")
    assert f"token endpoint: destination {INTERNAL} is denied by access.deny" in r.body.decode(), r.body
    assert internal.count == 1, "the denied token endpoint received a request"


# ------------------------------------------------------------------------------------------
# Gateway routes and upstream overrides
# ------------------------------------------------------------------------------------------

def route_get(rport: int, target: str):
    with RawConn(HOST, rport, timeout=15) as c:
        c.send(request_bytes("GET", target, host=f"{HOST}:{rport}"))
        return c.read_response()


def test_route_to_a_denied_upstream_is_refused(sluice_factory, internal):
    rport = pick_port()
    sluice_factory({"routes": [{"listen": f"{HOST}:{rport}", "upstream": internal.url}]}, name="control")
    assert wait_until(lambda: port_open(rport), 5)
    r = route_get(rport, "/ok")
    assert r.status == 200 and internal.count == 1, (r.status, internal.count)

    rport = pick_port()
    sluice_factory({"routes": [{"listen": f"{HOST}:{rport}", "upstream": internal.url}], **DENY_INTERNAL})
    assert wait_until(lambda: port_open(rport), 5)
    r = route_get(rport, "/no")
    assert_sluice_error(r, 403, "denied")
    assert internal.count == 1


def test_https_upgrade_to_a_denied_address_is_refused(sluice_factory, internal):
    proxy = sluice_factory({"policies": {INTERNAL: {"upstream": {"scheme": "https"}}}, **DENY_INTERNAL})
    r = get(proxy, internal.url + "/upgraded")
    assert_sluice_error(r, 403, "denied")
    assert internal.count == 0


def test_connect_to_a_denied_address_is_refused(sluice_factory, internal):
    proxy = sluice_factory({"access": {**DENY_INTERNAL["access"], "connect_ports": [internal.port]}})
    r, _ = fetch(proxy, "CONNECT", f"{INTERNAL}:{internal.port}",
                 raw=f"CONNECT {INTERNAL}:{internal.port} HTTP/1.1\r\nHost: {INTERNAL}:{internal.port}\r\n\r\n".encode())
    assert_sluice_error(r, 403, "denied")
    assert internal.count == 0


# ------------------------------------------------------------------------------------------
# The default list
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("url", [
    "http://169.254.169.254/latest/meta-data/",     # AWS, GCP, Azure, OCI, ... (link-local)
    "http://169.254.170.2/v2/credentials",          # ECS task metadata
    "http://[fd00:ec2::254]/latest/meta-data/",     # AWS IMDS over IPv6
    "http://100.100.100.200/latest/meta-data/",     # Alibaba Cloud
    "http://192.0.0.192/latest/",                   # Oracle Cloud Classic
    "http://168.63.129.16/machine?comp=goalstate",  # Azure WireServer
    "http://[fe80::1]/",                            # IPv6 link-local
    "http://[::ffff:169.254.169.254]/",             # IPv4-mapped IPv6 of the metadata address
])
def test_default_deny_holds_the_metadata_addresses(proxy, url):
    # Refused before a socket exists: no packet leaves the machine.
    r = get(proxy, url)
    assert_sluice_error(r, 403, "denied")
