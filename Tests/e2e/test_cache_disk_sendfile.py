"""Disk hits sent by the kernel (docs/caching.md "Tiers"): a plain-http client's disk hit goes
from the body file to the socket with sendfile(2) (`sluice_cache_disk_sendfile_bytes_total`),
each block verified the first time this process sends it and again only after its file changes
(`sluice_cache_disk_verified_bytes_total`), and a block damaged on disk is never served as good
— changed in place (same inode, its ctime moves), the file replaced (a new inode), or damaged
while Sluice was stopped. A record Sluice keeps decoded in memory is read and verified again
once its file changes behind the process."""

from __future__ import annotations

import hashlib
import os
import struct
import time
from pathlib import Path

import requests

from cache_origin import CountingOrigin
from faultservers import pick_port
from policy_support import AccessLog, monitors
from test_cache_disk import body_of, get, origin, sha, store_config  # noqa: F401 (origin: a fixture)

MiB = 1024 * 1024
SENDFILE = "sluice_cache_disk_sendfile_bytes_total"
VERIFIED = "sluice_cache_disk_verified_bytes_total"
# A body file's verification is remembered once its last change is a second old.
SETTLE = 1.2


def start(sluice_factory, directory: Path, log_path: Path | None = None, name: str | None = None):
    admin_port = pick_port()
    config = {**store_config(directory), "admin": {"listen": f"127.0.0.1:{admin_port}"}}
    if log_path is not None:
        config["monitors"] = monitors(access=log_path)
    proxy = sluice_factory(config, name=name) if name else sluice_factory(config)
    proxy.admin_port = admin_port
    return proxy


def counters(proxy) -> tuple[int, int]:
    text = requests.get(f"http://127.0.0.1:{proxy.admin_port}/metrics", timeout=10).text
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in (SENDFILE, VERIFIED):
            values[name] = int(float(value))
    return values.get(SENDFILE, 0), values.get(VERIFIED, 0)


def fetch(proxy, url) -> tuple[bytes, bool]:
    """The body bytes received and whether the response ended whole (its Content-Length)."""
    received = b""
    try:
        with requests.get(url, proxies={"http": proxy.url}, stream=True, timeout=30) as r:
            for piece in r.iter_content(1 << 16):
                received += piece
            return received, len(received) == int(r.headers["Content-Length"])
    except requests.exceptions.RequestException:
        return received, False


def body_file(directory: Path) -> Path:
    [path] = [p for p in directory.iterdir() if p.name.endswith(".body")]
    return path


def record_file(directory: Path) -> Path:
    [path] = [p for p in directory.iterdir() if p.name.endswith(".meta")]
    return path


def resealed(record: bytes, old: bytes, new: bytes) -> bytes:
    """The record with `old` in its stored head replaced by `new` (same length) and its seal (the
    SHA-256 of everything before it) computed again: a valid record with another head."""
    key_length, metadata_length = struct.unpack_from("<II", record, 16)
    start = 80 + key_length
    metadata = record[start:start + metadata_length]
    assert len(old) == len(new) and metadata.count(old) == 1, metadata
    sealed = record[:start] + metadata.replace(old, new)
    return sealed + hashlib.sha256(sealed).digest()


def damage_in_place(path: Path, at: int):
    inode = path.stat().st_ino
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert path.stat().st_ino == inode


def replace_damaged(path: Path, at: int):
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    fresh = path.with_name(path.name + ".swap")
    fresh.write_bytes(bytes(data))
    inode = path.stat().st_ino
    os.replace(fresh, path)
    assert path.stat().st_ino != inode


def assert_never_served_as_good(proxy, url, body: bytes, log_path: Path):
    received, whole = fetch(proxy, url)
    assert not whole, "a damaged disk entry was served as a whole response"
    assert body.startswith(received), "bytes of the damaged block reached the client"
    lines = AccessLog(log_path).wait_for(lambda e: e.get("url") == url and e.get("outcome") == "error")
    assert "corrupt" in lines[-1].get("error", ""), lines[-1]


def test_a_plain_http_disk_hit_is_sent_by_the_kernel_and_verified_once(sluice_factory, origin, tmp_path):
    directory = tmp_path / "disk"
    body = body_of(3 * MiB, seed=11)
    url = origin.set("/kernel", headers={"Cache-Control": "max-age=600"}, body=body)
    proxy = start(sluice_factory, directory)
    assert sha(get(proxy, url).content) == sha(body)
    assert counters(proxy) == (0, 0), "a miss is not a disk hit"
    time.sleep(SETTLE)  # time passing: a verification is remembered once the file is a second old
    hit = get(proxy, url)
    assert sha(hit.content) == sha(body) and "detail=disk" in hit.headers["Cache-Status"], hit.headers
    assert counters(proxy) == (len(body), len(body)), (
        "sluice_cache_disk_sendfile_bytes_total: the hit's body; sluice_cache_disk_verified_bytes_total: "
        "the first hit verifies every block it sends")
    for n in (2, 3):
        assert sha(get(proxy, url).content) == sha(body)
        assert counters(proxy) == (n * len(body), len(body)), "a block is verified once while its file is unchanged"
    ranged = get(proxy, url, {"Range": "bytes=1000000-1000099"})
    assert ranged.status_code == 206 and ranged.content == body[1000000:1000100]
    assert counters(proxy) == (3 * len(body) + 100, len(body))
    assert origin.count("/kernel") == 1


def test_a_block_damaged_in_place_while_running_is_never_served_as_good(sluice_factory, origin, tmp_path):
    directory = tmp_path / "disk"
    log_path = tmp_path / "access.log"
    body = body_of(3 * MiB, seed=12)
    url = origin.set("/in-place", headers={"Cache-Control": "max-age=600"}, body=body)
    proxy = start(sluice_factory, directory, log_path)
    get(proxy, url)
    time.sleep(SETTLE)  # time passing: a verification is remembered once the file is a second old
    assert sha(get(proxy, url).content) == sha(body)
    verified = counters(proxy)[1]
    assert verified == len(body)
    damage_in_place(body_file(directory), 2 * MiB + 5)  # same inode; its ctime moves
    assert_never_served_as_good(proxy, url, body, log_path)
    assert counters(proxy)[1] > verified, "the changed file's blocks were not verified again"
    # The entry was dropped: the next request goes to the origin and is whole again.
    assert sha(get(proxy, url).content) == sha(body) and origin.count("/in-place") == 2


def test_a_body_file_replaced_behind_the_tier_is_never_served_as_good(sluice_factory, origin, tmp_path):
    directory = tmp_path / "disk"
    log_path = tmp_path / "access.log"
    body = body_of(3 * MiB, seed=13)
    url = origin.set("/replaced", headers={"Cache-Control": "max-age=600"}, body=body)
    proxy = start(sluice_factory, directory, log_path)
    get(proxy, url)
    time.sleep(SETTLE)  # time passing: a verification is remembered once the file is a second old
    assert sha(get(proxy, url).content) == sha(body)
    replace_damaged(body_file(directory), 100)  # a new inode, damaged in its first block
    assert_never_served_as_good(proxy, url, body, log_path)
    assert sha(get(proxy, url).content) == sha(body) and origin.count("/replaced") == 2


def test_a_block_damaged_while_stopped_is_never_served_as_good_after_a_restart(sluice_factory, origin, tmp_path):
    directory = tmp_path / "disk"
    log_path = tmp_path / "access.log"
    body = body_of(3 * MiB, seed=14)
    url = origin.set("/restart", headers={"Cache-Control": "max-age=600"}, body=body)
    proxy = start(sluice_factory, directory)
    get(proxy, url)
    time.sleep(SETTLE)  # time passing: a verification is remembered once the file is a second old
    assert sha(get(proxy, url).content) == sha(body)
    proxy.expected_exit = True
    proxy.stop()
    damage_in_place(body_file(directory), 3 * MiB - 7)  # the last block
    again = start(sluice_factory, directory, log_path, name="restarted")
    assert_never_served_as_good(again, url, body, log_path)
    assert sha(get(again, url).content) == sha(body) and origin.count("/restart") == 2


def test_a_record_changed_behind_the_process_is_read_and_verified_again(sluice_factory, origin, tmp_path):
    directory = tmp_path / "disk"
    body = body_of(2 * MiB, seed=15)
    url = origin.set("/record", headers={"Cache-Control": "max-age=600", "X-Edition": "first"}, body=body)
    proxy = start(sluice_factory, directory)
    get(proxy, url)
    time.sleep(SETTLE)  # time passing: a verification is remembered once the file is a second old
    for _ in range(2):  # the first hit reads, verifies and keeps the record; the second uses it
        hit = get(proxy, url)
        assert sha(hit.content) == sha(body) and "detail=disk" in hit.headers["Cache-Status"], hit.headers
        assert hit.headers["X-Edition"] == "first"
    # A valid record with another head, written in place (same inode, its ctime moves): the
    # new head is served, so the record kept in memory was not.
    path = record_file(directory)
    rewritten = resealed(path.read_bytes(), b"first", b"third")
    inode = path.stat().st_ino
    with open(path, "r+b") as f:
        f.write(rewritten)
    assert path.stat().st_ino == inode
    hit = get(proxy, url)
    assert "detail=disk" in hit.headers["Cache-Status"] and hit.headers["X-Edition"] == "third", hit.headers
    assert sha(hit.content) == sha(body)
    time.sleep(SETTLE)  # time passing: a verification is remembered once the file is a second old
    assert get(proxy, url).headers["X-Edition"] == "third"
    # A damaged record (its seal fails) is a miss: the entry is dropped and fetched again.
    damage_in_place(path, 80 + 10)
    miss = get(proxy, url)
    assert sha(miss.content) == sha(body) and "fwd=uri-miss" in miss.headers["Cache-Status"], miss.headers
    assert miss.headers["X-Edition"] == "first" and origin.count("/record") == 2
