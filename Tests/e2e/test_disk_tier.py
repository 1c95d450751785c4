"""The response cache's disk tier (`DiskCacheTier`) in a process of its own, through the
test-only `DiskTierProbe` built beside `sluice`: SIGKILL at random points during 200 MiB
stores never leaves a torn or mixed entry to serve (each restart serves the whole entry, sha256
checked, or a miss); write failures (a file-size limit, a full tmpfs, a directory the process
may not write) fail the store cleanly, are logged once per episode, and the tier works again
when writes succeed. The rest of the tier's behaviour is unit-tested
(Tests/SluiceServerTests/DiskCacheTierTests.swift)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import SLUICE_BIN

PROBE = str(Path(SLUICE_BIN).parent / "DiskTierProbe")
BIG = 200 * 1024 * 1024


@pytest.fixture(scope="module")
def probe() -> str:
    if not os.access(PROBE, os.X_OK):
        pytest.fail(f"DiskTierProbe not found at {PROBE}: build it (swift build -c release)", pytrace=False)
    return PROBE


def body_sha256(seed: int, size: int) -> str:
    """The probe's body for `seed` (see Sources/DiskTierProbe/main.swift), hashed."""
    base = bytes(range(256)) * 256
    h = hashlib.sha256()
    done, i = 0, 0
    while done < size:
        r = (seed * 7 + i) % 256
        block = (b"%08x%08x" % (seed & 0xFFFFFFFF, i)) + (base[r:] + base[:r])[16:]
        block = block[: size - done]
        h.update(block)
        done += len(block)
        i += 1
    return h.hexdigest()


def check(probe: str, directory: Path, *keys: str) -> tuple[dict, dict]:
    out = subprocess.run([probe, "check", str(directory), *keys], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    return {e["key"]: e for e in lines if "key" in e}, next(e["scan"] for e in lines if "scan" in e)


def assert_whole_or_miss(entry: dict, expected: dict[int, str]) -> int | None:
    """The entry is a miss (None) or whole: its declared length read in full, every block
    verified, and the sha256 of the body of the seed its metadata names. Returns the seed."""
    if not entry["hit"]:
        return None
    fields = dict(f.split("=") for f in entry["metadata"].split())
    seed, size = int(fields["seed"]), int(fields["size"])
    assert not entry["corrupt"], entry
    assert entry["length"] == entry["declared"] == size, entry
    if seed not in expected:
        expected[seed] = body_sha256(seed, size)
    assert entry["sha256"] == expected[seed], f"mixed or torn entry served: {entry}"
    return seed


@pytest.mark.heavy
@pytest.mark.deadline(300)
def test_kill9_during_200mib_stores_then_restart_serves_whole_entry_or_miss(probe, tmp_path):
    directory = tmp_path / "cache"
    expected: dict[int, str] = {}
    # An uninterrupted store first: the entry is served whole, and its duration scales the kills.
    started = time.monotonic()
    out = subprocess.run([probe, "store", str(directory), "big", str(BIG), "1", "1"], capture_output=True, text=True, timeout=120)
    duration = time.monotonic() - started
    assert out.returncode == 0 and "committed 1" in out.stdout, out.stdout + out.stderr
    entries, _ = check(probe, directory, "big")
    assert assert_whole_or_miss(entries["big"], expected) == 1

    rng = random.Random(int(os.environ.get("DISK_TIER_KILL_SEED", "9111")))
    outcomes = []
    previous = 1
    # The kills' window: the first store's duration, shortened after a round whose process had
    # finished before its kill (a loaded machine made the first store slow), so that kills land
    # mid-write however fast the stores run.
    window = duration
    for round_ in range(8):
        # Each process stores the key twice (a kill may land in a replacement), printing a
        # line after each commit; the kill comes at a random point of the two stores.
        seed = 10 * (round_ + 1)
        proc = subprocess.Popen([probe, "store", str(directory), "big", str(BIG), str(seed), "2"],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "opened"
        time.sleep(rng.uniform(0.0, 1.2 * window))  # time passing: the kill lands at a random point of the stores
        alive = proc.poll() is None
        if not alive:
            window *= 0.5
        proc.kill()
        printed = proc.communicate(timeout=30)[0]
        committed = [int(line.split()[1]) for line in printed.splitlines() if line.startswith("committed")]
        entries, scan = check(probe, directory, "big")
        served = assert_whole_or_miss(entries["big"], expected)
        # A committed entry is never lost: the restart serves the last commit printed (or the
        # previous round's), or the one in flight if the kill came between its commit and
        # its line.
        last = committed[-1] if committed else previous
        in_flight = None if len(committed) == 2 else (committed[-1] + 1 if committed else seed)
        assert served in (last, in_flight), (committed, previous, entries["big"])
        previous = served
        leftovers = sorted(p.name for p in directory.iterdir())
        assert not [n for n in leftovers if n.endswith(".tmp")], leftovers
        assert len(leftovers) == 2, leftovers  # the entry's record and body, nothing else
        outcomes.append((alive, committed, served, scan))
    print("kill rounds (alive at kill, committed, served seed, scan):", *outcomes, sep="\n  ")
    # The kills did land mid-write: some restart found a write in progress to remove.
    assert any(alive and scan["temporaries"] > 0 for alive, _, _, scan in outcomes), outcomes


def test_file_size_limit_fails_stores_logs_once_per_episode_and_recovers(probe, tmp_path):
    # RLIMIT_FSIZE 1 MiB (SIGXFSZ ignored): writes past it fail with EFBIG, the path ENOSPC takes.
    out = subprocess.run([probe, "fsize-limit", str(tmp_path / "cache")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    for i in range(3):
        assert f"big {i}: failed" in lines
    assert "small 0: committed" in lines and "small 1: committed" in lines and "big again: failed" in lines
    logs = [line for line in lines if line.startswith("LOG ")]
    # One line when the first episode starts, one when a commit ends it, one for the next episode.
    assert len(logs) == 3, logs
    assert "cannot write a body file" in logs[0] and "EFBIG" in logs[0] and "logged once" in logs[0]
    assert "writing again after 3 failed write(s)" in logs[1]
    assert "EFBIG" in logs[2]
    assert "usage 2 " in out.stdout
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.endswith(".tmp")]
    entries, _ = check(probe, tmp_path / "cache", "small0", "small1", "big0")
    assert assert_whole_or_miss(entries["small0"], {}) == 0 and assert_whole_or_miss(entries["small1"], {}) == 1
    assert not entries["big0"]["hit"]


@pytest.fixture
def tiny_tmpfs():
    """A 2 MiB tmpfs (real ENOSPC); skipped where this process may not mount one."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    mount_point = Path(tempfile.mkdtemp(prefix="sluice-tmpfs-"))
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0755", "tmpfs", str(mount_point)], capture_output=True, text=True)
    if r.returncode != 0:
        mount_point.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=False)
        mount_point.rmdir()


def test_full_disk_fails_stores_once_logged_and_serves_what_fits(probe, tiny_tmpfs):
    directory = tiny_tmpfs / "cache"
    out = subprocess.run([probe, "store", str(directory), "big", str(3 * 1024 * 1024), "1", "3"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines.count("failed 1") == 1 and "failed 3" in lines
    logs = [line for line in lines if line.startswith("LOG ")]
    assert len(logs) == 1 and "ENOSPC" in logs[0], logs
    assert not list(directory.iterdir())  # every failed store cleaned up after itself
    out = subprocess.run([probe, "store", str(directory), "small", "200000", "5", "1"], capture_output=True, text=True, timeout=60)
    assert "committed 5" in out.stdout, out.stdout
    entries, _ = check(probe, directory, "small", "big")
    assert assert_whole_or_miss(entries["small"], {}) == 5 and not entries["big"]["hit"]


def test_read_only_file_system_keeps_serving_what_is_stored(probe, tiny_tmpfs):
    directory = tiny_tmpfs / "cache"
    out = subprocess.run([probe, "store", str(directory), "kept", "300000", "3", "1"], capture_output=True, text=True, timeout=60)
    assert "committed 3" in out.stdout, out.stdout
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_tmpfs)], check=True)
    out = subprocess.run([probe, "store", str(directory), "new", "300000", "4", "2"], capture_output=True, text=True, timeout=60)
    lines = out.stdout.splitlines()
    assert "failed 4" in lines and "failed 5" in lines, out.stdout
    logs = [line for line in lines if line.startswith("LOG ")]
    assert len(logs) == 1 and "EROFS" in logs[0], logs
    entries, scan = check(probe, directory, "kept", "new")
    assert assert_whole_or_miss(entries["kept"], {}) == 3 and not entries["new"]["hit"]
    assert scan["kept"] == 1


def test_unwritable_directory_fails_stores_once_logged(probe):
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to run the probe as an unprivileged user")
    if any(not os.stat(p).st_mode & 0o001 for p in Path(PROBE).parents if p != Path("/")):
        pytest.skip("the probe's directory is not reachable by an unprivileged user")
    parent = Path(tempfile.mkdtemp(prefix="sluice-ro-"))
    try:
        os.chmod(parent, 0o755)
        (parent / "cache").mkdir(mode=0o755)  # root's; nobody may read it, not write it
        out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", probe, "store",
                              str(parent / "cache"), "k", "100000", "1", "2"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        lines = out.stdout.splitlines()
        assert "failed 1" in lines and "failed 2" in lines
        logs = [line for line in lines if line.startswith("LOG ")]
        assert len(logs) == 1 and "EACCES" in logs[0], logs
        # A directory that cannot be created is an error at open.
        out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", probe, "store",
                              str(parent / "cache" / "sub"), "k", "1", "1", "1"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and "OPEN-ERROR cannot create the cache directory" in out.stdout, out.stdout
        assert "Permission denied" in out.stdout
    finally:
        shutil.rmtree(parent)
