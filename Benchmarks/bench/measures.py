"""The measures of a scenario. Each takes the running benchmark (runner.Bench), measures every
target it applies to, and returns what goes into the result file under its name."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from . import clients, fleetcache, procfs, stats
from .servers import (FLEET_TARGETS, RELOADED_HEADER, SLUICE_TARGETS, helper_of, kind, port_open, redis_commandstats,
                      nginx_callgrind_conf, sluice_yaml, wait_port)

LUA = Path(__file__).resolve().parent.parent / "absolute.lua"


def load_env(bench, target: str, body: str) -> dict[str, str]:
    """The environment of a wrk run through absolute.lua: the request target, the Host, and the
    scenario's `headers` (one "Name: value" per line in BENCH_HEADERS)."""
    return {**os.environ, "BENCH_PATH": bench.request_target(target, body), "BENCH_HOST": bench.lab.origin_host,
            "BENCH_HEADERS": "".join(f"{name}: {value}\n" for name, value in bench.scenario["headers"].items())}


def wrk(bench, target: str, connections: int, seconds: float, body: str) -> tuple[dict | None, str]:
    """One wrk run of GETs for `body` (PUTs for `put…`) against a target (the origin itself for direct) on
    `connections` kept-alive connections: (parsed BENCH_RESULT or None, wrk's output)."""
    sc = bench.scenario
    threads = min(sc["threads"], connections)
    env = load_env(bench, target, body)
    if body.startswith("put"):
        # `put64k`: PUTs of a 64 KiB body (the plain origin's /put answers 204)
        env.update(BENCH_METHOD="PUT", BENCH_BODY_BYTES=str(int(body[3:].rstrip("k")) * 1024))
    cmd = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--timeout", sc["wrk_timeout"],
           "--latency", "-s", str(LUA), f"http://127.0.0.1:{bench.port(target)}/"]
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=seconds + 30)
    except subprocess.TimeoutExpired:
        return None, "wrk did not finish in time"
    output = done.stdout + done.stderr
    return stats.parse_wrk(output), output


# ---------------------------------------------------------------------------------------------

def warm_up(bench):
    """Unmeasured load, `warmup` seconds at 16 connections per target: one-time allocations
    (pools, thread caches) are behind every target before anything is measured."""
    seconds = bench.scenario["warmup"]
    if seconds <= 0:
        return
    bench.log(f"warm-up: {seconds} s at 16 connections per target")
    for t in bench.active():
        wrk(bench, t, 16, seconds, bench.bodies()[0])
    time.sleep(bench.scenario["pause"])


def idle_clients(bench) -> dict:
    """RSS growth with idle clients: after the warm-up, N kept-alive connections each send one GET,
    read the response and stay open; the proxy's RSS 1 s later minus its RSS just before (the peak
    while they are held `hold` seconds, when hold > 0), and its descriptors. With a hold, also the
    RSS and descriptors 3 s after the clients left and how many were still open at the end."""
    p = bench.scenario["idle_clients"]
    out = {}
    for t in bench.proxies():
        pid = bench.procs[t].pid
        time.sleep(bench.scenario["pause"])
        before, fds_before = procfs.rss_kib(pid), procfs.fd_count(pid)
        idle = clients.IdleClients(bench.port(t), p["clients"], bench.request_target(t, "1k"),
                                   bench.lab.origin_host, p["batch"], p["sources"], 120 + p["hold"])
        try:
            idle.open()
            time.sleep(1)                    # the proxy finishes with the last responses
            held, fds_held = procfs.rss_kib(pid), procfs.fd_count(pid)
            peak = held
            for _ in range(p["hold"]):
                time.sleep(1)
                peak = max(peak, procfs.rss_kib(pid))
            still_open = idle.still_open() if p["hold"] else None
            answered = len(idle.held)
        finally:
            idle.close()
        row = {"clients": p["clients"], "answered": answered, "failed": idle.failed,
               "first_error": idle.first_error or None, "rss_before_kib": before, "rss_held_kib": held,
               "rss_peak_kib": peak, "growth_kib": peak - before, "fds_before": fds_before, "fds_held": fds_held}
        if p["hold"]:
            time.sleep(3)
            row.update(still_open=list(still_open), rss_released_kib=procfs.rss_kib(pid),
                       fds_released=procfs.fd_count(pid))
        bench.log(f"{t:16} {p['clients']} idle clients: RSS {before} -> {peak} KiB ({answered} answered)")
        out[t] = row
    return out


def throughput(bench) -> list[dict]:
    """wrk against every target for each load (body x connection count), `rounds` rounds
    interleaved: round 1 of every target, then round 2 ..., so that drift in the machine hits all
    of them alike. Every round is kept; `median` is the round with the median req/s."""
    sc = bench.scenario
    cells = []
    for load in sc["loads"]:
        for c in load["connections"]:
            rows = {t: [] for t in bench.active()}
            for r in range(1, sc["rounds"] + 1):
                for t in bench.active():
                    if not bench.alive(t):
                        continue
                    time.sleep(sc["pause"])
                    bench.wait_quiet()
                    row = _throughput_round(bench, t, load["body"], c, r)
                    if row:
                        rows[t].append(row)
            for t, rounds in rows.items():
                cells.append({"target": t, "body": load["body"], "connections": c, "rounds": rounds,
                              "median": stats.median_round(rounds)})
    return cells


def _throughput_round(bench, target: str, body: str, connections: int, rnd: int) -> dict | None:
    """One wrk run. For a fleet target also its redis-server: the CPU it took (redis_cpu_us, apart
    from the proxy's cpu_us) and the commands it ran, from `INFO commandstats` read right before
    and right after the run (redis_calls; redis_round_trips = EVALSHA + EVAL calls / requests)."""
    watched = {"origin": bench.origin.pid}
    if target != "direct":
        watched["proxy"] = bench.procs[target].pid
    redis = bench.lab.redis.get(target)
    if redis:
        watched["redis"] = redis.pid
        before = _commandstats(bench, target)
    with procfs.LoadWindow(watched) as window:
        res, output = wrk(bench, target, connections, bench.scenario["duration"], body)
    if res is None:
        bench.warn(f"wrk gave no result for {target} {body} c{connections} round {rnd}: {output[-300:]}")
        return None
    hz = procfs.CLOCK_HZ
    row = {"round": rnd, "rps": res["rps"], "requests": res["requests"], "duration_us": res["duration_us"],
           "bytes": res["bytes"], "p50_us": res["p50_us"], "p99_us": res["p99_us"], "errors": stats.wrk_errors(res),
           "cpu_us": (stats.cpu_us_per_request(window.ticks["proxy"], hz, res["requests"])
                      if "proxy" in window.ticks else None),
           "origin_cpu_us": stats.cpu_us_per_request(window.ticks["origin"], hz, res["requests"]),
           "other_load_pct": window.other_pct}
    if bench.scenario["origin"] == "tls" and target != "direct":
        row["upstream_connections"] = _upstream_connections(bench, target)
    redis_text = ""
    if redis:
        after = _commandstats(bench, target)
        row["redis_cpu_us"] = stats.cpu_us_per_request(window.ticks["redis"], hz, res["requests"])
        row["redis_calls"] = stats.redis_calls(before, after) if before is not None and after is not None else None
        row["redis_round_trips"] = (round(stats.per_request(row["redis_calls"]["round_trips"], res["requests"]), 3)
                                    if row["redis_calls"] and res["requests"] else None)
        redis_text = (f"  redis cpu/req {row['redis_cpu_us'] or 0:.1f} us, {row['redis_round_trips']} "
                      f"round trips/req")
    cpu = f"{row['cpu_us']:.1f}" if row["cpu_us"] is not None else "-"
    bench.log(f"{target:16} {body:>3} c={connections:<4} r{rnd} {row['rps']:>7} req/s  p50 {row['p50_us']:>6} us  "
              f"p99 {row['p99_us']:>7} us  cpu/req {cpu:>6} us  other load {row['other_load_pct']:>3}%"
              f"{redis_text}{'  errors ' + str(row['errors']) if row['errors'] else ''}")
    return row


def _commandstats(bench, target: str) -> dict | None:
    """The target's Redis's `INFO commandstats`, or None (with a warning) when it does not answer."""
    try:
        return redis_commandstats(bench.lab.port(helper_of(target, "redis")))
    except (OSError, ValueError) as e:
        bench.warn(f"{target}: INFO commandstats of its Redis failed: {e}")
        return None


def _upstream_connections(bench, target: str) -> int | None:
    """The target's established connections to the origin right after a run (`ss -p`)."""
    if shutil.which("ss") is None:
        return None
    done = subprocess.run(["ss", "-Htnp", "state", "established", f"( dport = :{bench.lab.origin_port} )"],
                          capture_output=True, text=True, timeout=10)
    return done.stdout.count(f"pid={bench.procs[target].pid},")


# ---------------------------------------------------------------------------------------------

class RssSampler(threading.Thread):
    """Samples the summed VmRSS of fixed pids every `interval` seconds until stopped: the peak."""

    def __init__(self, pids: list[int], interval: float):
        super().__init__(daemon=True)
        self.pids, self.interval = pids, interval
        self.peak = self.samples = 0
        self._done = threading.Event()

    def run(self):
        while True:
            self.peak = max(self.peak, procfs.rss_of(self.pids))
            self.samples += 1
            if self._done.wait(self.interval):
                break

    def finish(self) -> tuple[int, int]:
        self._done.set()
        self.join()
        return self.peak, self.samples


def big_download(bench) -> dict:
    """The 1 GiB file through each target with curl, `rounds` times, interleaved (round 1 of every
    target, then round 2 ...), the median reported: (a) MB/s (10^6 bytes) into /dev/null, so that
    only the transfer is measured; (b) after the rounds, the same download again, hashed as it
    arrives (not timed: hashing on a core the proxy also needs would cap the direct run) and
    compared with the file's sha256. The proxy's RSS is sampled during every download (the hashed
    one reads slower, so a proxy that does not push back on its upstream shows it): peak growth =
    maximum minus the RSS right before the first.

    One download per target was once the whole measure, and it put Sluice at 1.55x direct's rate:
    a single 1 GiB transfer on 2 cores takes about a second, so whatever else ran in that second
    decided it. A proxy cannot be faster than direct access, so a median above 1.05x direct's is
    flagged in the row's note and in the result's notes (`sanity_check_failed`)."""
    p = bench.scenario["big_download"]
    url = f"http://{bench.lab.origin_host}/1g"
    rounds = max(1, int(p.get("rounds", 3)))
    targets = [t for t in bench.active() if bench.alive(t)]
    runs: dict[str, list[dict]] = {t: [] for t in targets}
    samplers: dict[str, tuple] = {}
    for t in targets:
        if t != "direct":
            pid = bench.procs[t].pid
            samplers[t] = (procfs.rss_kib(pid), RssSampler(procfs.tree(pid), p["rss_sample_ms"] / 1000))
            samplers[t][1].start()
    for n in range(rounds):
        for t in targets:
            if not bench.alive(t):
                continue
            time.sleep(bench.scenario["pause"])
            bench.wait_quiet()
            run = _timed_download(bench, t, url, p["max_time"])
            runs[t].append(run)
            bench.log(f"{t:16} 1 GiB, round {n + 1}: {run['mb_s']:>5} MB/s  other load {run['other_load_pct']}%  "
                      f"{run['note'] or ''}")
    out = {}
    for t in targets:
        if not runs[t]:
            continue
        speeds = sorted(r["mb_s"] for r in runs[t])
        median = runs[t][[r["mb_s"] for r in runs[t]].index(speeds[len(speeds) // 2])]
        row = {"mb_s": median["mb_s"], "mb_s_rounds": [r["mb_s"] for r in runs[t]], "bytes": median["bytes"],
               "http_status": median["http_status"], "other_load_pct": median["other_load_pct"],
               "note": next((r["note"] for r in runs[t] if r["note"]), None)}
        row["sha256"] = _hashed_download(url, _proxy_args(bench, t), p["max_time"], bench.big_sha256)
        if t in samplers:
            rss0, sampler = samplers[t]
            peak, samples = sampler.finish()
            row.update(peak_growth_kib=peak - rss0, rss_samples=samples,
                       rss_after_kib=procfs.rss_kib(bench.procs[t].pid))
        bench.log(f"{t:16} 1 GiB: median {row['mb_s']:>5} MB/s of {row['mb_s_rounds']}  sha256 {row['sha256']}  "
                  f"peak RSS growth {row.get('peak_growth_kib', '-')} KiB")
        out[t] = row
    for message in flag_faster_than_direct(out):
        bench.note(message)
    return out


def flag_faster_than_direct(rows: dict, limit: float = 1.05) -> list[str]:
    """Marks every proxy whose median rate is above `limit` times direct's (a proxy cannot be
    faster than direct access: such a figure measured something else) and says so, one message
    per target, for the result's notes."""
    direct = rows.get("direct", {}).get("mb_s")
    messages = []
    for t, row in rows.items():
        if t != "direct" and direct and row["mb_s"] > limit * direct:
            row["sanity_check_failed"] = True
            row["note"] = (row["note"] + "; " if row.get("note") else "") + "faster than direct: not trusted"
            messages.append(f"1 GiB download: {t}'s median {row['mb_s']} MB/s is {row['mb_s'] / direct:.2f}x "
                            f"direct's {direct} MB/s, above the {limit} a proxy can reach: not trusted")
    return messages


def _proxy_args(bench, target: str) -> list[str]:
    return [] if target == "direct" else ["-x", f"http://127.0.0.1:{bench.port(target)}"]


def _timed_download(bench, target: str, url: str, max_time: int) -> dict:
    """One download into /dev/null: MB/s, bytes, status, what else used the CPU meanwhile."""
    watched = {"origin": bench.origin.pid}
    if target != "direct":
        watched["proxy"] = bench.procs[target].pid
    with procfs.LoadWindow(watched) as window:
        done = subprocess.run(["curl", "-s", "-o", "/dev/null", "--max-time", str(max_time),
                               *_proxy_args(bench, target),
                               "-w", "%{speed_download} %{size_download} %{http_code}", url],
                              capture_output=True, text=True, timeout=max_time + 30)
    speed, size, code = (done.stdout.split() + ["0", "0", "000"])[:3]
    run = {"mb_s": round(float(speed) / 1e6), "bytes": int(float(size)), "http_status": int(code),
           "other_load_pct": window.other_pct, "note": None}
    if done.returncode == 28:
        run["note"] = f"timed out after {max_time} s"
    elif done.returncode != 0:
        run["note"] = f"curl exit {done.returncode}"
    elif code != "200" or run["bytes"] != bench.big_size:
        run["note"] = f"HTTP {code}, {run['bytes']} bytes"
    return run


def _hashed_download(url: str, proxy: list[str], max_time: int, expected: str) -> str:
    """"ok" when the download's sha256 equals the file's, else what differed."""
    curl = subprocess.Popen(["curl", "-s", "--max-time", str(max_time), *proxy,
                             "-w", "%{stderr}%{http_code} %{size_download}", url],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    digest = hashlib.sha256()
    for chunk in iter(lambda: curl.stdout.read(1 << 20), b""):
        digest.update(chunk)
    status = curl.stderr.read().decode(errors="replace")
    if curl.wait() != 0:
        return f"n/a (curl exit {curl.returncode}: {status})"
    return "ok" if digest.hexdigest() == expected else f"MISMATCH ({status}, sha256 {digest.hexdigest()[:12]}…)"


# ---------------------------------------------------------------------------------------------

def syscalls(bench) -> dict:
    """System calls per request: `strace -f -c` attached to every process (and thread) of the proxy
    during a short wrk run on kept-alive connections, all calls / requests completed. strace slows
    the proxy a lot; the count per request is what matters (attaching and detaching add a few)."""
    if shutil.which("strace") is None:
        bench.note("syscalls per request: n/a (strace is not installed)")
        return {}
    p = bench.scenario["syscalls"]
    out = {}
    for t in bench.proxies():
        time.sleep(bench.scenario["pause"])
        out[t] = _strace(bench, t, p["connections"], p["duration"])
    return out


def _strace(bench, target: str, connections: int, seconds: int) -> dict:
    pids = procfs.tree(bench.procs[target].pid)
    summary = bench.lab.tmp / "logs" / f"strace-{target}.txt"
    args = [a for pid in pids for a in ("-p", str(pid))]
    tracer = bench.lab.start(f"strace-{target}", ["timeout", str(seconds + 60), "strace", "-f", "-c", "-S", "calls",
                                                  "-o", str(summary), *args])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and tracer.alive():   # one "attached" line per process
        if tracer.log.read_text(errors="replace").count("attached") >= len(pids):
            break
        time.sleep(0.1)
    time.sleep(0.2)
    res, _ = wrk(bench, target, connections, seconds, "1k")
    tracer.stop(grace=10)        # SIGTERM: strace detaches and writes its table
    if not res or res["requests"] == 0:
        return {"note": "n/a (wrk under strace completed no requests)"}
    total, rows = stats.parse_strace_summary(summary.read_text() if summary.exists() else "")
    if total is None:
        return {"note": "n/a (no strace summary)"}
    row = {"requests": res["requests"], "calls": total, "per_request": round(total / res["requests"], 2),
           "top": [[name, round(calls / res["requests"], 2)] for name, calls in rows[:6]]}
    bench.log(f"{target:16} syscalls: {total} in {res['requests']} requests = {row['per_request']} per request")
    return row


# ---------------------------------------------------------------------------------------------

def callgrind(bench) -> dict:
    """Instructions per request: Sluice with `workers: 1` under `valgrind --tool=callgrind`, once
    serving n1 and once n2 sequential GETs (1 KiB, or the scenario's `callgrind.body`) on one
    kept-alive connection, stopped with
    SIGTERM; (Ir(n2) - Ir(n1)) / (n2 - n1), so start-up and shutdown cancel out. Unlike req/s on
    a shared machine, this repeats to the instruction. With the caching origin every request but
    the first is a memory cache hit. The 10 costliest functions per request are kept."""
    if shutil.which("valgrind") is None:
        bench.note("instructions per request: n/a (valgrind is not installed)")
        return {}
    p = bench.scenario["callgrind"]
    wanted = p.get("targets") or [t for t in bench.scenario["targets"] if kind(t) in SLUICE_TARGETS]
    d = bench.lab.dir("callgrind")
    binaries = {}
    out = {}
    for t in wanted:
        if t not in bench.active():
            continue
        if kind(t) in CALLGRIND_NGINX_TARGETS:
            out[t] = _callgrind_nginx(bench, t, d)
            continue
        # valgrind 3.19 cannot read the DWARF 5 of Swift's toolchain; a copy without debug info
        # keeps the symbol table, so the profile still names functions.
        source = bench.lab.binary(t)
        if source not in binaries:
            binaries[source] = d / f"sluice-{len(binaries)}"
            if subprocess.run(["objcopy", "--strip-debug", str(source), str(binaries[source])],
                              capture_output=True).returncode != 0:
                shutil.copy(source, binaries[source])
        binary = binaries[source]
        # A fleet target's configuration names its redis-server, which runs from the target's start
        # to the end of the run: Sluice under valgrind shares it with the target (same limit, far
        # above the load).
        if kind(t) in FLEET_TARGETS and not port_open(bench.lab.port(helper_of(t, "redis"))):
            out[t] = {"n1": p["n1"], "n2": p["n2"], "note": "n/a (its Redis is not running)"}
            continue
        bench.log(f"callgrind: {t}, {p['n1']} and {p['n2']} requests (valgrind is slow)")
        (d / f"{t}.yaml").write_text(sluice_yaml(bench.lab, t, bench.lab.port("callgrind"), "1", d))
        row = {"n1": p["n1"], "n2": p["n2"]}
        if "disk:" in (d / f"{t}.yaml").read_text():
            # A disk store: one request without valgrind first, so that both measured runs start
            # from the same filled directory (the first run would otherwise pay for making it and
            # for the miss that fills it, and the difference would mean nothing).
            ir, why = _callgrind_run(bench, binary, t, 1, d, valgrind=False)
            if why:
                out[t] = {**row, "note": f"n/a (filling its disk store: {why})"}
                continue
        for key, n in (("ir_n1", p["n1"]), ("ir_n2", p["n2"])):
            before = _commandstats(bench, t) if kind(t) in FLEET_TARGETS else None
            ir, why = _callgrind_run(bench, binary, t, n, d)
            if before is not None:
                after = _commandstats(bench, t)
                # Every round trip Redis answered during the run: the n requests', and the heartbeats
                # of this Sluice and of the idle target.
                row.setdefault("redis_round_trips_per_run", []).append(
                    stats.redis_calls(before, after)["round_trips"] if after is not None else None)
            if ir is None:
                row["note"] = f"n/a ({why})"
                break
            row[key] = ir
        if "note" not in row:
            row["per_request"] = round((row["ir_n2"] - row["ir_n1"]) / (p["n2"] - p["n1"]))
            row["top"] = _top_functions(d, t, p["n1"], p["n2"])
            bench.log(f"{t:16} callgrind: {row['per_request']} instructions per request")
        out[t] = row
    return out


# nginx targets callgrind measures beside Sluice's (`callgrind.targets`): the same sequential
# requests, so the gap to a peer is known to the instruction, whatever the machine's noise.
CALLGRIND_NGINX_TARGETS = ("nginx-pipeline", "nginx-lua")


def _callgrind_nginx(bench, target: str, d: Path) -> dict:
    """A peer's instructions per request, measured as Sluice's: nginx with one process
    (`master_process off`, so valgrind sees the worker) serving n1 and then n2 sequential GETs,
    its configuration the target's own with the callgrind port."""
    p = bench.scenario["callgrind"]
    row: dict = {"n1": p["n1"], "n2": p["n2"]}
    bench.log(f"callgrind: {target}, {p['n1']} and {p['n2']} requests (valgrind is slow)")
    for key, n in (("ir_n1", p["n1"]), ("ir_n2", p["n2"])):
        ir, why = _callgrind_nginx_run(bench, target, n, d)
        if ir is None:
            return {**row, "note": f"n/a ({why})"}
        row[key] = ir
    row["per_request"] = round((row["ir_n2"] - row["ir_n1"]) / (p["n2"] - p["n1"]))
    row["top"] = _top_functions(d, target, p["n1"], p["n2"])
    bench.log(f"{target:16} callgrind: {row['per_request']} instructions per request")
    return row


def _callgrind_nginx_run(bench, target: str, n: int, d: Path) -> tuple[int | None, str]:
    port = bench.lab.port("callgrind")
    conf = nginx_callgrind_conf(bench.lab, target, port)
    profile = d / f"callgrind.{target}.{n}.out"
    prefix = bench.lab.dir(f"callgrind-{target}")
    (prefix / "nginx.conf").write_text(conf)
    proc = bench.lab.start(f"callgrind-{target}-{n}", [
        "valgrind", "--tool=callgrind", f"--callgrind-out-file={profile}",
        "nginx", "-e", f"{prefix}/error.log", "-p", str(prefix), "-c", f"{prefix}/nginx.conf"])
    # SIGQUIT: a graceful exit (the access log's buffer written); callgrind then writes its file.
    return _callgrind_serve(bench, proc, target, n, profile, "nginx", signal.SIGQUIT)


def _callgrind_run(bench, binary: Path, target: str, n: int, d: Path,
                   valgrind: bool = True) -> tuple[int | None, str]:
    profile = d / f"callgrind.{target}.{n}.out"
    tool = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={profile}"] if valgrind else []
    # Swift seeds its hashing at random per process: a dictionary's probes, and so the count,
    # moved by a few hundred instructions a request from one run to the next. A fixed seed
    # makes the count repeat.
    proc = bench.lab.start(f"callgrind-{target}-{n}", ["env", "SWIFT_DETERMINISTIC_HASHING=1", *tool, str(binary),
                                                        "run", "--config", str(d / f"{target}.yaml")])
    # SIGTERM: Sluice drains (nothing is in flight) and exits; callgrind then writes its file.
    return _callgrind_serve(bench, proc, target, n, profile if valgrind else None, "Sluice", signal.SIGTERM)


def _callgrind_serve(bench, proc, target: str, n: int, profile: Path | None, who: str,
                     stop: signal.Signals) -> tuple[int | None, str]:
    """Sends `n` sequential GETs to the process (under valgrind unless `profile` is None),
    stops it with `stop` and reads the instructions its profile counted: (Ir, ""), (None, "")
    without a profile, or (None, why)."""
    port = bench.lab.port("callgrind")
    try:
        if not wait_port(port, proc, 60):
            return None, f"{who} under valgrind did not open its port within 60 s: {proc.tail(3)}"
        body = bench.scenario["callgrind"].get("body", "1k")
        failure = clients.sequential(port, n, bench.request_target(target, body), bench.lab.origin_host,
                                     int(body.rstrip("k")) * 1024, 840, bench.scenario["headers"])
        proc.popen.send_signal(stop)
        proc.popen.wait(120)
    except subprocess.TimeoutExpired:
        return None, f"no exit 120 s after {stop.name}"
    finally:
        proc.stop()
    if failure:
        return None, f"client: {failure}"
    if profile is None:
        return None, ""
    ir = stats.parse_callgrind_total(profile.read_text()) if profile.exists() else None
    return ir, "" if ir is not None else "no callgrind totals"


def _function_costs(profile: Path) -> dict[str, int]:
    """Self instructions of every function of a callgrind profile, demangled when the Swift
    toolchain's swift-demangle is there."""
    if shutil.which("callgrind_annotate") is None or not profile.exists():
        return {}
    text = subprocess.run(["callgrind_annotate", "--threshold=100", str(profile)],
                          capture_output=True, text=True).stdout
    if shutil.which("swift-demangle"):
        text = subprocess.run(["swift-demangle", "--simplified"], input=text, capture_output=True, text=True).stdout
    costs, found = {}, False
    for line in text.splitlines():
        if "file:function" in line:
            found = True
            continue
        m = re.match(r"\s*([\d,]+) (?:\(\s*[\d.]+%\)\s+)?(.*)", line)
        if found and m:
            name = re.sub(r"^[^:]*:", "", m.group(2)).split(" [")[0].strip()
            costs[name[:160]] = costs.get(name[:160], 0) + int(m.group(1).replace(",", ""))
    return costs


def _top_functions(d: Path, target: str, n1: int, n2: int, count: int = 10) -> list[list]:
    """[instructions per request, function] of the costliest functions by self cost in the n2 run
    minus the n1 run: where the instructions of a request go, start-up and shutdown left out."""
    first = _function_costs(d / f"callgrind.{target}.{n1}.out")
    second = _function_costs(d / f"callgrind.{target}.{n2}.out")
    per_request = {name: (ir - first.get(name, 0)) / (n2 - n1) for name, ir in second.items()}
    top = sorted(per_request.items(), key=lambda item: item[1], reverse=True)[:count]
    return [[round(ir), name] for name, ir in top]


# ---------------------------------------------------------------------------------------------

def soak(bench) -> dict:
    """Memory and descriptors over time: wrk at a fixed rate through the (one) Sluice target (each
    connection waits connections*1000/rate ms between its requests) for `duration` seconds, at most
    600; Sluice's VmRSS, descriptors and the other load are sampled every `sample` seconds. Growth
    is the median of the last three samples after the warm-up minus the median of the first three.
    Pass: RSS grows by at most 2 MiB and the descriptor count does not grow."""
    p = bench.scenario["soak"]
    if p["duration"] > 600 or p["warmup"] >= p["duration"]:
        raise ValueError("soak: duration is at most 600 seconds and longer than its warmup")
    target = next(t for t in bench.proxies() if kind(t) in SLUICE_TARGETS)
    pid = bench.procs[target].pid
    delay = p["connections"] * 1000 // p["rate"]
    bench.log(f"soak: {p['duration']} s at {p['rate']} req/s over {p['connections']} connections through {target}")
    env = {**load_env(bench, target, "1k"), "BENCH_DELAY_MS": str(delay)}
    load = subprocess.Popen(["wrk", "-t1", f"-c{p['connections']}", f"-d{p['duration']}s", "--timeout", "5s",
                             "-s", str(LUA), f"http://127.0.0.1:{bench.port(target)}/"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    start, samples = time.monotonic(), []
    while load.poll() is None and time.monotonic() - start < p["duration"] + 30:
        other, _ = procfs.other_load_now(1)
        samples.append([round(time.monotonic() - start), procfs.rss_kib(pid), procfs.fd_count(pid), other])
        time.sleep(max(p["sample"] - 1, 0))
    try:
        output, _ = load.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        load.kill()
        output, _ = load.communicate()
    res = stats.parse_wrk(output) or {}
    after = [s for s in samples if s[0] >= p["warmup"]]
    row = {"requests": res.get("requests"), "p99_us": res.get("p99_us"), "errors": stats.wrk_errors(res),
           "samples": samples, "target": target}
    rss, fds = stats.growth_first_last([s[1] for s in after]), stats.growth_first_last([s[2] for s in after])
    if rss is None or fds is None:
        row["note"] = f"too few samples after the warm-up ({len(after)}): make the soak longer"
        return row
    row.update(rss_start_kib=rss[0], rss_end_kib=rss[1], rss_growth_kib=rss[1] - rss[0],
               fds_start=fds[0], fds_end=fds[1], fds_max=max(s[2] for s in after),
               rss_min_kib=min(s[1] for s in after), rss_max_kib=max(s[1] for s in after),
               other_load_pct=round(sum(s[3] for s in after) / len(after)),
               passed=(rss[1] - rss[0]) <= 2048 and fds[1] <= fds[0])
    if fds[0] < p["connections"]:
        row["note"] = f"Sluice had {fds[0]} descriptors under load: the load did not go through it"
    bench.log(f"soak: RSS {rss[0]} -> {rss[1]} KiB, descriptors {fds[0]} -> {fds[1]}, "
              f"{'pass' if row['passed'] else 'FAIL'}")
    return row


def reload_soak(bench) -> dict:
    """Reloads under load (issue 36): wrk through the (one) Sluice target at `connections`
    connections for `duration` seconds, at most 600 (as fast as it goes, or each connection
    waiting connections*1000/rate ms between its requests when `rate` > 0), while every
    `interval` seconds its configuration file gets a new value for one header (RELOADED_HEADER)
    and SIGHUP. RSS and descriptors at the start (after `warmup` seconds of the same load and
    `settle` seconds of rest) and at the end (`settle` seconds after the load), sampled every
    `sample` seconds in between. Pass: every reload applied, no request failed, the end's RSS
    within 10 % of the start's and no more descriptors than at the start."""
    p = bench.scenario["reload_soak"]
    if p["duration"] > 600 or p["interval"] <= 0:
        raise ValueError("reload_soak: duration is at most 600 seconds and interval above 0")
    target = next(t for t in bench.proxies() if kind(t) in SLUICE_TARGETS)
    pid, log = bench.procs[target].pid, bench.procs[target].log
    config = bench.lab.dir(target) / "sluice.yaml"
    text = config.read_text()
    if RELOADED_HEADER not in text:
        return {"target": target, "note": f"{target}'s configuration has no {RELOADED_HEADER!r} to change"}
    env = load_env(bench, target, "1k")
    if p["rate"] > 0:
        env["BENCH_DELAY_MS"] = str(p["connections"] * 1000 // p["rate"])

    def load(seconds: int) -> subprocess.Popen:
        return subprocess.Popen(["wrk", "-t2", f"-c{p['connections']}", f"-d{seconds}s", "--timeout", "5s",
                                 "-s", str(LUA), f"http://127.0.0.1:{bench.port(target)}/"],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def rested() -> tuple[int, int]:
        time.sleep(p["settle"])
        return procfs.rss_kib(pid), procfs.fd_count(pid)

    bench.log(f"reload soak: {p['warmup']} s of warm-up at {p['connections']} connections through {target}")
    load(p["warmup"]).communicate(timeout=p["warmup"] + 30)
    (rss_start, fds_start), applied_before = rested(), log.read_text(errors="replace").count("reload: applied")
    bench.log(f"reload soak: {p['duration']} s, a reload every {p['interval']} s; RSS {rss_start} KiB, "
              f"{fds_start} descriptors at the start")
    wrk_run = load(p["duration"])
    start, samples, sent = time.monotonic(), [], 0
    next_sample = 0.0
    while wrk_run.poll() is None and time.monotonic() - start < p["duration"] + 30:
        elapsed = time.monotonic() - start
        if elapsed < p["duration"] - p["interval"]:
            sent += 1
            config.write_text(text.replace(RELOADED_HEADER, f"{RELOADED_HEADER}-{sent}"))
            os.kill(pid, signal.SIGHUP)
        if elapsed >= next_sample:
            samples.append([round(elapsed), procfs.rss_kib(pid), procfs.fd_count(pid)])
            next_sample += p["sample"]
        time.sleep(p["interval"])
    try:
        output, _ = wrk_run.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        wrk_run.kill()
        output, _ = wrk_run.communicate()
    res = stats.parse_wrk(output) or {}
    rss_end, fds_end = rested()
    applied = log.read_text(errors="replace").count("reload: applied") - applied_before
    row = {"target": target, "requests": res.get("requests"), "duration_us": res.get("duration_us"),
           "p99_us": res.get("p99_us"), "errors": stats.wrk_errors(res), "reloads_sent": sent,
           "reloads_applied": applied, "rss_start_kib": rss_start, "rss_end_kib": rss_end,
           "rss_growth_kib": rss_end - rss_start, "rss_max_kib": max((s[1] for s in samples), default=None),
           "fds_start": fds_start, "fds_end": fds_end, "fds_max": max((s[2] for s in samples), default=None),
           "samples": samples}
    # SIGHUPs sent while a reload runs may be merged into one: applied can be a little short.
    row["passed"] = (not row["errors"] and bool(res) and applied >= sent * 0.9
                     and rss_end <= rss_start * 1.1 and fds_end <= fds_start)
    bench.log(f"reload soak: {applied} of {sent} reloads applied, {res.get('requests')} requests "
              f"({len(row['errors'])} error kinds); RSS {rss_start} -> {rss_end} KiB, descriptors "
              f"{fds_start} -> {fds_end}, {'pass' if row['passed'] else 'FAIL'}")
    return row


MEASURES = {"idle_clients": idle_clients, "throughput": throughput, "big_download": big_download,
            "syscalls": syscalls, "callgrind": callgrind, "soak": soak, "reload_soak": reload_soak,
            "fleetcache": fleetcache.fleetcache}
