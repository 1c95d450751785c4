"""The arithmetic of the benchmark and the parsers of the tools' output: pure functions, no I/O."""

from __future__ import annotations


def median_round(rounds: list[dict], key: str = "rps") -> dict | None:
    """The round whose `key` is the median of all rounds that have one (with an even count, the
    lower of the two middle ones), or None. The whole round is returned, so that the latency, CPU
    per request and other load reported beside the median belong to one and the same run."""
    usable = sorted((r for r in rounds if r.get(key) is not None), key=lambda r: r[key])
    return usable[(len(usable) - 1) // 2] if usable else None


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing or b is zero: "ratio to direct" of a proxy's figure."""
    if a is None or b is None or b == 0:
        return None
    return a / b


def per_request(total: float | None, requests: int | None) -> float | None:
    """A total (CPU µs, system calls, instructions) divided by the requests it served, or None."""
    if total is None or not requests:
        return None
    return total / requests


def cpu_us_per_request(ticks: int, clock_hz: int, requests: int) -> float | None:
    """CPU time per request in µs: utime+stime clock ticks of a process tree over a run divided by
    the requests completed in that run."""
    return per_request(ticks * 1e6 / clock_hz, requests)


def other_load_pct(others: int, busy: int, ours: int, total: int) -> int:
    """Share (%) of the whole machine's CPU that processes not started by the benchmark used during
    a window. Two estimates, each too high in its own way, of which the smaller is kept: `others`,
    the summed CPU ticks of every other process (a parent that reaps a long-lived child is charged
    all of that child's time at once), and `busy - ours`, what the machine was busy with minus the
    benchmark's own processes (softirq time charged to nobody lands here). `total` is every tick
    of every core in the window."""
    if total <= 0:
        return 0
    return round(min(others, max(busy - ours, 0)) * 100 / total)


def parse_wrk(text: str) -> dict | None:
    """The BENCH_RESULT line that absolute.lua prints at the end of a wrk run, as numbers:
    requests, duration_us, bytes, p50_us, p99_us and err_{connect,read,write,status,timeout};
    with `rps` (requests per second of wall time) added. None when wrk printed no such line."""
    for line in text.splitlines():
        if line.startswith("BENCH_RESULT "):
            fields = dict(kv.split("=", 1) for kv in line.split()[1:])
            result = {k: int(v) for k, v in fields.items()}
            result["rps"] = round(result["requests"] / (result["duration_us"] / 1e6)) if result["duration_us"] else 0
            return result
    return None


def wrk_errors(result: dict) -> dict:
    """The non-zero error counts of a parsed wrk result: socket errors and HTTP statuses > 399."""
    kinds = ("connect", "read", "write", "status", "timeout")
    return {k: result[f"err_{k}"] for k in kinds if result.get(f"err_{k}", 0) > 0}


def parse_strace_summary(text: str) -> tuple[int | None, list[tuple[str, int]]]:
    """`strace -c -S calls` output: the total number of calls and (syscall, calls) of every row,
    busiest first. Rows are "% time  seconds  usecs/call  calls  [errors]  syscall"."""
    total, rows, body = None, [], False
    for line in text.splitlines():
        parts = line.split()
        if line.startswith("-"):
            body = True
            continue
        if not body or len(parts) < 5:
            continue
        if parts[-1] == "total":
            total = int(parts[3])
        elif parts[3].isdigit():
            rows.append((parts[-1], int(parts[3])))
    return total, rows


def parse_callgrind_total(text: str) -> int | None:
    """The total instruction count (Ir) of a callgrind output file: its `totals:` line, or its
    `summary:` line when there is no totals line."""
    summary = None
    for line in text.splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
        if line.startswith("summary:"):
            summary = int(line.split()[1])
    return summary


def growth_first_last(values: list[int]) -> tuple[int, int] | None:
    """Soak growth: (median of the first three, median of the last three) samples, or None with fewer
    than six: one noisy sample at either end cannot make or hide a leak."""
    if len(values) < 6:
        return None
    return sorted(values[:3])[1], sorted(values[-3:])[1]


def parse_commandstats(text: str) -> dict[str, dict[str, int]]:
    """Redis's `INFO commandstats`: one line per command that ran,
    "cmdstat_evalsha:calls=3,usec=120,usec_per_call=40.00,rejected_calls=0,failed_calls=0", as
    {"evalsha": {"calls": 3, "usec": 120, "rejected_calls": 0, "failed_calls": 0}} (integers
    only; subcommands such as "cmdstat_client|setname" keep their name)."""
    commands = {}
    for line in text.splitlines():
        if not line.startswith("cmdstat_"):
            continue
        name, _, fields = line[len("cmdstat_"):].partition(":")
        values = {}
        for field in fields.strip().split(","):
            key, _, value = field.partition("=")
            if value.isdigit():
                values[key] = int(value)
        commands[name] = values
    return commands


def redis_calls(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, int]:
    """The round trips Redis answered between two `INFO commandstats` readings: {"evalsha": N,
    "eval": N (a script sent whole after NOSCRIPT), "script_load": N (on each new connection),
    "round_trips": evalsha + eval, "failed": failed or rejected calls of any command}. Only these
    count as round trips: commandstats also counts the commands the scripts call inside Redis
    (TIME, GET, ZADD ...), and the INFO readings themselves are left out."""
    def delta(name: str, key: str = "calls") -> int:
        return after.get(name, {}).get(key, 0) - before.get(name, {}).get(key, 0)
    evalsha, eval_ = delta("evalsha"), delta("eval")
    return {"evalsha": evalsha, "eval": eval_, "script_load": delta("script|load"), "round_trips": evalsha + eval_,
            "failed": sum(delta(n, "failed_calls") + delta(n, "rejected_calls") for n in after)}
