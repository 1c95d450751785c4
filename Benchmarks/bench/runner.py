"""Runs one scenario: loads it from scenarios.toml, starts the origin and the targets, runs its
measures in order and writes everything to one JSON file in Benchmarks/results/."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from . import measures, procfs
from .servers import (BASELINE, BASELINE_SHIFT, FLEET_TARGETS, ORIGIN_KINDS, PORT_OFFSETS, SLUICE_TARGETS, STARTERS,
                      Lab, Unavailable, helper_of, kind, origin_requests, port_open, start_origin)

HERE = Path(__file__).resolve().parent.parent          # Benchmarks/
REPO = HERE.parent
SCENARIOS = HERE / "scenarios.toml"
RESULTS = HERE / "results"
BIG_SIZE = 1024 ** 3
HIT_HEADER = re.compile(r"^(cache-status: sluice; hit|x-cache: hit|x-cache-status: hit)", re.I | re.M)


def scenario_names() -> dict[str, str]:
    """Every scenario of scenarios.toml with its description."""
    data = tomllib.loads(SCENARIOS.read_text())
    return {name: s.get("description", "") for name, s in data.items() if name != "defaults"}


def load_scenario(name: str, overrides: list[str]) -> dict:
    """[defaults] with the scenario's keys on top (tables merged key by key), then the overrides,
    "KEY=VALUE" or "TABLE.KEY=VALUE" with VALUE in TOML syntax (a bare word is a string)."""
    data = tomllib.loads(SCENARIOS.read_text())
    if name == "defaults" or name not in data:
        raise SystemExit(f"unknown scenario {name!r}; known: {', '.join(scenario_names())}")
    scenario = _merge(data["defaults"], data[name])
    for override in overrides:
        key, _, text = override.partition("=")
        try:
            value = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            value = text
        path = key.strip().split(".")
        table = scenario
        for part in path[:-1]:
            table = table.setdefault(part, {})
        table[path[-1]] = value
    unknown = [t for t in scenario["targets"] if t != "direct" and kind(t) not in STARTERS]
    if unknown or scenario["origin"] not in ORIGIN_KINDS:
        raise SystemExit(f"unknown target(s) {unknown} or origin {scenario['origin']!r}; "
                         f"targets: direct, {', '.join(STARTERS)}; origins: {', '.join(ORIGIN_KINDS)}")
    return {"name": name, **scenario}


def _merge(base: dict, top: dict) -> dict:
    merged = dict(base)
    for key, value in top.items():
        merged[key] = {**base[key], **value} if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return merged


class Bench:
    """One run of a scenario: the lab, the processes, the status of each target and the progress
    log (stderr, with the seconds since the start)."""

    def __init__(self, scenario: dict, lab: Lab):
        self.scenario, self.lab = scenario, lab
        self.origin = None
        self.procs = {}
        self.status: dict[str, str | None] = {}
        self.notes: list[str] = []
        self.started = time.monotonic()
        self.big_sha256 = ""
        self.big_size = BIG_SIZE

    def log(self, message: str):
        print(f"== [{time.monotonic() - self.started:5.0f}s] {message}", file=sys.stderr, flush=True)

    def warn(self, message: str):
        print(f"!! {message}", file=sys.stderr, flush=True)

    def note(self, message: str):
        """Something that was not measured, and why: the result file's notes."""
        self.warn(message)
        self.notes.append(message)

    def port(self, target: str) -> int:
        return self.lab.port(target)

    def request_target(self, target: str, body: str) -> str:
        """The request line's target: origin-form for direct, absolute-form through a proxy; with the
        caching origin every target has its own object (/<target>/1k)."""
        if body.startswith("put"):
            path = "/put"  # an upload (`put64k`: a 64 KiB PUT body, measures.wrk)
        else:
            path = f"/{target}/{body}" if self.scenario["origin"] == "caching" else f"/{body}"
        return path if target == "direct" else f"http://{self.lab.origin_host}{path}"

    def bodies(self) -> list[str]:
        return [load["body"] for load in self.scenario["loads"]]

    def active(self) -> list[str]:
        return [t for t in self.scenario["targets"] if self.status.get(t) is None]

    def proxies(self) -> list[str]:
        return [t for t in self.active() if t != "direct"]

    def alive(self, target: str) -> bool:
        """The target, and a fleet target's redis-server, still run."""
        if target == "direct":
            return True
        redis = self.lab.redis.get(target)
        if self.procs[target].alive() and (redis is None or redis.alive()):
            return True
        if self.status.get(target) is None:
            gone = self.procs[target] if not self.procs[target].alive() else redis
            what = "exited" if gone is self.procs[target] else "its redis-server exited"
            self.status[target] = f"{what} during the run"
            self.warn(f"{target}: {what} during the run:\n{gone.tail()}")
        return False

    def wait_quiet(self):
        """Up to `quiet_wait` seconds for other processes to drop below 5 % of the CPU."""
        waited = 0
        while waited < self.scenario["quiet_wait"]:
            pct, _ = procfs.other_load_now(1)
            if pct < 5:
                return
            if waited == 0:
                self.log(f"waiting for other processes to quiet down ({pct}% of the CPU)")
            waited += 1
        if self.scenario["quiet_wait"]:
            self.warn(f"still busy after {self.scenario['quiet_wait']} s; measuring anyway")

    # -----------------------------------------------------------------------------------------

    def start_targets(self):
        for t in self.scenario["targets"]:
            if t == "direct":
                self.status[t] = None
                continue
            try:
                self.procs[t] = STARTERS[kind(t)](self.lab, t)
                self._check(t)
                self.status[t] = None
                redis = self.lab.redis.get(t)
                helper = (f", its redis-server on 127.0.0.1:{self.port(helper_of(t, 'redis'))} (pid {redis.pid})"
                          if redis else "")
                self.log(f"{t} on 127.0.0.1:{self.port(t)} (pid {self.procs[t].pid}){helper}")
            except Unavailable as e:
                self.status[t] = str(e)
                self.warn(f"{t}: n/a ({e})")
                if t in self.procs:
                    self.procs[t].stop()
                if t in self.lab.redis:
                    self.lab.redis.pop(t).stop()

    def _check(self, target: str):
        """A real request through the proxy before anything is measured; with the caching origin,
        three, the last of which must be a hit (a benchmark of misses would be worthless)."""
        url = f"http://{self.lab.origin_host}{self.request_target('direct', '1k')}"
        tries = 3 if self.scenario["origin"] == "caching" else 1
        headers = [arg for name, value in self.scenario["headers"].items() for arg in ("-H", f"{name}: {value}")]
        for _ in range(tries):
            done = subprocess.run(["curl", "-s", "-o", "/dev/null", "-D", "-", "--max-time", "5", *headers, "-x",
                                   f"http://127.0.0.1:{self.port(target)}", "-w", "%{http_code} %{size_download}",
                                   url], capture_output=True, text=True)
        got = done.stdout.splitlines()[-1] if done.stdout else ""
        if got != "200 1024":
            raise Unavailable(f"the check through the proxy gave {got!r}, expected '200 1024'")
        if tries > 1 and not HIT_HEADER.search(done.stdout):
            raise Unavailable("does not answer the object with a cache hit")

    def prepare_big_file(self) -> Path:
        """The 1 GiB file of random bytes in cache_dir, made once and kept between runs with its
        sha256 beside it, read once so that it is in the page cache (not the disk is measured)."""
        cache = Path(self.scenario["cache_dir"])
        cache.mkdir(parents=True, exist_ok=True)
        cache.chmod(0o755)
        big, sha = cache / "1GiB.bin", cache / "1GiB.bin.sha256"
        if not big.exists() or big.stat().st_size != BIG_SIZE:
            self.log(f"creating {big} (once; kept for later runs)")
            with open(big.with_suffix(".part"), "wb") as f:
                for _ in range(BIG_SIZE // (64 << 20)):
                    f.write(os.urandom(64 << 20))
            big.with_suffix(".part").rename(big)
        big.chmod(0o644)
        if not sha.exists() or sha.stat().st_mtime < big.stat().st_mtime:
            self.log(f"computing the sha256 of {big} (once)")
            sha.write_text(_sha256_file(big))
        else:
            _sha256_file(big)     # reading it puts it in the page cache
        self.big_sha256 = sha.read_text().strip()
        return big


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(8 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _first_line(cmd: list[str]) -> str | None:
    """The first line a tool prints about its version, or None when it is not installed."""
    if shutil.which(cmd[0]) is None:
        return None
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    lines = (done.stdout + done.stderr).strip().splitlines()
    return lines[0].strip() if lines else None


def versions(sluice_bin: Path) -> dict:
    """The version of every target program and tool (None: not installed), and which Sluice."""
    tools = {
        "wrk": ["wrk", "-v"], "nginx": ["nginx", "-v"], "haproxy": ["haproxy", "-v"], "squid": ["squid", "-v"],
        "trafficserver": ["traffic_server", "--version"], "tinyproxy": ["tinyproxy", "-v"],
        "curl": ["curl", "--version"], "valgrind": ["valgrind", "--version"], "strace": ["strace", "-V"],
        "openssl": ["openssl", "version"], "redis": ["redis-server", "--version"],
        "python": [sys.executable, "--version"],
    }
    found = {name: _first_line(cmd) for name, cmd in tools.items()}
    sluice = {"binary": str(sluice_bin), "version": None, "sha256": None, "built_utc": None, "swift_runtime": None}
    if sluice_bin.is_file():
        sluice.update(version=_first_line([str(sluice_bin), "--version"]), sha256=_sha256_file(sluice_bin),
                      built_utc=_utc(sluice_bin.stat().st_mtime), swift_runtime=swift_runtime(sluice_bin))
    return {"sluice": sluice, **found}


def swift_runtime(binary: Path) -> str | None:
    """"dynamic" when the binary loads libswiftCore.so, "static" when it carries the Swift runtime
    (`--static-swift-stdlib`, how the .deb and the container image build it): the idle RSS of
    the two differs by megabytes, so the result says which was measured. None without readelf,
    or for a file readelf cannot read (a wrapper script is neither)."""
    if shutil.which("readelf") is None:
        return None
    done = subprocess.run(["readelf", "-d", str(binary)], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        return None
    return "dynamic" if "libswiftCore.so" in done.stdout else "static"


def commit() -> dict:
    """The repository's commit, and whether the sources differ from it (then the binary may too)."""
    git = lambda *args: subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
    head = git("rev-parse", "--short", "HEAD").stdout.strip() or "unknown"
    dirty = git("diff", "--quiet", "HEAD", "--", "Sources", "Package.swift").returncode != 0
    return {"id": head, "uncommitted_changes_in_sources": dirty}


def _utc(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _sluice_yaml(scenario: dict, nofile: int) -> str:
    """What every Sluice of the run gets appended: the scenario's sluice_yaml, SLUICE_EXTRA_YAML,
    and max_connections when `auto` ((open files - 64) / 2) would not fit the idle clients."""
    parts = [scenario["sluice_yaml"], os.environ.get("SLUICE_EXTRA_YAML", "")]
    if "idle_clients" in scenario["measures"]:
        need = scenario["idle_clients"]["clients"] + 64
        if (nofile - 64) // 2 < need:
            if need + 1100 > nofile:
                raise SystemExit(f"the open-file limit {nofile} is too low for {need - 64} idle clients")
            parts.append(f"limits: {{ max_connections: {need} }}")
    return "".join(p + "\n" for p in parts if p)


def with_baseline(targets: list[str]) -> list[str]:
    """The targets with each Sluice target's baseline twin right after it (run --baseline)."""
    return [name for t in targets for name in ((t, t + BASELINE) if kind(t) in SLUICE_TARGETS else (t,))]


def run(scenario: dict, sluice_bin: Path, keep_logs: bool, baseline_bin: Path | None = None) -> Path:
    """Runs the scenario and writes its result file; returns the file's path. With `baseline_bin`,
    every Sluice target also runs as "<target>@base" on that binary, interleaved with the others."""
    if baseline_bin is not None:
        if not baseline_bin.is_file():
            raise SystemExit(f"no baseline binary at {baseline_bin}")
        scenario = {**scenario, "targets": with_baseline(scenario["targets"])}
        if "targets" in scenario.get("callgrind", {}):
            scenario["callgrind"] = {**scenario["callgrind"],
                                     "targets": with_baseline(scenario["callgrind"]["targets"])}
    for tool in ["wrk", "curl", "nginx"] + (["openssl"] if scenario["origin"] == "tls" else []):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (scripts/install-deps.sh bench installs what is needed)")
    top = max(PORT_OFFSETS.values()) + (BASELINE_SHIFT if baseline_bin is not None else 0)
    if scenario["base_port"] + top >= 32768:
        raise SystemExit(f"base_port must leave base_port+{top} below 32768 (the ephemeral ports)")
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        os.environ.pop(var, None)   # never let the environment route our clients elsewhere
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.time()
    nofile = procfs.raise_open_files()
    tmp = Path(tempfile.mkdtemp(prefix="sluice-bench."))
    tmp.chmod(0o755)           # the workers of nginx, squid and tinyproxy traverse it
    (tmp / "logs").mkdir()
    lab = Lab(tmp=tmp, base_port=scenario["base_port"], sluice_bin=sluice_bin, baseline_bin=baseline_bin, nofile=nofile,
              is_root=os.geteuid() == 0, sluice_workers=str(scenario["sluice_workers"]),
              sluice_yaml=_sluice_yaml(scenario, nofile))
    bench = Bench(scenario, lab)
    result = {"format": 1, "scenario": scenario, "started_utc": _utc(started), "commit": commit(),
              "machine": procfs.machine(), "open_files": nofile, "versions": versions(sluice_bin)}
    if baseline_bin is not None:
        result["baseline"] = versions(baseline_bin)["sluice"]
    try:
        helpers = [helper_of(t, h) for t in scenario["targets"] for h in ("redis", "admin")
                   if t != "direct" and (h == "admin" or kind(t) in FLEET_TARGETS)]
        busy = [t for t in dict.fromkeys(["direct", *scenario["targets"], "callgrind", "admin", *helpers])
                if port_open(lab.port(t))]
        if busy:
            raise SystemExit(f"ports of {busy} are in use; choose another base port (--set base_port=N)")
        if "big_download" in scenario["measures"]:
            lab.big_file = bench.prepare_big_file()
        targets = scenario["targets"]
        bench.origin = start_origin(lab, scenario["origin"], targets)
        bench.log(f"origin nginx ({scenario['origin']}) on {lab.origin_host} (pid {bench.origin.pid})")
        bench.start_targets()
        rss_idle = {t: procfs.rss_kib(bench.procs[t].pid) for t in bench.proxies()}
        result["other_load_before_pct"], top = procfs.other_load_now(2)
        if result["other_load_before_pct"] > 5:
            bench.warn(f"other processes use {result['other_load_before_pct']}% of the CPU before any load: "
                       f"the figures will be noisy ({', '.join(f'{comm} {ticks}' for ticks, comm in top)})")
        measures.warm_up(bench)
        rss_after_load = {}
        for name in scenario["measures"]:
            bench.log(f"--- {name}")
            result[name] = measures.MEASURES[name](bench)
            if name == "throughput":
                rss_after_load = {t: procfs.rss_kib(bench.procs[t].pid) for t in bench.proxies()}
        if scenario["origin"] == "caching":
            time.sleep(1.5)     # the origin's access log is flushed every second
            result["origin_requests"] = {t: origin_requests(lab, f"/{t}/1k") for t in targets}
            squid_log = tmp / "squid-cache" / "access.log"
            if squid_log.exists():
                result["squid_hits"] = len(re.findall(r"TCP_(?:MEM_)?HIT", squid_log.read_text()))
        result["targets"] = {
            t: {"status": "ok" if bench.status.get(t) is None else "n/a", "reason": bench.status.get(t),
                "port": lab.port(t), "rss_idle_kib": rss_idle.get(t),
                "rss_after_load_kib": rss_after_load.get(t),
                **({"redis_port": lab.port(helper_of(t, "redis"))} if t in lab.redis else {})} for t in targets}
        result["notes"] = bench.notes
    finally:
        lab.stop_all()
        if keep_logs:
            bench.log(f"logs and configurations kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    result["wall_seconds"] = round(time.time() - started)
    stamp = datetime.datetime.fromtimestamp(started, datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{stamp}-{scenario['name']}-{result['commit']['id']}.json"
    path.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    bench.log(f"wrote {path.relative_to(REPO)} ({result['wall_seconds']} s)")
    return path
