"""Shared fills (docs/caching.md, "Shared fills"; `CacheFetch`, `FillStream`): requests for a URL
another request is fetching wait on that fetch without polling and are sent its response while
it is still arriving (read-while-writer) — from the disk tier's file being written, or from the
memory copy's chunks; one origin request for a hundred concurrent clients, every body
sha256-exact; a fill that breaks mid-body ends its readers incomplete, never a short success.
Real curl clients against the purpose-built origin of resume_origin.py."""

from __future__ import annotations

import hashlib
import subprocess
import threading
import time

import pytest

from policy_support import AccessLog, monitors
from faultservers import pick_port
from resume_origin import ResumeOrigin
from support import HOST
from test_metric_values import scrape, value

MiB = 1 << 20


def fetch(proxy, url: str, out: dict, key, timeout: float = 120) -> None:
    """curl through the proxy; out[key] = (exit code, status, bytes, sha256, Cache-Status,
    seconds to the first body byte, seconds to the end)."""
    started = time.monotonic()
    proc = subprocess.Popen(["curl", "-s", "-o", "-", "-D", "/dev/stderr", "--proxy", proxy.url,
                             "--max-time", str(int(timeout)), url], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    h = hashlib.sha256()
    total, first = 0, None
    while True:
        piece = proc.stdout.read1(1 << 20)
        if not piece:
            break
        if first is None:
            first = time.monotonic() - started
        h.update(piece)
        total += len(piece)
    head = proc.stderr.read().decode("latin-1")
    rc = proc.wait(timeout=timeout)
    status = int(head.split(" ", 2)[1]) if head.startswith("HTTP/") else 0
    cache_status = next((line.split(":", 1)[1].strip() for line in head.splitlines()
                         if line.lower().startswith("cache-status:")), "")
    out[key] = (rc, status, total, h.hexdigest(), cache_status, first, time.monotonic() - started)


def run_clients(proxy, url: str, n: int, stagger: float = 0.0) -> dict:
    out: dict = {}
    threads = []
    for i in range(n):
        t = threading.Thread(target=fetch, args=(proxy, url, out, i), daemon=True)
        t.start()
        threads.append(t)
        if stagger:
            time.sleep(stagger)  # time passing: the next client arrives while the fill runs
    for t in threads:
        t.join(timeout=180)
    return out


@pytest.fixture
def access(tmp_path):
    return AccessLog(tmp_path / "access.log")


def store(tmp_path, disk: bool) -> dict:
    if disk:
        return {"cache_store": {"memory": "8MiB", "disk": {"path": str(tmp_path / "cache"), "size": "1GiB"}}}
    return {"cache_store": {"memory": "64MiB", "max_object_size": "32MiB"}}


@pytest.mark.parametrize("disk", [True, False], ids=["disk", "memory"])
def test_a_waiting_client_gets_the_body_while_it_is_still_arriving(sluice_factory, access, tmp_path, disk):
    # 24 MiB at 1 MiB per 0.1 s: the fill takes about 2.4 s. A second client, arriving 0.5 s in,
    # gets its first byte long before the fill ends, and the whole body right after it.
    size = 24 * MiB
    origin = ResumeOrigin(size, extra=["Cache-Control: max-age=600"], pace=0.1)
    try:
        proxy = sluice_factory({**store(tmp_path, disk), "workers": 2, "monitors": monitors(access.path)})
        url = origin.url + "/slow"
        out = run_clients(proxy, url, 2, stagger=0.5)
        digest = origin.sha256()
        for i in (0, 1):
            rc, status, total, sha, _, _, _ = out[i]
            assert (rc, status, total, sha) == (0, 200, size, digest), (i, out[i][:4])
        assert len(origin.log) == 1, origin.log
        first_done = out[0][6]
        _, _, _, _, cache_status, first_byte, done = out[1]
        assert "detail=shared-fill" in cache_status and "collapsed" in cache_status, cache_status
        assert first_byte < 1.5, f"the reader's first byte came after {first_byte:.2f} s: not while the body arrived"
        assert done + 0.5 < first_done + 1.0, (done, first_done)
        line = access.wait_for(lambda e: "shared-fill" in (e.get("cache") or ""))[0]
        assert line["outcome"] == "ok" and line["status"] == 200, line
    finally:
        origin.stop()


@pytest.mark.parametrize("disk", [True, False], ids=["disk", "memory"])
def test_a_hundred_clients_at_once_cause_one_origin_request(sluice_factory, tmp_path, disk):
    size = 16 * MiB
    # The head comes 1.5 s after the request: the hundred curl processes (slow to start on a
    # loaded machine) all arrive while the fetch is under way, and read its fill.
    origin = ResumeOrigin(size, extra=["Cache-Control: max-age=600"], head_delay=1.5)
    try:
        proxy = sluice_factory({**store(tmp_path, disk), "workers": 2})
        out = run_clients(proxy, origin.url + "/popular", 100)
        digest = origin.sha256()
        bad = {i: r[:4] for i, r in out.items() if r[:4] != (0, 200, size, digest)}
        assert len(out) == 100 and not bad, bad
        assert len(origin.log) == 1, f"{len(origin.log)} requests reached the origin"
        ends = sorted(r[6] for r in out.values())
        assert sum("shared-fill" in r[4] for r in out.values()) >= 90, [r[4] for r in out.values()]
        print(f"100 x {size >> 20} MiB: first done {ends[0]:.2f} s, last {ends[-1]:.2f} s")
        assert ends[-1] < 3 * ends[0] + 5, ends
    finally:
        origin.stop()


def test_a_fill_that_breaks_ends_its_readers_incomplete(sluice_factory, access, tmp_path):
    # No validator, so no resume: the fetching client and the reader both end incomplete.
    size = 16 * MiB
    origin = ResumeOrigin(size, cuts=[6 * MiB], etag=None, extra=["Cache-Control: max-age=600"], pace=0.05,
                          head_delay=0.3)
    try:
        proxy = sluice_factory({**store(tmp_path, True), "monitors": monitors(access.path)})
        out = run_clients(proxy, origin.url + "/breaks", 2, stagger=0.1)
        for i in (0, 1):
            rc, status, total, _, _, _, _ = out[i]
            assert status == 200 and rc != 0 and total < size, (i, out[i][:3])
        assert len(origin.log) == 1, origin.log
        lines = access.wait_for(lambda e: e.get("url", "").endswith("/breaks"), n=2)
        assert {e["outcome"] for e in lines} <= {"upstream_aborted", "error"}, lines
        # Nothing was stored: the next request goes to the origin.
        rc, status, total, _, cache_status, _, _ = run_clients(proxy, origin.url + "/breaks", 1)[0]
        assert (rc, status, total) == (0, 200, size) and "hit" not in cache_status.split(";")[1], cache_status
        assert len(origin.log) == 2
    finally:
        origin.stop()


@pytest.mark.parametrize("engine,disk", [("native", True), ("curl", True), ("native", False)],
                         ids=["native-disk", "curl-disk", "native-memory"])
def test_a_slow_or_vanished_first_client_slows_nobody_else(sluice_factory, access, tmp_path, engine, disk):
    # The first client reads at 2 MiB/s (its 24-48 MiB would take 12-24 s) and a second one
    # quits early; the others, arriving while the origin's answer streams, finish at the
    # origin's pace: the fill is no longer paced by the client that fetched it.
    size = (48 if disk else 24) * MiB
    origin = ResumeOrigin(size, extra=["Cache-Control: max-age=600"], pace=0.02)
    try:
        cfg = {**store(tmp_path, disk), "workers": 2, "monitors": monitors(access.path)}
        cfg["policies"] = {"default": {"upstream": {"engine": engine}}}
        proxy = sluice_factory(cfg)
        url = origin.url + "/shared"
        slow = subprocess.Popen(["curl", "-s", "-o", "/dev/null", "--limit-rate", "2M", "--proxy", proxy.url, url])
        time.sleep(0.3)  # time passing: the slow client's fetch is under way
        quitter = subprocess.Popen(["curl", "-s", "-o", "/dev/null", "--proxy", proxy.url, url])
        time.sleep(0.2)  # time passing: the quitter reads a little of the fill
        quitter.kill()
        out = run_clients(proxy, url, 3, stagger=0.1)
        digest = origin.sha256()
        for i, r in out.items():
            assert r[:4] == (0, 200, size, digest), (i, r[:4])
            assert r[6] < 8, f"reader {i} took {r[6]:.1f} s: paced by the slow first client"
        assert slow.poll() is None, "the slow first client should still be reading"
        slow.kill()
        assert len(origin.log) == 1, origin.log
        # The fill went on without its client: the next request is a hit, whole.
        r = run_clients(proxy, url, 1)[0]
        assert r[:4] == (0, 200, size, digest) and r[4].startswith("Sluice; hit"), r
        assert len(origin.log) == 1
    finally:
        origin.stop()


@pytest.mark.parametrize("engine,disk", [("native", True), ("curl", True), ("native", False)],
                         ids=["native-disk", "curl-disk", "native-memory"])
def test_a_fill_its_slow_client_handed_on_resumes_after_a_cut(sluice_factory, access, tmp_path, engine, disk):
    # The first client reads at 2 MiB/s: it falls behind its own fill at once and reads it like
    # the other readers, and the transfer goes on at the origin's pace without it
    # (FillProducer). The origin cuts at 9 MiB: the producer asks for the rest (Range, If-Range)
    # after the backoff, and the fill carries on — every reader gets the whole body, nothing
    # ends short, and the next request is a hit.
    size = 16 * MiB
    origin = ResumeOrigin(size, cuts=[9 * MiB], extra=["Cache-Control: max-age=600"], pace=0.01)
    try:
        admin = pick_port()
        cfg = {**store(tmp_path, disk), "workers": 2, "monitors": monitors(access.path) + [{"metrics": {}}],
               "admin": {"listen": f"{HOST}:{admin}"}}
        # The producer's resume is a try like any other: it takes a `rate_limit` turn too.
        cfg["policies"] = {"default": {"upstream": {"engine": engine}, "rate_limit": {"rate": "100/s"}}}
        proxy = sluice_factory(cfg)
        url = origin.url + "/cut"
        slow = subprocess.Popen(["curl", "-s", "-o", "/dev/null", "--limit-rate", "2M", "--proxy", proxy.url, url])
        try:
            time.sleep(0.3)  # time passing: the slow client's fetch is under way
            out = run_clients(proxy, url, 2, stagger=0.1)
            digest = origin.sha256()
            for i, r in out.items():
                assert r[:4] == (0, 200, size, digest), (i, r[:4])
            # One resume, from what reached Sluice before the cut (at most 9 MiB: a reset
            # discards what the socket had not read yet).
            ranges = [e["range"] for e in origin.log]
            assert ranges[0] is None and len(ranges) == 2 and ranges[1].startswith("bytes="), origin.log
            assert 0 < int(ranges[1][len("bytes="):-1]) <= 9 * MiB, origin.log
        finally:
            slow.kill()
            slow.wait(timeout=5)
        r = run_clients(proxy, url, 1)[0]
        assert r[:4] == (0, 200, size, digest) and r[4].startswith("Sluice; hit"), r
        assert len(origin.log) == 2, origin.log
        samples = scrape(admin)
        tries = {k: value(samples, "sluice_upstream_tries_total", kind=k) for k in ("request", "resume", "fill_resume")}
        # The producer resumes, or — when the cut comes before the client falls behind — the
        # client's own exchange does: one resume either way, a try with its turn.
        assert tries["resume"] + tries["fill_resume"] == 1 and tries["request"] == 1, tries
        assert value(samples, "sluice_rate_limit_decisions_total", policy="default", decision="allowed") == 2
    finally:
        origin.stop()


def test_the_fill_goes_on_when_its_fetching_client_vanishes(sluice_factory, access, tmp_path):
    size = 32 * MiB
    # 32 MiB at 1 MiB per 0.06 s: the fetch takes about 2 s, so the readers (arriving 0.3 s in)
    # are reading or waiting on it when the first client goes, even on a loaded machine.
    origin = ResumeOrigin(size, extra=["Cache-Control: max-age=600"], pace=0.06)
    try:
        proxy = sluice_factory({**store(tmp_path, True), "monitors": monitors(access.path)})
        url = origin.url + "/orphan"
        first = subprocess.Popen(["curl", "-s", "-o", "/dev/null", "--proxy", proxy.url, url])
        time.sleep(0.3)  # time passing: the fetch is under way, a few MiB in
        readers = threading.Thread(target=lambda: out.update(run_clients(proxy, url, 2)), daemon=True)
        out: dict = {}
        readers.start()
        time.sleep(0.6)  # time passing: the readers wait on the fetch (or read it)
        first.kill()
        first.wait(timeout=5)
        readers.join(timeout=60)
        digest = origin.sha256()
        assert len(out) == 2 and all(r[:4] == (0, 200, size, digest) for r in out.values()), out
        assert len(origin.log) == 1, origin.log
        line = access.wait_for(lambda e: e.get("url", "").endswith("/orphan") and e["outcome"] == "client_aborted")[0]
        assert line["cache"].startswith("fwd=uri-miss"), line
        r = run_clients(proxy, url, 1)[0]
        assert r[:4] == (0, 200, size, digest) and r[4].startswith("Sluice; hit"), r
    finally:
        origin.stop()


def test_the_fill_of_a_vanished_client_resumes_as_a_try_with_its_turn(sluice_factory, access, tmp_path):
    # As above, and the origin cuts at 28 MiB, well after the first client went (about 15 MiB
    # in): the producer asks for the rest by a try that passes the try stages — its
    # `rate_limit` turn taken and counted — and the readers get the whole body.
    size = 32 * MiB
    origin = ResumeOrigin(size, cuts=[28 * MiB], extra=["Cache-Control: max-age=600"], pace=0.06)
    admin = pick_port()
    try:
        proxy = sluice_factory({**store(tmp_path, True), "monitors": monitors(access.path) + [{"metrics": {}}],
                                "admin": {"listen": f"{HOST}:{admin}"},
                                "policies": {"default": {"rate_limit": {"rate": "100/s"}}}})
        url = origin.url + "/orphan-cut"
        first = subprocess.Popen(["curl", "-s", "-o", "/dev/null", "--proxy", proxy.url, url])
        time.sleep(0.3)  # time passing: the fetch is under way, a few MiB in
        out: dict = {}
        readers = threading.Thread(target=lambda: out.update(run_clients(proxy, url, 2)), daemon=True)
        readers.start()
        time.sleep(0.6)  # time passing: the readers wait on the fetch (or read it)
        first.kill()
        first.wait(timeout=5)
        readers.join(timeout=60)
        digest = origin.sha256()
        assert len(out) == 2 and all(r[:4] == (0, 200, size, digest) for r in out.values()), out
        assert len(origin.log) == 2 and origin.log[1]["range"].startswith("bytes="), origin.log
        samples = scrape(admin)
        tries = {k: value(samples, "sluice_upstream_tries_total", kind=k) for k in ("request", "resume", "fill_resume")}
        assert tries == {"request": 1, "resume": 0, "fill_resume": 1}, tries
        assert value(samples, "sluice_rate_limit_decisions_total", policy="default", decision="allowed") == 2
    finally:
        origin.stop()


def test_a_waiter_of_another_vary_variant_is_not_sent_the_fill(sluice_factory, tmp_path):
    size = 8 * MiB
    origin = ResumeOrigin(size, extra=["Cache-Control: max-age=600", "Vary: Accept-Language"], pace=0.05,
                          head_delay=0.3)
    try:
        proxy = sluice_factory(store(tmp_path, True))
        url = origin.url + "/varied"
        out: dict = {}
        en = threading.Thread(target=lambda: out.update(
            {"en": subprocess.run(["curl", "-s", "-o", "/dev/null", "-D", "-", "-H", "Accept-Language: en",
                                   "--proxy", proxy.url, url], capture_output=True, text=True).stdout}))
        en.start()
        time.sleep(0.1)  # time passing: the en request's fetch is under way
        fr = subprocess.run(["curl", "-s", "-o", "/dev/null", "-D", "-", "-H", "Accept-Language: fr",
                             "--proxy", proxy.url, url], capture_output=True, text=True).stdout
        en.join(timeout=30)
        assert "shared-fill" not in fr and "shared-fill" not in out["en"], (fr, out)
        assert [e["method"] for e in origin.log] == ["GET", "GET"], origin.log  # each variant fetched
    finally:
        origin.stop()


def test_a_chunked_response_is_shared_while_it_arrives_with_a_disk_tier(sluice_factory, access, tmp_path):
    # The origin's length is unknown (chunked): with a disk tier the fill is read as it is
    # written, chunked to an HTTP/1.1 reader, up to the close to an HTTP/1.0 one.
    size = 12 * MiB
    origin = ResumeOrigin(size, extra=["Cache-Control: max-age=600"], chunked=True, pace=0.1)
    try:
        proxy = sluice_factory({**store(tmp_path, True), "monitors": monitors(access.path)})
        url = origin.url + "/chunks"
        out: dict = {}
        first = threading.Thread(target=fetch, args=(proxy, url, out, "first"), daemon=True)
        first.start()
        time.sleep(0.4)  # time passing: the fill is under way
        old = subprocess.Popen(["curl", "-s", "-0", "-o", "-", "-D", "/dev/stderr", "--proxy", proxy.url, url],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        fetch(proxy, url, out, "reader")
        body, head = old.communicate(timeout=60)
        first.join(timeout=60)
        digest = origin.sha256()
        for key in ("first", "reader"):
            assert out[key][:4] == (0, 200, size, digest), (key, out[key][:4])
        assert "shared-fill" in out["reader"][4], out["reader"]
        assert out["reader"][5] < 1.0, f"first byte after {out['reader'][5]:.2f} s: not while the body arrived"
        assert old.returncode == 0 and hashlib.sha256(body).hexdigest() == digest, old.returncode
        head = head.decode("latin-1").lower()
        assert "shared-fill" in head and "content-length" not in head and "transfer-encoding" not in head, head
        assert len(origin.log) == 1, origin.log
    finally:
        origin.stop()
