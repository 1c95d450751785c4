"""One cache across the fleet (`fleet.cache`, docs/fleet.md "One cache across the fleet",
docs/security.md "Peers"): a request signed as a peer's (`Sluice-Peer`, an HMAC-SHA256 of the
request line, the time, a nonce and the sender with the fleet's secret) is served as any other
and its field never reaches the origin; a forged, stale, replayed or looping one is refused
with 403 and nothing reaches the origin; bad settings are refused at `check`.

Not here yet: the peer hop itself (a miss on a non-owner asking the owner), membership from
Redis and `GET /fleet`'s members: docs/fleet.md says what is still to come."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time

import pytest

from faultservers import HOST, pick_port, simple_response
from policy_support import run_check, write_yaml
from support import assert_sluice_error, send_raw
from test_rate_limit import ArrivalOrigin

SECRET = "fleet-secret-" + secrets.token_hex(12)


def cacheable(req, n):
    return simple_response(200, f"body {req['target']}".encode(), [("Cache-Control", "max-age=300")])


@pytest.fixture
def origin():
    s = ArrivalOrigin(cacheable)
    yield s
    s.stop()


def peer_field(method: str, url: str, sender: str, t: int | None = None, nonce: str | None = None,
               secret: str = SECRET) -> str:
    t = int(time.time()) if t is None else t
    nonce = nonce or secrets.token_hex(8)
    message = f"{method} {url} HTTP/1.1\n{t}\n{nonce}\n{sender}".encode()
    sig = hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()
    return f"id={sender}, t={t}, n={nonce}, sig={sig}"


def owner(sluice_factory, peers: list[str] | None = None):
    """One instance whose static members are itself and `peers` (nothing listens there)."""
    port = pick_port()
    me = f"{HOST}:{port}"
    members = [{"address": me}] + [{"address": p} for p in (peers or [])]
    return sluice_factory({
        "listen": [me],
        "cache_store": {"memory": "16MiB", "max_object_size": "1MiB"},
        "fleet": {"cache": {"advertise": me, "secret": SECRET, "peers": members}},
    }, name="owner")


def get(proxy, url: str, field: str | None):
    head = f"GET {url} HTTP/1.1\r\nHost: {url.split('/')[2]}\r\n"
    if field is not None:
        head += f"Sluice-Peer: {field}\r\n"
    r, c = send_raw(proxy.port, (head + "\r\n").encode())
    c.close()
    return r


def test_a_signed_peer_request_is_served_and_its_field_stays_here(sluice_factory, origin):
    proxy = owner(sluice_factory, [f"{HOST}:{pick_port()}"])
    url = f"http://{HOST}:{origin.port}/signed"
    r = get(proxy, url, peer_field("GET", url, sender="127.0.0.9:3128"))
    assert r and r.status == 200 and r.body == b"body /signed", r
    again = get(proxy, url, peer_field("GET", url, sender="127.0.0.9:3128"))
    assert again and again.status == 200 and "hit" in again.header("cache-status"), again
    reqs = origin.requests()
    assert len(reqs) == 1, reqs
    assert b"sluice-peer" not in reqs[0]["raw_head"].lower(), reqs[0]["raw_head"]


@pytest.mark.parametrize("case", ["forged", "wrong_secret", "stale", "future", "loop", "two_fields", "garbled"])
def test_a_bad_peer_request_is_refused_and_nothing_is_forwarded(sluice_factory, origin, case):
    proxy = owner(sluice_factory)
    url = f"http://{HOST}:{origin.port}/bad-{case}"
    me = f"{HOST}:{proxy.port}"
    good = peer_field("GET", url, sender="127.0.0.9:3128")
    field = {
        "forged": peer_field("GET", url + "?other", sender="127.0.0.9:3128").replace("?other", ""),
        "wrong_secret": peer_field("GET", url, sender="127.0.0.9:3128", secret="another-secret-0123456789"),
        "stale": peer_field("GET", url, sender="127.0.0.9:3128", t=int(time.time()) - 120),
        "future": peer_field("GET", url, sender="127.0.0.9:3128", t=int(time.time()) + 120),
        "loop": peer_field("GET", url, sender=me),
        "two_fields": good + "\r\nSluice-Peer: " + good,
        "garbled": "id=127.0.0.9:3128, t=now, sig=00",
    }[case]
    r = get(proxy, url, field)
    assert_sluice_error(r, 403, "peer request refused")
    assert origin.requests() == []


def test_a_replayed_peer_request_is_refused(sluice_factory, origin):
    proxy = owner(sluice_factory)
    url = f"http://{HOST}:{origin.port}/replay"
    field = peer_field("GET", url, sender="127.0.0.9:3128")
    first = get(proxy, url, field)
    assert first and first.status == 200, first
    r = get(proxy, url, field)
    assert_sluice_error(r, 403, "replay")
    assert len(origin.requests()) == 1


def test_an_unsigned_request_is_an_ordinary_client(sluice_factory, origin):
    """On the main listener a request without `Sluice-Peer` is a client's, served as always."""
    proxy = owner(sluice_factory)
    url = f"http://{HOST}:{origin.port}/plain"
    r = get(proxy, url, None)
    assert r and r.status == 200 and r.body == b"body /plain", r


@pytest.mark.parametrize("cache, phrase", [
    ({"advertise": "127.0.0.1:3128", "secret": SECRET}, "fleet.cache needs peers"),
    ({"advertise": "localhost:3128", "secret": SECRET, "peers": [{"address": "127.0.0.1:3128"}]},
     "fleet.cache.advertise must be an IP:port"),
    ({"advertise": "127.0.0.1:3128", "secret": "short", "peers": [{"address": "127.0.0.1:3128"}]},
     "at least 16 bytes"),
    ({"advertise": "127.0.0.1:3128", "secret": SECRET, "weight": 0, "peers": [{"address": "127.0.0.1:3128"}]},
     "fleet.cache.weight must be a number above 0"),
])
def test_check_refuses_bad_fleet_cache_settings(tmp_path, cache, phrase):
    path = write_yaml(tmp_path / "fleet-cache.yaml", {"fleet": {"cache": cache}})
    r = run_check(path)
    assert r.returncode != 0 and phrase in (r.stdout + r.stderr), r.stdout + r.stderr
    assert SECRET not in r.stdout + r.stderr
