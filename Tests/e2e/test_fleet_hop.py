"""The fleet's one cache (`fleet.cache`, docs/fleet.md "One cache across the fleet"): a miss on
an instance that does not own the URL asks its owner (weighted rendezvous hashing of the
cache's primary key over the static `peers:`), which serves, fetches, stores and streams back;
the asker keeps no copy, and `Cache-Status` names the peer that answered. Three instances on
loopback, each with its own disk tier, in front of a counting origin: each URL reaches the
origin once and is stored once in the fleet; a cold URL hammered through all three is fetched
once; a killed instance costs only its own URLs, and gets them back from its disk when it
returns; a 1 GiB object streams through a non-owner with flat memory; a peer's request is
never passed on to a third instance, and a forged one goes nowhere.

The owners are computed here with a Python twin of `RendezvousOwners`, checked against the
vectors the Swift unit tests hold (Tests/SluiceCoreTests/PeerWalkTests.swift)."""

from __future__ import annotations

import hashlib
import math
import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from faultservers import HOST, header, pick_port, simple_response
from support import MiB, RssMonitor, session_via, wait_until
from test_cache_disk import store_config
from test_fleet_cache import SECRET, peer_field
from test_rate_limit import ArrivalOrigin

M64 = (1 << 64) - 1


def fnv1a(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & M64
    return h


def mix(x: int) -> int:
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & M64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & M64
    return x ^ (x >> 33)


def ranked(key: str, members: list[str], weights: dict[str, float] | None = None) -> list[str]:
    """`RendezvousOwners.ranked`: the members by score for `key`, the owner first."""
    ms = sorted(set(members))
    kh = fnv1a(key.encode())

    def score(i: int) -> float:
        bits = mix(kh ^ mix(fnv1a(ms[i].encode()))) >> 11
        return -(weights or {}).get(ms[i], 1.0) / math.log((bits + 0.5) / 9007199254740992.0)

    return [ms[i] for i in sorted(range(len(ms)), key=lambda i: (-score(i), i))]


def test_the_python_twin_ranks_as_the_swift_owners_do():
    three = ["10.0.0.1:3128", "10.0.0.2:3128", "10.0.0.3:3128"]
    assert fnv1a(b"a") == 0xAF63DC4C8601EC8C
    assert ranked("http://origin.test/object/0?v=1", three) == ["10.0.0.2:3128", "10.0.0.3:3128", "10.0.0.1:3128"]
    assert ranked("http://origin.test/object/1?v=1", three) == ["10.0.0.3:3128", "10.0.0.1:3128", "10.0.0.2:3128"]
    assert ranked("http://origin.test/object/2?v=1", three) == ["10.0.0.1:3128", "10.0.0.2:3128", "10.0.0.3:3128"]
    assert ranked("http://origin.test/object/5?v=1", three) == ["10.0.0.2:3128", "10.0.0.1:3128", "10.0.0.3:3128"]
    weighted = {"[fd00::1]:3128": 1.0, "[fd00::2]:3128": 2.0, "[fd00::3]:3128": 3.0}
    assert ranked("http://origin.test/w/0", list(weighted), weighted) == ["[fd00::2]:3128", "[fd00::1]:3128",
                                                                          "[fd00::3]:3128"]
    assert ranked("http://origin.test/w/1", list(weighted), weighted) == ["[fd00::3]:3128", "[fd00::2]:3128",
                                                                          "[fd00::1]:3128"]


# ------------------------------------------------------------------------------------------
# Three instances and an origin
# ------------------------------------------------------------------------------------------

SLOW_PATH = "/slow/"
COPY_PATH = "/copy/"


def answer(req, n):
    """Cacheable bodies derived from the path; under /slow/ a 256 KiB body after a pause; under
    /copy/ a body that says which of the origin's answers it is (each fetch a copy of its own)."""
    target = req["target"]
    if target.startswith(SLOW_PATH):
        time.sleep(0.3)  # server behaviour: a slow origin, so that every client arrives during the fetch
        return simple_response(200, slow_body(target), [("Cache-Control", "max-age=300")])
    if target.startswith(COPY_PATH):
        return simple_response(200, f"answer {n} for {target}".encode(), [("Cache-Control", "max-age=300")])
    return simple_response(200, f"body {target}".encode(), [("Cache-Control", "max-age=300")])


def slow_body(target: str) -> bytes:
    return random.Random(target).randbytes(256 * 1024)


@pytest.fixture
def origin():
    s = ArrivalOrigin(answer)
    yield s
    s.stop()


class Fleet:
    def __init__(self, sluice_factory, tmp_path: Path, extra: dict | None = None):
        self.ports = [pick_port() for _ in range(3)]
        self.members = [f"{HOST}:{p}" for p in self.ports]
        self.disks = [tmp_path / f"disk-{p}" for p in self.ports]
        self.instances = []
        for port, disk in zip(self.ports, self.disks):
            me = f"{HOST}:{port}"
            self.instances.append(sluice_factory({
                "listen": [me],
                **store_config(disk),
                "fleet": {"cache": {"advertise": me, "secret": SECRET,
                                    "peers": [{"address": m} for m in self.members]}},
                **(extra or {}),
            }, name=f"member-{port}"))
        self.by_member = dict(zip(self.members, self.instances))

    def owner(self, url: str) -> str:
        return ranked(url, self.members)[0]

    def entries(self) -> int:
        """Entries stored over the three disks (one record file each)."""
        return sum(len([p for p in d.rglob("*.meta")]) for d in self.disks if d.exists())


def path(url: str) -> str:
    return "/" + url.split("/", 3)[3]


_local = threading.local()


def get(instance, url: str, timeout: float = 30) -> requests.Response:
    """Through `instance`, on a keep-alive session of this thread's."""
    sessions = getattr(_local, "sessions", None)
    if sessions is None:
        sessions = _local.sessions = {}
    s = sessions.setdefault(instance.port, session_via(instance.url))
    return s.get(url, timeout=timeout)


def test_each_url_reaches_the_origin_once_and_is_stored_once(sluice_factory, tmp_path, origin):
    """300 URLs, each asked once through a random instance, then each through every instance:
    the origin sees 300 requests, the three disks hold 300 entries, and every answer on a
    non-owner names the owner in Cache-Status."""
    fleet = Fleet(sluice_factory, tmp_path)
    urls = [f"http://{HOST}:{origin.port}/object/{i}" for i in range(300)]
    rng = random.Random(7)
    firsts = [(rng.choice(fleet.instances), u) for u in urls]
    with ThreadPoolExecutor(12) as pool:
        for r in pool.map(lambda p: get(*p), firsts):
            assert r.status_code == 200, r
        assert len(origin.requests()) == 300
        seconds = [(i, u) for u in urls for i in fleet.instances]
        answers = list(pool.map(lambda p: get(*p), seconds))
    for (instance, url), r in zip(seconds, answers):
        assert r.status_code == 200 and r.content == f"body {path(url)}".encode(), r
        owner = fleet.owner(url)
        status = r.headers["cache-status"]
        if f"{HOST}:{instance.port}" == owner:
            assert "hit" in status and "peer" not in status, (url, status)
        else:
            # The owner's entry first (its hit), then this instance's, naming the owner.
            assert status.startswith("Sluice; hit") and status.endswith(f'detail="peer {owner}"'), (url, status)
    assert len(origin.requests()) == 300
    targets = [r["target"] for r in origin.requests()]
    assert len(set(targets)) == 300
    assert wait_until(lambda: fleet.entries() == 300, 10), fleet.entries()
    # Each instance stores its own URLs only.
    for member, disk in zip(fleet.members, fleet.disks):
        owned = sum(1 for u in urls if fleet.owner(u) == member)
        assert len(list(disk.rglob("*.meta"))) == owned, (member, owned)


def test_a_cold_url_from_thirty_clients_on_three_instances_is_fetched_once(sluice_factory, tmp_path, origin):
    fleet = Fleet(sluice_factory, tmp_path)
    url = f"http://{HOST}:{origin.port}{SLOW_PATH}cold"
    expected = hashlib.sha256(slow_body(f"{SLOW_PATH}cold")).hexdigest()
    barrier = threading.Barrier(30)

    def client(i: int) -> tuple[int, str]:
        instance = fleet.instances[i % 3]
        s = session_via(instance.url)
        barrier.wait(timeout=10)
        r = s.get(url, timeout=30)
        return r.status_code, hashlib.sha256(r.content).hexdigest()

    with ThreadPoolExecutor(30) as pool:
        results = list(pool.map(client, range(30)))
    assert results == [(200, expected)] * 30
    assert len(origin.requests()) == 1, [r["target"] for r in origin.requests()]


def test_a_killed_instance_costs_only_its_own_urls_and_gets_them_back_from_its_disk(
        sluice_factory, tmp_path, origin):
    fleet = Fleet(sluice_factory, tmp_path)
    urls = [f"http://{HOST}:{origin.port}/kill/{i}" for i in range(60)]
    for i, url in enumerate(urls):
        assert get(fleet.instances[i % 3], url).status_code == 200
    assert len(origin.requests()) == 60
    victim = fleet.instances[2]
    victim_member = fleet.members[2]
    owned = [u for u in urls if fleet.owner(u) == victim_member]
    assert 5 < len(owned) < 40, len(owned)
    victim.proc.kill()
    victim.proc.wait(timeout=10)
    victim.expected_exit = True
    survivors = fleet.instances[:2]
    for url in urls:
        for instance in survivors:
            r = get(instance, url)
            assert r.status_code == 200 and r.content.startswith(b"body /kill/"), (url, r)
    # (The origin lists requests by connection, not in order: counted per URL.)
    counts = Counter(r["target"] for r in origin.requests())
    assert sorted(t for t, n in counts.items() if n > 1) == sorted(path(u) for u in owned), counts
    assert max(counts.values()) == 2, counts
    # Back with its disk: its URLs are served from there, the origin is not asked again.
    victim.start()
    victim.expected_exit = False
    for url in owned:
        r = get(victim, url)
        assert r.status_code == 200 and "hit" in r.headers["cache-status"], (url, r.headers)
    # Once a survivor's mark of it ended, it asks it again for a URL it holds no copy of (one it
    # ranks below the other survivor, which held the URL meanwhile; a copy of its own would
    # answer until it ages out). Nothing reaches the origin either way.
    url = next(u for u in owned if ranked(u, fleet.members)[2] == fleet.members[0])
    assert wait_until(
        lambda: f'detail="peer {victim_member}"' in get(survivors[0], url).headers["cache-status"], 15, 0.5)
    assert len(origin.requests()) == 60 + len(owned)


@pytest.mark.heavy
def test_a_1gib_object_streams_through_a_non_owner_with_flat_memory(sluice_factory, tmp_path, nginx, big_file):
    fleet = Fleet(sluice_factory, tmp_path)
    url = nginx.url(big_file.url_path)
    owner = fleet.owner(url)
    asker = next(i for m, i in fleet.by_member.items() if m != owner)
    # One small exchange through the same hop first: the pools it opens count in the baseline.
    warm = get(asker, nginx.url("/1k"))
    assert warm.status_code == 200 and warm.content == nginx.file_1k
    time.sleep(0.2)  # time passing: the instance settles after the warm-up before the RSS baseline is taken
    h = hashlib.sha256()
    n = 0
    with RssMonitor(asker.pid) as mon, session_via(asker.url).get(url, stream=True, timeout=300) as r:
        assert r.status_code == 200
        assert f'detail="peer {owner}"' in r.headers["cache-status"], r.headers
        for chunk in r.iter_content(4 * MiB):
            h.update(chunk)
            n += len(chunk)
    assert n == big_file.size and h.hexdigest() == big_file.sha256
    print(f"1 GiB through a non-owner: {mon.describe()}")
    assert mon.growth_mib <= 8, mon.describe()


def kill(instance) -> None:
    instance.proc.kill()
    instance.proc.wait(timeout=10)
    instance.expected_exit = True


def restart(instance) -> None:
    instance.start()
    instance.expected_exit = False


def test_an_old_copy_is_not_served_while_its_owner_answers(sluice_factory, tmp_path, origin):
    """A URL owned by A, with B next: while A is down, B stores it (the walk reaches B, which
    fetches as the owner would). A back: through B the answer is A's — A fetches it, the one
    copy the fleet serves — and never B's copy. A down again: B's copy answers, and the origin
    is not asked. The origin numbers its answers, so each copy is told apart."""
    fleet = Fleet(sluice_factory, tmp_path)
    (a, b, c), (a_member, b_member, _) = fleet.instances, fleet.members
    url = next(u for u in (f"http://{HOST}:{origin.port}{COPY_PATH}{i}" for i in range(100))
               if ranked(u, fleet.members)[:2] == [a_member, b_member])
    target = path(url)
    kill(a)
    first = get(b, url)
    assert first.status_code == 200 and first.content == f"answer 1 for {target}".encode(), first
    assert "peer" not in first.headers["cache-status"] and "stored" in first.headers["cache-status"], first.headers
    # A is marked down on B for 5 s: its copy answers meanwhile.
    again = get(b, url)
    assert again.content == first.content and "hit" in again.headers["cache-status"], again.headers
    assert len(origin.requests()) == 1
    restart(a)
    seen = []

    def answered_by_a() -> bool:
        r = get(b, url)
        assert r.status_code == 200, r
        seen.append((r.content, r.headers["cache-status"]))
        return f'detail="peer {a_member}"' in r.headers["cache-status"]

    # B asks A again once its mark of A ends; until then its own copy answers (without the origin).
    assert wait_until(answered_by_a, 15, 0.5), seen
    assert all(body == first.content and "peer" not in status for body, status in seen[:-1]), seen
    # A had no copy: it fetched the URL as its owner, and B's copy was not what B served.
    body, status = seen[-1]
    assert body == f"answer 2 for {target}".encode(), seen[-1]
    assert status.startswith("Sluice; fwd=uri-miss") and "stored" in status.split(",")[0], status
    for instance in (b, c, a, b):
        r = get(instance, url)
        assert r.status_code == 200 and r.content == body, (instance.port, r.content, r.headers)
        if instance is a:
            assert "hit" in r.headers["cache-status"] and "peer" not in r.headers["cache-status"], r.headers
        else:
            assert r.headers["cache-status"].startswith("Sluice; hit") and \
                r.headers["cache-status"].endswith(f'Sluice; fwd=uri-miss; detail="peer {a_member}"'), r.headers
    assert len(origin.requests()) == 2
    # A down again: B's old copy answers, neither deleted nor refetched; C (A's, then B's) gets it from B.
    kill(a)
    r = get(b, url)
    assert r.status_code == 200 and r.content == first.content, r.content
    assert "hit" in r.headers["cache-status"] and "peer" not in r.headers["cache-status"], r.headers
    r = get(c, url)
    assert r.status_code == 200 and r.content == first.content, r.content
    assert r.headers["cache-status"].endswith(f'detail="peer {b_member}"'), r.headers
    assert len(origin.requests()) == 2


def test_a_peer_request_is_never_passed_on_and_a_forged_one_goes_nowhere(sluice_factory, tmp_path, origin):
    fleet = Fleet(sluice_factory, tmp_path)
    # A URL the first instance does not own: a client's miss there would ask the owner.
    url = next(u for u in (f"http://{HOST}:{origin.port}/signed/{i}" for i in range(100))
               if fleet.owner(u) != fleet.members[0])
    first = fleet.instances[0]
    sender = fleet.members[1]
    r = requests.get(url, proxies={"http": first.url}, timeout=30,
                     headers={"Sluice-Peer": peer_field("GET", url, sender=sender)})
    assert r.status_code == 200 and "peer" not in r.headers["cache-status"], r.headers
    reqs = origin.requests()
    assert len(reqs) == 1
    # Straight from the first instance to the origin: one Sluice on the way (its Via entry).
    via = header(reqs[0]["headers"], "via") or ""
    assert via.count("sluice-") == 1, via
    forged = peer_field("GET", url + "x", sender=sender)
    r = requests.get(url + "-forged", proxies={"http": first.url}, timeout=30, headers={"Sluice-Peer": forged})
    assert r.status_code == 403 and "peer request refused" in r.text, r.text
    assert len(origin.requests()) == 1


def test_a_dead_peer_is_skipped_and_counted(sluice_factory, tmp_path, origin):
    """A member that does not listen: the request goes on without it at once, later ones skip
    it (marked down), and the metrics say so per peer and outcome."""
    admin = pick_port()
    dead = f"{HOST}:{pick_port()}"
    port = pick_port()
    me = f"{HOST}:{port}"
    proxy = sluice_factory({
        "listen": [me], "admin": {"listen": f"{HOST}:{admin}"}, **store_config(tmp_path / "disk"),
        "fleet": {"cache": {"advertise": me, "secret": SECRET, "peers": [{"address": me}, {"address": dead}]}},
    })
    urls = [u for u in (f"http://{HOST}:{origin.port}/dead/{i}" for i in range(40))
            if ranked(u, [me, dead])[0] == dead][:6]
    started = time.monotonic()
    for url in urls:
        r = get(proxy, url)
        assert r.status_code == 200 and "peer" not in r.headers["cache-status"], r.headers
    assert time.monotonic() - started < 5
    metrics = requests.get(f"http://{HOST}:{admin}/metrics", timeout=10).text
    assert f'sluice_peer_requests_total{{peer="{dead}",outcome="failed"}} 1' in metrics, metrics
    assert f'sluice_peer_requests_total{{peer="{dead}",outcome="skipped_down"}} {len(urls) - 1}' in metrics, metrics
    assert f'sluice_peer_request_duration_seconds_count{{peer="{dead}"}} 1' in metrics, metrics
    # GET /fleet gives the same counts per peer and outcome.
    fleet = requests.get(f"http://{HOST}:{admin}/fleet", timeout=10).json()
    assert fleet["cache"]["peer_requests"] == {dead: {"failed": 1, "skipped_down": len(urls) - 1}}, fleet
    assert len(origin.requests()) == len(urls)


def test_a_sub_requests_depth_goes_to_the_peer_that_runs_its_scripts(sluice_factory, tmp_path, origin):
    """A `lua` sub-request's URL another member owns is asked of that member, which runs its own
    policy's scripts: it gets the depth with the signed request (`Sluice-Lua-Depth`, bare), so
    scripts that call each other across the fleet still stop at depth 2. Each script calls the
    path with one more `x`: the client's request (depth 0) calls `sx`; `sx` (depth 1, served by
    its owner) may call once more, and `sxx`'s script (depth 2) may not — so no request for
    `sxxx` is ever made; were the owner of `sx` to count from 0, it would be. No member sends
    the field to the origin."""
    script = ('return { on_request = function(req) '
              f'local ok, err = pcall(sluice.http, {{url = "http://localhost:{origin.port}" .. req.path .. "x"}}) '
              'req.headers:set("X-Nested", ok and "allowed" or tostring(err)) end }')
    entry = {"lua": {"source": script, "allow_hosts": [f"localhost:{origin.port}"], "limits": {"wall": "5s"}}}
    fleet = Fleet(sluice_factory, tmp_path, {"policies": {HOST: {"adapters": [entry]},
                                                        "localhost": {"adapters": [entry]}}})
    first = fleet.members[0]

    def owner(host: str, i: int, tail: str) -> str:
        return fleet.owner(f"http://{host}:{origin.port}/d{i}/{tail}")

    # The client's URL is owned by another member, which runs the script (the first asks it,
    # running none of its own policy); the script's sub-request is owned by a third, which
    # gets it with its depth.
    k = next(i for i in range(500)
             if owner(HOST, i, "s") != first and owner("localhost", i, "sx") not in (first, owner(HOST, i, "s")))
    r = get(fleet.instances[0], f"http://{HOST}:{origin.port}/d{k}/s")
    assert r.status_code == 200, r.text
    seen = {req["target"]: req for req in origin.requests()}
    nested = {t: header(req["headers"], "x-nested") for t, req in seen.items()}
    assert f"/d{k}/sxxx" not in seen, nested
    assert nested[f"/d{k}/sx"] == "allowed", nested
    assert "2 deep" in nested[f"/d{k}/sxx"], nested
    assert nested[f"/d{k}/s"] == "allowed", nested
    for req in seen.values():
        assert header(req["headers"], "sluice-lua-depth") is None, req["headers"]
