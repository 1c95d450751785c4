"""Counters that say what happened (docs/metrics.md): scenarios driven through a running
Sluice, each asserting the exact values the counters of /metrics must reach, next to what
the origin saw (a counting origin records every request and its fields).

`sluice_cache_total` first: each `event` as docs/metrics.md defines it — `revalidated` only
when a conditional request went out and the origin answered it.
"""

from __future__ import annotations

import re

import pytest
import requests

from cache_origin import CountingOrigin
from faultservers import pick_port
from support import HOST

SERIES = re.compile(r'^([a-z_]+)(?:\{(.*)\})? (\S+)$')


def scrape(admin: int) -> dict[tuple[str, frozenset], float]:
    """Every sample of /metrics, keyed by name and label set."""
    out = {}
    text = requests.get(f"http://{HOST}:{admin}/metrics", timeout=5).text
    for row in text.splitlines():
        if row.startswith("#") or not row.strip():
            continue
        m = SERIES.match(row)
        assert m, f"unparsable /metrics line: {row!r}"
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m[2] or ""))
        out[(m[1], labels)] = float(m[3])
    return out


def cache_events(admin: int) -> dict[str, int]:
    return {dict(labels)["event"]: int(v) for (name, labels), v in scrape(admin).items()
            if name == "sluice_cache_total"}


@pytest.fixture
def origin():
    o = CountingOrigin()
    yield o
    o.stop()


# (scenario, the origin's fields, requests, expected sluice_cache_total, requests the origin
# saw with a conditional field)
CACHE_SCENARIOS = [
    ("cached", {"Cache-Control": "max-age=60"}, 4,
     {"lookup": 4, "miss": 1, "stored": 1, "hit": 3}, 0),
    ("refetched without validators", {"Cache-Control": "max-age=0"}, 4,
     {"lookup": 4, "miss": 4, "stored": 4}, 0),
    ("revalidated with an ETag", {"Cache-Control": "max-age=0", "ETag": '"v1"'}, 4,
     {"lookup": 4, "miss": 4, "stored": 1, "revalidated": 3}, 3),
]


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("name,fields,n,expected,conditional", CACHE_SCENARIOS,
                         ids=[s[0] for s in CACHE_SCENARIOS])
def test_cache_events_count_what_happened(sluice_factory, origin, workers, name, fields, n, expected,
                                          conditional):
    admin = pick_port()
    proxy = sluice_factory({"workers": workers, "cache_store": {"memory": "16MiB"},
                            "monitors": [{"metrics": {}}], "admin": {"listen": f"{HOST}:{admin}"}})
    url = origin.set("/r", headers=fields, body=b"the body")
    with requests.Session() as s:  # one connection: the requests are sequential
        for _ in range(n):
            r = s.get(url, proxies={"http": proxy.url}, timeout=10)
            assert r.status_code == 200 and r.content == b"the body", r
    seen = origin.requests("/r")
    with_validators = [f for _, f in seen if any(k.startswith("if-") for k in f)]
    assert len(with_validators) == conditional, seen
    events = cache_events(admin)
    assert {k: v for k, v in events.items() if v} == expected, events
