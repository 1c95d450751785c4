"""The shared cache's disk tier (`cache_store.disk`, docs/caching.md "Tiers"), through the real
binary against the counting origin (cache_origin.py): bodies larger than the memory tier's share
are stored on disk and served from it (origin count, sha256), survive a restart and `kill -9`
during a 200 MiB store (a whole entry or a miss, never a torn one), the directory stays within
its size, an unusable directory is a config error, a full disk keeps serving and logs once, a
304 update and an invalidation reach the disk entry."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
import requests
import yaml

from cache_origin import CountingOrigin
from conftest import SLUICE_BIN
from faultservers import pick_port
from policy_support import AccessLog, monitors
from support import wait_until

MiB = 1024 * 1024


@pytest.fixture
def origin():
    o = CountingOrigin()
    yield o
    o.stop()


def store_config(directory: Path, size: str = "64MiB", max_object: str = "16MiB") -> dict:
    # memory 1MiB: the memory tier keeps bodies up to 128 KiB; larger ones go to disk.
    return {"cache_store": {"memory": "1MiB", "disk": {"path": str(directory), "size": size},
                            "max_object_size": max_object}}


def get(proxy, url, headers=None, method="GET", timeout=60):
    return requests.request(method, url, headers=headers or {}, proxies={"http": proxy.url}, timeout=timeout)


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def dir_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir() if p.is_file())


def admin_url(proxy) -> str:
    return f"http://127.0.0.1:{proxy.admin_port}"


def body_of(n: int, seed: int = 1) -> bytes:
    return random.Random(seed).randbytes(n)


def test_body_larger_than_memory_is_stored_on_disk_and_survives_restart(sluice_factory, origin, tmp_path):
    directory = tmp_path / "disk"
    body = body_of(3 * MiB)
    url = origin.set("/big", headers={"Cache-Control": "max-age=600"}, body=body)
    admin_port = pick_port()
    proxy = sluice_factory({**store_config(directory), "admin": {"listen": f"127.0.0.1:{admin_port}"}})
    proxy.admin_port = admin_port
    first = get(proxy, url)
    assert first.status_code == 200 and sha(first.content) == sha(body)
    assert "stored" in first.headers["Cache-Status"]
    hit = get(proxy, url)
    assert sha(hit.content) == sha(body) and "detail=disk" in hit.headers["Cache-Status"], hit.headers
    ranged = get(proxy, url, {"Range": "bytes=1000000-1000099"})
    assert ranged.status_code == 206 and ranged.content == body[1000000:1000100]
    head = get(proxy, url, method="HEAD")
    assert head.status_code == 200 and head.headers["Content-Length"] == str(len(body)) and head.content == b""
    assert origin.count("/big") == 1
    assert dir_bytes(directory) > len(body), "the body is not in the disk tier's directory"
    view = requests.get(f"{admin_url(proxy)}/config", timeout=10).json()
    assert view["server"]["cache_store"]["disk"] == {"path": str(directory), "size": 64 * MiB}, view["server"]
    proxy.expected_exit = True
    proxy.stop()
    again = sluice_factory(store_config(directory), name="restarted")
    after = get(again, url)
    assert after.status_code == 200 and sha(after.content) == sha(body)
    assert "detail=disk" in after.headers["Cache-Status"], after.headers
    assert origin.count("/big") == 1, "the entry stored before the restart was not served"


def test_unknown_length_body_spills_to_disk(sluice_factory, origin, tmp_path):
    directory = tmp_path / "disk"
    body = body_of(600 * 1024, seed=2)
    url = origin.set("/chunked", headers={"Cache-Control": "max-age=600"}, body=body, chunked=True)
    proxy = sluice_factory(store_config(directory))
    assert sha(get(proxy, url).content) == sha(body)
    hit = get(proxy, url)
    assert sha(hit.content) == sha(body) and "detail=disk" in hit.headers["Cache-Status"]
    small = origin.set("/small", headers={"Cache-Control": "max-age=600"}, body=b"x" * 1000)
    get(proxy, small)
    assert "detail=memory" in get(proxy, small).headers["Cache-Status"], "a small body should be in memory too"
    assert origin.count("/chunked") == 1 and origin.count("/small") == 1


def test_small_large_and_vary_entries_survive_restart_and_kill_9(sluice_factory, origin, tmp_path):
    # The disk is the store: a 12-byte response, a 3 MiB one and two Vary variants of one URL
    # are all written to disk; after a restart (SIGTERM, then kill -9) every one is a hit,
    # `detail=disk` first, then `detail=memory` for the small ones once promoted.
    directory = tmp_path / "disk"
    config = {"cache_store": {"memory": "1MiB", "disk": {"path": str(directory), "size": "64MiB"}}}
    tiny = origin.set("/tiny", headers={"Cache-Control": "max-age=300"}, body=b"twelve bytes")
    big_body = body_of(3 * MiB, seed=21)
    big = origin.set("/big", headers={"Cache-Control": "max-age=300"}, body=big_body)
    lang = origin.url("/lang")
    proxy = sluice_factory(config)
    for language in ("en", "fr"):
        origin.set("/lang", headers={"Cache-Control": "max-age=300", "Vary": "Accept-Language"},
                   body=f"hello in {language}".encode())
        assert get(proxy, lang, {"Accept-Language": language}).content == f"hello in {language}".encode()
    assert get(proxy, tiny).content == b"twelve bytes"
    assert sha(get(proxy, big).content) == sha(big_body)
    hit = get(proxy, tiny)
    assert "detail=memory" in hit.headers["Cache-Status"], hit.headers
    assert "detail=disk" in get(proxy, big).headers["Cache-Status"]
    counts = {p: origin.count(p) for p in ("/tiny", "/big", "/lang")}
    assert counts == {"/tiny": 1, "/big": 1, "/lang": 2}, counts

    def served_after(restarted):
        first = get(restarted, tiny)
        assert first.content == b"twelve bytes" and "detail=disk" in first.headers["Cache-Status"], first.headers
        again = get(restarted, tiny)
        assert again.content == b"twelve bytes" and "detail=memory" in again.headers["Cache-Status"], again.headers
        for language in ("fr", "en"):
            r = get(restarted, lang, {"Accept-Language": language})
            assert r.content == f"hello in {language}".encode(), (language, r.content)
            assert "detail=disk" in r.headers["Cache-Status"], r.headers
            r = get(restarted, lang, {"Accept-Language": language})
            assert "detail=memory" in r.headers["Cache-Status"], r.headers
        large = get(restarted, big)
        assert sha(large.content) == sha(big_body) and "detail=disk" in large.headers["Cache-Status"]
        assert {p: origin.count(p) for p in counts} == counts, "an entry stored before the restart was refetched"

    proxy.expected_exit = True
    proxy.stop()
    restarted = sluice_factory(config, name="restarted")
    served_after(restarted)
    restarted.expected_exit = True
    os.kill(restarted.pid, signal.SIGKILL)
    restarted.proc.wait(timeout=10)
    served_after(sluice_factory(config, name="after-kill"))


def test_kill_9_during_a_200_mib_store_leaves_a_whole_entry_or_a_miss(sluice_factory, origin, tmp_path):
    directory = tmp_path / "disk"
    body = body_of(200 * MiB, seed=3)
    digest = sha(body)
    url = origin.set("/huge", headers={"Cache-Control": "max-age=600"}, body=body)
    config = store_config(directory, size="512MiB", max_object="256MiB")
    outcomes = []
    deadline = time.monotonic() + 120
    # Three kills at random points of the store, then one after it completed (a whole entry).
    for round_ in range(4):
        last = round_ == 3
        if time.monotonic() > deadline:
            break
        proxy = sluice_factory(config, name=f"round{round_}")

        def fetch():
            try:
                with requests.get(url, proxies={"http": proxy.url}, stream=True, timeout=30) as r:
                    for _ in r.iter_content(1 << 20):
                        pass
            except requests.RequestException:
                pass

        t = threading.Thread(target=fetch, daemon=True)
        t.start()
        if last:
            t.join(timeout=60)
            # the commit (the record's rename to <key>.meta) follows the last byte sent to the client
            assert wait_until(lambda: any(p.name.endswith(".meta") for p in directory.iterdir()), 15), \
                "the completed store was not committed"
        else:
            # time passing: the kill lands at a random point of the 200 MiB store
            time.sleep(random.uniform(0.2, 1.5))
        proxy.expected_exit = True
        os.kill(proxy.pid, signal.SIGKILL)
        proxy.proc.wait(timeout=10)
        t.join(timeout=30)
        check = sluice_factory(config, name=f"check{round_}")
        r = get(check, url, {"Cache-Control": "only-if-cached"}, timeout=60)
        if r.status_code == 200:
            assert sha(r.content) == digest, "a torn or mixed entry was served after kill -9"
            outcomes.append("whole")
        else:
            assert r.status_code == 504, r.status_code
            outcomes.append("miss")
            assert not last, "a store that completed before kill -9 was lost"
        check.expected_exit = True
        check.stop()
        # No temporaries survive a start: the scan removed them.
        assert not [p for p in directory.iterdir() if p.name.endswith(".tmp")]
    assert len(outcomes) >= 2, "too few rounds ran"
    print("kill -9 rounds:", outcomes)


def test_disk_tier_stays_within_its_size(sluice_factory, origin, tmp_path):
    directory = tmp_path / "disk"
    proxy = sluice_factory(store_config(directory, size="8MiB", max_object="4MiB"))
    bodies = {}
    for i in range(8):
        bodies[i] = body_of(2 * MiB, seed=10 + i)
        url = origin.set(f"/o{i}", headers={"Cache-Control": "max-age=600"}, body=bodies[i])
        assert sha(get(proxy, url).content) == sha(bodies[i])
        assert dir_bytes(directory) <= 8 * MiB, f"the disk tier holds {dir_bytes(directory)} bytes"
    last = get(proxy, origin.url("/o7"))
    assert sha(last.content) == sha(bodies[7]) and origin.count("/o7") == 1, "the newest entry was evicted"
    first = get(proxy, origin.url("/o0"))
    assert sha(first.content) == sha(bodies[0]) and origin.count("/o0") == 2, "the oldest entry was not evicted"


def test_unusable_directory_is_a_config_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    config = tmp_path / "bad.yaml"
    config.write_text(f"cache_store:\n  memory: 1MiB\n  disk:\n    path: {blocker}/cache\n    size: 1GiB\n")
    r = subprocess.run([SLUICE_BIN, "check", "--config", str(config)], capture_output=True, text=True, timeout=30)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert f"{config}:4:" in out and str(blocker) in out and "Not a directory" in out, out
    ok = tmp_path / "ok.yaml"
    ok.write_text(f"cache_store:\n  memory: 1MiB\n  disk: {{ path: {tmp_path}/cache, size: 1MiB }}\n  max_object_size: 2MiB\n")
    r = subprocess.run([SLUICE_BIN, "check", "--config", str(ok)], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "larger than cache_store.disk.size" in r.stdout + r.stderr


def test_directory_in_use_refuses_a_second_process(sluice_factory, tmp_path):
    directory = tmp_path / "disk"
    first = sluice_factory(store_config(directory))
    config = yaml.safe_load(first.config_path.read_text())
    config["listen"] = [f"127.0.0.1:{pick_port()}"]
    second = tmp_path / "second.yaml"
    second.write_text(yaml.safe_dump(config))
    r = subprocess.run([SLUICE_BIN, "run", "--config", str(second)], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "in use by another process" in r.stderr and str(directory) in r.stderr, r.stderr
    assert first.alive()


@pytest.fixture
def tiny_tmpfs():
    """A 2 MiB tmpfs (real ENOSPC); skipped where this process may not mount one."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    mount_point = Path(tempfile.mkdtemp(prefix="sluice-tmpfs-"))
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0755", "tmpfs", str(mount_point)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        mount_point.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=False)
        mount_point.rmdir()


def test_full_disk_keeps_serving_and_logs_once(sluice_factory, origin, tiny_tmpfs):
    admin = pick_port()
    proxy = sluice_factory({**store_config(tiny_tmpfs / "cache", size="64MiB", max_object="8MiB"),
                            "monitors": [{"metrics": {}}], "admin": {"listen": f"127.0.0.1:{admin}"}})
    bodies = [body_of(1536 * 1024, seed=20 + i) for i in range(4)]
    for i, body in enumerate(bodies):
        url = origin.set(f"/f{i}", headers={"Cache-Control": "max-age=600"}, body=body)
        for _ in range(2):
            assert sha(get(proxy, url).content) == sha(body)
    # Every write that failed is counted (docs/metrics.md): f1, f2 and f3, twice each (each
    # request was a miss that tried to store its response).
    metrics = requests.get(f"http://127.0.0.1:{admin}/metrics", timeout=5).text
    failed = [line for line in metrics.splitlines() if line.startswith("sluice_cache_disk_write_failures_total ")]
    assert failed == ["sluice_cache_disk_write_failures_total 6"], failed
    proxy.expected_exit = True
    proxy.stop()  # flushes the log, and lets the tmpfs be unmounted
    log = proxy.err_path.read_text() + proxy.out_path.read_text()
    failures = [line for line in log.splitlines() if "disk cache" in line and "cannot" in line]
    assert len(failures) == 1, log
    assert "ENOSPC" in failures[0]
    assert origin.count("/f0") == 1, "the entry that fit was not served from disk"
    assert origin.count("/f3") == 2, "an entry that did not fit was served from the cache"


def test_304_update_of_a_disk_entry_survives_restart(sluice_factory, origin, tmp_path):
    directory = tmp_path / "disk"
    body = body_of(512 * 1024, seed=5)
    url = origin.set("/v", headers={"Cache-Control": "max-age=1", "ETag": '"v1"'}, body=body)
    proxy = sluice_factory(store_config(directory))
    assert sha(get(proxy, url).content) == sha(body)
    time.sleep(2.2)  # time passing: max-age=1 runs out, the entry is stale
    origin.set("/v", headers={"Cache-Control": "max-age=600", "ETag": '"v1"', "X-Version": "2"}, body=body)
    validated = get(proxy, url)
    assert sha(validated.content) == sha(body) and validated.headers.get("X-Version") == "2"
    assert "fwd-status=304" in validated.headers["Cache-Status"], validated.headers
    assert origin.count("/v") == 2
    proxy.expected_exit = True
    proxy.stop()
    again = sluice_factory(store_config(directory), name="restarted")
    after = get(again, url)
    assert sha(after.content) == sha(body) and after.headers.get("X-Version") == "2"
    assert after.headers["Cache-Status"].startswith("Sluice; hit"), after.headers
    assert origin.count("/v") == 2, "the updated entry was not fresh after the restart"


def test_invalidation_removes_the_disk_entry(sluice_factory, origin, tmp_path):
    directory = tmp_path / "disk"
    body = body_of(400 * 1024, seed=6)
    url = origin.set("/inv", headers={"Cache-Control": "max-age=600"}, body=body)
    proxy = sluice_factory(store_config(directory))
    get(proxy, url)
    assert get(proxy, url, {"Cache-Control": "only-if-cached"}).status_code == 200
    assert get(proxy, url, method="POST").status_code == 200
    assert get(proxy, url, {"Cache-Control": "only-if-cached"}).status_code == 504, "the disk entry survived a POST"
    assert not [p for p in directory.iterdir() if p.name.endswith(".meta")]
    assert origin.count("/inv") == 2


def test_large_disk_hit_to_a_slow_client_does_not_block_others(sluice_factory, origin, tmp_path):
    directory = tmp_path / "disk"
    body = body_of(12 * MiB, seed=7)
    url = origin.set("/slow", headers={"Cache-Control": "max-age=600"}, body=body)
    small = origin.set("/tiny", headers={"Cache-Control": "max-age=600"}, body=b"tiny")
    proxy = sluice_factory({**store_config(directory), "workers": 1})
    assert sha(get(proxy, url).content) == sha(body)
    rss_before = proxy.rss_kib()
    with requests.get(url, proxies={"http": proxy.url}, stream=True, timeout=60) as slow:
        slow.raw.read(64 * 1024)  # then stop reading: the client's window fills
        time.sleep(1.0)  # window: Sluice must not load the rest of the disk hit into memory, nor stall, in it
        started = time.monotonic()
        for _ in range(5):
            assert get(proxy, small, timeout=10).content == b"tiny"
        assert time.monotonic() - started < 8, "the worker's loop was blocked by the slow disk hit"
        assert proxy.rss_kib() - rss_before < 16 * 1024, "the disk hit was loaded into memory"
        rest = slow.raw.read()
    assert len(rest) + 64 * 1024 == len(body)


def test_corrupt_block_mid_body_closes_the_connection_and_is_logged(sluice_factory, origin, tmp_path):
    directory = tmp_path / "disk"
    log_path = tmp_path / "access.log"
    body = body_of(3 * MiB, seed=8)
    url = origin.set("/rot", headers={"Cache-Control": "max-age=600"}, body=body)
    proxy = sluice_factory({**store_config(directory), "monitors": monitors(access=log_path)})
    assert sha(get(proxy, url).content) == sha(body)
    [body_file] = [p for p in directory.iterdir() if p.name.endswith(".body")]
    with open(body_file, "r+b") as f:  # damage after the first blocks: found only when reached
        f.seek(2 * MiB + 5)
        byte = f.read(1)
        f.seek(2 * MiB + 5)
        f.write(bytes([byte[0] ^ 0xFF]))
    received = 0
    with pytest.raises(requests.exceptions.RequestException):
        with requests.get(url, proxies={"http": proxy.url}, stream=True, timeout=30) as r:
            assert r.headers["Content-Length"] == str(len(body))
            for piece in r.iter_content(1 << 16):
                received += len(piece)
    assert 0 < received < len(body), received
    lines = AccessLog(log_path).wait_for(lambda e: e.get("url") == url and e.get("outcome") == "error")
    assert "corrupt" in lines[-1].get("error", ""), lines[-1]
    # The entry was dropped: the next request goes to the origin and is whole again.
    assert sha(get(proxy, url).content) == sha(body) and origin.count("/rot") == 2
