"""What /proc says about the processes the benchmark started and about the machine: process trees,
their CPU ticks, RSS and descriptors, the CPU taken by everything else ("other load"), and the
machine's description for the result file."""

from __future__ import annotations

import os
import platform
import resource
import time
from pathlib import Path

from . import stats

CLOCK_HZ = os.sysconf("SC_CLK_TCK")


def _stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after "pid (comm) ": [0] is the state (field 3), [1] the parent,
    [11]/[12] utime/stime, [13]/[14] cutime/cstime, [19] the start time."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(") ") + 2:].split()


def _all_stats() -> dict[int, list[str]]:
    result = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(entry)
            if fields:
                result[int(entry)] = fields
    return result


def tree(root: int, table: dict[int, list[str]] | None = None) -> list[int]:
    """root and all its descendants (nginx's master and workers, squid's kids, ...)."""
    table = table if table is not None else _all_stats()
    children: dict[int, list[int]] = {}
    for pid, fields in table.items():
        children.setdefault(int(fields[1]), []).append(pid)
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in table or pid == root:
            found.append(pid)
            todo.extend(children.get(pid, []))
    return found


def start_time(pid: int) -> str | None:
    """A process's start time: tells a pid from a later reuse of the same number."""
    fields = _stat(pid)
    return fields[19] if fields else None


def cpu_ticks(root: int) -> int:
    """utime+stime of a whole process tree, in clock ticks (CLOCK_HZ per second)."""
    total = 0
    for pid in tree(root):
        fields = _stat(pid)
        if fields:
            total += int(fields[11]) + int(fields[12])
    return total


def rss_kib(root: int) -> int:
    """VmRSS summed over a process tree (pages shared between its processes count more than once)."""
    return sum(_vmrss(pid) for pid in tree(root))


def _vmrss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def rss_of(pids: list[int]) -> int:
    """VmRSS summed over fixed pids: the fast path of the 25 ms sampler."""
    return sum(_vmrss(pid) for pid in pids)


def fd_count(root: int) -> int:
    """Open descriptors of a process tree."""
    total = 0
    for pid in tree(root):
        try:
            total += len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            pass
    return total


def machine_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of all cores since boot, from /proc/stat's "cpu" line; busy leaves
    out idle and iowait."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    total = sum(values)
    return total - values[3] - values[4], total


def _others() -> tuple[dict[str, tuple[int, str]], int]:
    """Every process that is not the benchmark's: {"pid:starttime": (ticks, comm)}, where ticks is
    utime+stime+cutime+cstime (so a compiler that ran and was reaped in between still shows, in its
    parent's cutime); and the same sum over the benchmark's own processes."""
    table = _all_stats()
    ours = set(tree(os.getpid(), table))
    others, our_ticks = {}, 0
    for pid, f in table.items():
        ticks = int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])
        if pid in ours:
            our_ticks += ticks
        else:
            others[f"{pid}:{f[19]}"] = (ticks, _comm(pid))
    return others, our_ticks


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


class LoadWindow:
    """CPU bookkeeping around one measured run: the ticks each watched process tree used, and the
    share of the machine that processes the benchmark did not start took meanwhile ("other load":
    a build, a test suite; above a few % the run is noise)."""

    def __init__(self, watched: dict[str, int]):
        self.watched = watched
        self.ticks: dict[str, int] = {}
        self.other_pct = 0
        self.top: list[tuple[int, str]] = []

    def __enter__(self):
        self._machine = machine_ticks()
        self._others, self._ours = _others()
        self._watch = {name: cpu_ticks(pid) for name, pid in self.watched.items()}
        return self

    def __exit__(self, *exc):
        self.ticks = {name: cpu_ticks(pid) - self._watch[name] for name, pid in self.watched.items()}
        others, ours = _others()
        busy1, total1 = machine_ticks()
        deltas = []
        for key, (ticks, comm) in others.items():
            delta = ticks - self._others.get(key, (0, ""))[0]
            if delta > 0:
                deltas.append((delta, comm))
        self.top = sorted(deltas, reverse=True)[:5]
        self.other_pct = stats.other_load_pct(
            sum(d for d, _ in deltas), busy1 - self._machine[0], ours - self._ours, total1 - self._machine[1])
        return False


def other_load_now(seconds: float = 1.0) -> tuple[int, list[tuple[int, str]]]:
    """Other load over the next `seconds`, and the busiest other processes."""
    with LoadWindow({}) as window:
        time.sleep(seconds)
    return window.other_pct, window.top


def raise_open_files(limit: int = 65536) -> int:
    """Raises the soft limit on open files to the hard one (at most `limit`); the proxies and
    clients started later inherit it. Returns the limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, limit) if hard != resource.RLIM_INFINITY else limit
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def machine() -> dict:
    """The machine a run was measured on: CPU model, cores, kernel, memory, OS."""
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_kib = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            memory_kib = int(line.split()[1])
    os_name = "?"
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                os_name = line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return {"cpu_model": model, "cores": os.cpu_count(), "kernel": platform.release(),
            "memory_mib": memory_kib // 1024, "os": os_name, "clock_hz": CLOCK_HZ}
