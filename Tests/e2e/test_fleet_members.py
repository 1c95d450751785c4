"""The shared cache's members (`fleet.cache`, docs/fleet.md "One cache across the fleet", "When
the members change", "The peer listener"): with a real `redis-server`, each instance's
heartbeat publishes its `advertise` address and weight and learns the others'; `GET /fleet`
on each shows the same members with shares by weight; a SIGKILLed instance leaves within
three heartbeats and comes back when restarted; Redis away leaves each instance alone with
its own cache (nothing lost); a reload applies a new weight; the peer listener takes signed
requests only; and the peer hop works over the members Redis told of as over a static list."""

from __future__ import annotations

import random
import shutil
import signal
import time
from collections import Counter

import pytest
import requests
import yaml

from faultservers import HOST, pick_port
from policy_support import run_check, write_yaml
from support import assert_sluice_error, port_open, send_raw, session_via, wait_until
from test_admin import schema_for, validate
from test_fleet import Redis, redis  # noqa: F401 (redis: a fixture)
from test_fleet_cache import SECRET, get, origin, peer_field  # noqa: F401 (origin: a fixture)
from test_fleet_hop import ranked

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")

HEARTBEAT_MS = 200


class Member:
    """One instance of the fleet with its admin listener, on a port it keeps across restarts."""

    def __init__(self, sluice_factory, redis: Redis, weight: float = 1, name: str = "member",
                 on_redis_down: str | None = None, policies: dict | None = None):
        self.factory = sluice_factory
        self.port = pick_port()
        self.address = f"{HOST}:{self.port}"
        self.config = {
            "listen": [self.address],
            "workers": 2,
            "admin": {"listen": f"{HOST}:{pick_port()}"},
            "cache_store": {"memory": "16MiB", "max_object_size": "1MiB"},
            "fleet": {"redis": f"127.0.0.1:{redis.port}", "timeout": "50ms", "heartbeat": f"{HEARTBEAT_MS}ms",
                      "cache": {"advertise": self.address, "secret": SECRET, "weight": weight}},
        }
        if on_redis_down:
            self.config["fleet"]["on_redis_down"] = on_redis_down
        if policies:
            self.config["policies"] = policies
        self.name = name
        self.proxy = None
        self.start()

    def start(self) -> None:
        self.proxy = self.factory(self.config, name=self.name)

    @property
    def admin(self) -> str:
        return "http://" + self.config["admin"]["listen"]

    def fleet(self) -> dict:
        r = requests.get(self.admin + "/fleet", timeout=5)
        assert r.status_code == 200, r.text
        data = r.json()
        validate(schema_for("/fleet", "GET", 200), data)
        return data

    def members(self) -> list[tuple[str, float]]:
        return [(m["address"], m["weight"]) for m in self.fleet()["cache"]["members"]]

    def kill(self) -> None:
        self.proxy.expected_exit = True
        self.proxy.signal(signal.SIGKILL)
        self.proxy.wait(5)


def fleet_of(sluice_factory, redis, weights: list[float], **settings) -> list[Member]:
    return [Member(sluice_factory, redis, w, name=f"member{i}", **settings) for i, w in enumerate(weights)]


def expect_members(fleet: list[Member], members: list[Member], timeout: float = 5) -> None:
    want = sorted((m.address, float(m.config["fleet"]["cache"]["weight"])) for m in members)
    for m in fleet:
        assert wait_until(lambda: m.members() == want, timeout), (m.address, m.fleet(), want)


def test_three_members_share_the_keys_by_weight(sluice_factory, redis):
    """Weights 1, 2, 1: every instance lists the same three members, the shares sum to 1 and the
    weight-2 member owns half; the gauge and the dashboard say the same."""
    fleet = fleet_of(sluice_factory, redis, [1, 2, 1])
    expect_members(fleet, fleet)
    for m in fleet:
        cache = m.fleet()["cache"]
        assert cache["source"] == "redis" and cache["state"] == "heartbeat", cache
        assert cache["advertise"] == m.address and cache["peer_requests"] == {}, cache
        assert abs(sum(x["share"] for x in cache["members"]) - 1) < 1e-9, cache
        shares = {x["address"]: x["share"] for x in cache["members"]}
        assert shares[fleet[1].address] == 0.5 and shares[fleet[0].address] == 0.25, shares
        assert cache["share"] == shares[m.address], cache
        assert [x["address"] for x in cache["members"] if x["self"]] == [m.address], cache
        assert all(x["alive_since_ms"] <= x["last_seen_ms"] for x in cache["members"]), cache
    metrics = requests.get(fleet[0].admin + "/metrics", timeout=5).text
    assert "sluice_fleet_cache_members 3" in metrics, metrics
    dashboard = requests.get(fleet[1].admin + "/dashboard/data", timeout=5).json()
    validate(schema_for("/dashboard/data", "GET", 200), dashboard)
    assert dashboard["fleet_cache"] == {"members": 3, "share": 0.5, "state": "heartbeat"}, dashboard
    assert "fleet.cache: 3 member(s)" in fleet[0].proxy.stderr(), fleet[0].proxy.stderr()


def test_a_killed_member_leaves_and_comes_back_on_its_address(sluice_factory, redis):
    """SIGKILL one of three: within three heartbeats (and one more to hear it) the other two list
    two members; restarted on the same address, it is the third again everywhere."""
    fleet = fleet_of(sluice_factory, redis, [1, 1, 1])
    expect_members(fleet, fleet)
    gone = fleet[2]
    gone.kill()
    started = time.monotonic()
    expect_members(fleet[:2], fleet[:2], timeout=5 * HEARTBEAT_MS / 1000 + 2)
    print(f"left after {time.monotonic() - started:.2f} s")  # three heartbeats and the next
    gone.start()
    expect_members(fleet, fleet)


@pytest.mark.parametrize("on_redis_down", ["local_share", "deny"])
def test_redis_away_leaves_each_instance_alone_and_nothing_is_lost(sluice_factory, redis, origin, on_redis_down):
    """Three instances, Redis killed: after three heartbeats each ranks over itself alone (logged
    once, `state: alone`) and serves and fills its own cache, whatever `on_redis_down` says —
    under `deny` too, which refuses only what a fleet rate limit covers (here the `localhost`
    policy's: 503), never a request of a policy without one; no such request fails. Redis back:
    the members again, and each URL goes to its owner again (the copies the others made alone
    are not served while it answers)."""
    fleet = fleet_of(sluice_factory, redis, [1, 1, 1], on_redis_down=on_redis_down,
                     policies={"localhost": {"rate_limit": {"rate": "100/s"}}})
    expect_members(fleet, fleet)
    addresses = [m.address for m in fleet]
    sessions = {m.address: session_via(m.proxy.url) for m in fleet}
    # A URL under the fleet rate limit, stored by its owner while Redis answers.
    limited = f"http://localhost:{origin.port}/limited"
    keeper = ranked(limited, addresses)[0]
    assert sessions[keeper].get(limited, timeout=10).status_code == 200
    redis.kill()
    for m in fleet:
        assert wait_until(lambda: m.fleet()["cache"]["state"] == "alone", 5), m.fleet()
        assert m.members() == [(m.address, 1.0)]
    url = f"http://{HOST}:{origin.port}/alone"
    for m in fleet:
        first = sessions[m.address].get(url, timeout=10)
        assert first.status_code == 200 and first.text == "body /alone", first
        assert "peer" not in first.headers["cache-status"] and "stored" in first.headers["cache-status"], first.headers
        again = sessions[m.address].get(url, timeout=10)
        assert again.status_code == 200 and "hit" in again.headers["cache-status"], again.headers
        assert "peer" not in again.headers["cache-status"], again.headers
    # Each instance fetched the URL once, for its own cache.
    assert len(origin.requests()) == 1 + 3
    # The rate-limited policy's stored URL is a hit in every mode (the cache answers before a try
    # is scheduled); under deny, its misses are what is refused.
    hit = sessions[keeper].get(limited, timeout=10)
    assert hit.status_code == 200 and "hit" in hit.headers["cache-status"], hit.headers
    if on_redis_down == "deny":
        refused = sessions[keeper].get(limited + "-miss", timeout=10)
        assert refused.status_code == 503 and "fleet.on_redis_down: deny" in refused.text, refused.text
    assert len(origin.requests()) == 1 + 3
    for m in fleet:
        assert m.proxy.stderr().count("fleet.cache: Redis has not answered 3 heartbeats") == 1, m.proxy.stderr()
    redis.start()
    expect_members(fleet, fleet, timeout=10)
    for m in fleet:
        assert "fleet.cache: Redis answers again" in m.proxy.stderr(), m.proxy.stderr()
    # Shared again: the URL each stored alone is the owner's copy through every instance.
    owner = ranked(url, addresses)[0]
    for address, s in sessions.items():
        r = s.get(url, timeout=10)
        status = r.headers["cache-status"]
        assert r.status_code == 200 and status.startswith("Sluice; hit"), (address, status)
        assert ("peer" not in status) if address == owner else status.endswith(f'detail="peer {owner}"'), \
            (address, status)
    # A new URL through every instance reaches the origin once, from its owner.
    fresh = f"http://{HOST}:{origin.port}/together"
    owner = ranked(fresh, addresses)[0]
    for address, s in sessions.items():
        r = s.get(fresh, timeout=10)
        status = r.headers["cache-status"]
        assert r.status_code == 200 and r.text == "body /together", r
        assert ("peer" not in status) if address == owner else status.endswith(f'detail="peer {owner}"'), \
            (address, status)
    assert len(origin.requests()) == 1 + 3 + 1


def test_a_reload_applies_a_new_weight_and_keeps_the_peer_listener(sluice_factory, redis):
    """SIGHUP with weight 3 on one of two: both show it (share 0.75) from its next heartbeat; a
    changed `listen` in the same file is said to wait for a restart."""
    fleet = fleet_of(sluice_factory, redis, [1, 1])
    expect_members(fleet, fleet)
    m = fleet[0]
    m.config["fleet"]["cache"]["weight"] = 3  # what expect_members expects
    text = yaml.safe_load(m.proxy.config_path.read_text())
    text["fleet"]["cache"]["weight"] = 3
    m.proxy.config_path.write_text(yaml.safe_dump(text, sort_keys=False))
    m.proxy.signal(signal.SIGHUP)
    expect_members(fleet, fleet)
    assert m.fleet()["cache"]["share"] == 0.75 and fleet[1].fleet()["cache"]["share"] == 0.25
    # A new peer listener in the file (advertise's port, another address): kept as started, and
    # said so.
    text["fleet"]["cache"]["listen"] = f"127.0.0.2:{m.port}"
    m.proxy.config_path.write_text(yaml.safe_dump(text, sort_keys=False))
    m.proxy.signal(signal.SIGHUP)
    assert wait_until(lambda: "fleet.cache.listen: the peer listener stays closed until a restart"
                      in m.proxy.stderr(), 5), m.proxy.stderr()
    assert "listen" not in m.fleet()["cache"]


def test_the_peer_listener_takes_signed_requests_only(sluice_factory, origin):
    """A static fleet with `listen`: on the peer listener an unsigned request and a CONNECT get
    403 and reach nothing; a signed one is proxied; the main listener serves clients as before.
    `GET /fleet` without Redis has only `cache`."""
    port, peer_port, admin = pick_port(), pick_port(), pick_port()
    peer = f"{HOST}:{peer_port}"
    proxy = sluice_factory({
        "listen": [f"{HOST}:{port}"],
        "admin": {"listen": f"{HOST}:{admin}"},
        "cache_store": {"memory": "16MiB", "max_object_size": "1MiB"},
        "fleet": {"cache": {"advertise": peer, "listen": peer, "secret": SECRET,
                            "peers": [{"address": peer}, {"address": f"{HOST}:{pick_port()}", "weight": 3}]}},
    }, name="peer-listener")
    assert wait_until(lambda: port_open(peer_port), 5), proxy.stderr()
    url = f"http://{HOST}:{origin.port}/peer"
    r = raw_get(peer_port, url, None)
    assert_sluice_error(r, 403, "peer request refused")
    assert "signed requests only" in r.body.decode(), r.body
    connect, c = send_raw(peer_port, f"CONNECT {HOST}:{origin.port} HTTP/1.1\r\nHost: {HOST}:{origin.port}\r\n\r\n"
                          .encode(), method="CONNECT")
    c.close()
    assert_sluice_error(connect, 403, "peer request refused")
    assert origin.requests() == []
    signed = raw_get(peer_port, url, peer_field("GET", url, sender="127.0.0.9:3128"))
    assert signed and signed.status == 200 and signed.body == b"body /peer", signed
    plain = get(proxy, url + "?main", None)
    assert plain and plain.status == 200, plain
    assert len(origin.requests()) == 2
    data = requests.get(f"http://{HOST}:{admin}/fleet", timeout=5).json()
    validate(schema_for("/fleet", "GET", 200), data)
    assert set(data) == {"cache"}, data
    cache = data["cache"]
    assert cache["source"] == "static" and cache["state"] == "static" and cache["listen"] == peer, cache
    assert cache["share"] == 0.25 and len(cache["members"]) == 2, cache
    assert all("last_seen_ms" not in m for m in cache["members"]), cache
    assert f"fleet.cache: peer listener on {peer}" in proxy.stderr()


@pytest.mark.parametrize("config, phrase", [
    ({"listen": ["127.0.0.1:3128"], "fleet": {"redis": "127.0.0.1:6379", "cache": {
        "advertise": "127.0.0.1:3128", "listen": "127.0.0.1:3129", "secret": SECRET}}},
     "fleet.cache.advertise (127.0.0.1:3128) must have the port of fleet.cache.listen (127.0.0.1:3129)"),
    ({"listen": ["127.0.0.1:3128"], "fleet": {"redis": "127.0.0.1:6379", "cache": {
        "advertise": "127.0.0.1:3130", "secret": SECRET}}},
     "must have the port of one of the listen addresses"),
])
def test_check_refuses_an_advertise_that_leads_nowhere(tmp_path, config, phrase):
    r = run_check(write_yaml(tmp_path / "members.yaml", config))
    assert r.returncode != 0 and phrase in r.stdout + r.stderr, r.stdout + r.stderr


def raw_get(port: int, url: str, field: str | None):
    head = f"GET {url} HTTP/1.1\r\nHost: {url.split('/')[2]}\r\n"
    if field is not None:
        head += f"Sluice-Peer: {field}\r\n"
    r, c = send_raw(port, (head + "\r\n").encode())
    c.close()
    return r


def test_members_heard_from_redis_share_one_cache(sluice_factory, redis, origin):
    """The hop over members learned from Redis (not a static list): 300 URLs, each once through
    a random instance and then through every instance, reach the origin 300 times, each
    non-owner's answer naming the owner; SIGKILL one, and once the other two have heard it
    leave, only the URLs it owned reach the origin again, and no request fails."""
    fleet = fleet_of(sluice_factory, redis, [1, 1, 1])
    expect_members(fleet, fleet)
    addresses = [m.address for m in fleet]
    urls = [f"http://{HOST}:{origin.port}/shared/{i}" for i in range(300)]
    sessions = {m.address: session_via(m.proxy.url) for m in fleet}
    rng = random.Random(37)
    for url in urls:
        r = sessions[rng.choice(addresses)].get(url, timeout=10)
        assert r.status_code == 200 and r.content == f"body /shared/{url.rsplit('/', 1)[1]}".encode(), r
    assert len(origin.requests()) == 300
    for url in urls:
        owner = ranked(url, addresses)[0]
        for address, s in sessions.items():
            status = s.get(url, timeout=10).headers["cache-status"]
            assert ("peer" not in status) if address == owner else status.endswith(f'detail="peer {owner}"'), \
                (url, address, status)
    assert len(origin.requests()) == 300
    gone = fleet[2]
    gone.kill()
    expect_members(fleet[:2], fleet[:2], timeout=5 * HEARTBEAT_MS / 1000 + 2)
    for url in urls:
        for m in fleet[:2]:
            assert sessions[m.address].get(url, timeout=10).status_code == 200, url
    owned = {u for u in urls if ranked(u, addresses)[0] == gone.address}
    # The origin's requests are listed by connection, not in order: what came after is the count
    # beyond one per URL.
    again = Counter(r["target"] for r in origin.requests()) - Counter("/" + u.split("/", 3)[3] for u in urls)
    assert again == Counter("/" + u.split("/", 3)[3] for u in owned), (len(again), len(owned))
