"""The processes of a benchmark: the origin (nginx) and every target proxy, each started in the
foreground with a configuration written to the run's temporary directory, listening on 127.0.0.1
only, and stopped by its pid when the run ends."""

from __future__ import annotations

import base64
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import procfs, stats

# Offsets from the base port. The e2e suite picks its ports in 20000-30000 and the kernel its
# ephemeral ports from 32768: the default base, 31080, stays between the two.
PORT_OFFSETS = {
    "direct": 0, "sluice": 1, "nginx": 2, "squid": 3, "tinyproxy": 4, "sluice-metrics": 5,
    "sluice-pipeline": 6, "haproxy": 7, "trafficserver": 8, "callgrind": 9, "admin": 10,
    "sluice-curl": 11, "sluice-cache": 12, "nginx-cache": 13, "squid-cache": 14,
    "sluice-h2": 15, "sluice-http1": 16, "sluice-ratelimit": 17, "sluice-fleet": 18, "redis": 19,
    "sluice-http1-curl": 20, "haproxy-tls": 21, "sluice-disk": 22, "sluice-sigv4": 23, "sluice-reload": 24,
    "haproxy-pipeline": 25, "sluice-lua": 26, "haproxy-lua": 27, "nginx-pipeline": 28, "nginx-lua": 29,
    # The fleetcache measure's three instances (bench/fleetcache.py).
    "fleet-a": 30, "fleet-b": 31, "fleet-c": 32,
}

# A baseline twin (`run --baseline BIN`): "<target>@base" is the Sluice target <target> with the
# same configuration, run by another binary (the build being compared against) in the same
# interleaved run, so both see the same machine at the same moments. Its ports, and those of its
# helpers (its redis-server, its admin listener), are BASELINE_SHIFT above the target's.
BASELINE = "@base"
BASELINE_SHIFT = 40


def kind(name: str) -> str:
    """The target a name runs: "sluice-pipeline" for "sluice-pipeline@base"."""
    return name.removesuffix(BASELINE)


def helper_of(target: str, helper: str) -> str:
    """The name of `helper` ("redis", "admin") that belongs to `target`: a twin has its own."""
    return helper + BASELINE if target.endswith(BASELINE) else helper


class Unavailable(Exception):
    """A target that cannot be measured here (not installed, did not start); the reason goes into
    the result file."""


class Proc:
    """A foreground process the benchmark started, with its output in a log file."""

    def __init__(self, name: str, cmd: list[str], log: Path, cwd: Path | None = None):
        self.name, self.log = name, log
        with open(log, "wb") as out:
            self.popen = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, cwd=cwd)
        self.pid = self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, grace: float = 5.0):
        """SIGTERM, then SIGKILL for whatever is left of its process tree after `grace` seconds:
        only processes with the same pid *and* start time as before (not a reused pid)."""
        if not self.alive():
            return
        members = [(pid, procfs.start_time(pid)) for pid in procfs.tree(self.pid)]
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(grace)
        except subprocess.TimeoutExpired:
            pass
        for pid, started in members:
            if started and procfs.start_time(pid) == started:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        try:
            self.popen.wait(5)
        except subprocess.TimeoutExpired:
            pass

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_port(port: int, proc: Proc | None, seconds: float) -> bool:
    """Until something accepts on the port (False if the process exits or time runs out)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            return False
        if port_open(port):
            return True
        time.sleep(0.1)
    return False


@dataclass
class Lab:
    """What every process of one run shares: its temporary directory, ports, limits and the
    Sluice binary."""

    tmp: Path
    base_port: int
    sluice_bin: Path
    nofile: int
    is_root: bool
    sluice_workers: str = "auto"
    sluice_yaml: str = ""          # appended to every Sluice configuration
    big_file: Path | None = None
    baseline_bin: Path | None = None   # the binary of the "@base" twins (run --baseline)
    procs: list[Proc] = field(default_factory=list)
    redis: dict[str, Proc] = field(default_factory=dict)   # target -> the redis-server it started

    def port(self, name: str) -> int:
        shift = BASELINE_SHIFT if name.endswith(BASELINE) else 0
        return self.base_port + PORT_OFFSETS[kind(name)] + shift

    def binary(self, target: str) -> Path:
        """The Sluice binary a Sluice target runs: the baseline's for a twin."""
        if target.endswith(BASELINE):
            if self.baseline_bin is None:
                raise ValueError(f"{target}: no baseline binary (run --baseline BIN)")
            return self.baseline_bin
        return self.sluice_bin

    @property
    def origin_port(self) -> int:
        return self.port("direct")

    @property
    def origin_host(self) -> str:
        return f"127.0.0.1:{self.origin_port}"

    def dir(self, name: str) -> Path:
        d = self.tmp / name
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o755)
        return d

    def start(self, name: str, cmd: list[str], cwd: Path | None = None) -> Proc:
        proc = Proc(name, cmd, self.tmp / "logs" / f"{name}.log", cwd)
        self.procs.append(proc)
        return proc

    def stop_all(self):
        """Helpers first, then the proxies, the origin last."""
        for proc in reversed(self.procs):
            proc.stop()


# ---------------------------------------------------------------------------------------------
# nginx: the origin, the forward proxy and the caching proxy

def _nginx_conf(lab: Lab, d: Path, workers: str, http_body: str, main: str = "") -> str:
    return f"""{main}worker_processes {workers};
daemon off;
master_process on;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
worker_rlimit_nofile {lab.nofile};
events {{ worker_connections 16384; }}
http {{
    access_log off;
    default_type application/octet-stream;
    client_body_temp_path {d}/client_body;
    proxy_temp_path       {d}/proxy;
    fastcgi_temp_path     {d}/fastcgi;
    uwsgi_temp_path       {d}/uwsgi;
    scgi_temp_path        {d}/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 600s;
    tcp_nodelay on;
{http_body}
}}
"""


def _start_nginx(lab: Lab, name: str, workers: str, http_body: str, port: int, main: str = "") -> Proc:
    d = lab.dir(name)
    (d / "nginx.conf").write_text(_nginx_conf(lab, d, workers, http_body, main))
    proc = lab.start(name, ["nginx", "-e", f"{d}/error.log", "-p", str(d), "-c", f"{d}/nginx.conf"])
    if not wait_port(port, proc, 10):
        raise Unavailable(f"nginx ({name}) did not start: {_first_error(proc, d)}")
    return proc


ORIGIN_KINDS = ("plain", "caching", "tls")


def start_origin(lab: Lab, kind: str, targets: list[str]) -> Proc:
    """The upstream every target fetches from, nginx on the base port:
    plain   -- /1k, /64k and /1g (the big file, from the page cache), all workers;
    caching -- a 1 KiB and a 64 KiB object per target (/<target>/1k, /<target>/64k) and the
               1 KiB object under any /fleet/ path, and /1g with big_download, all with
               `Cache-Control: max-age=3600`,
               one worker, an access log of the paths (the requests that reached the origin);
    tls     -- /1k over TLS with HTTP/2 (a throwaway CA; lab.tmp/ca.pem), one worker."""
    www = lab.dir("www")
    _write_random(www / "1k", 1024)
    _write_random(www / "64k", 65536)
    for t in targets:
        (www / t).mkdir(exist_ok=True)
        _write_random(www / t / "1k", 1024)
        _write_random(www / t / "64k", 65536)
    d = lab.dir("origin")
    port = lab.origin_port
    if kind == "plain":
        big = f"location = /1g {{ alias {lab.big_file}; }}" if lab.big_file else ""
        # /put answers any method at once (204), its body read and dropped: the uploads'
        # target (loads whose body is `put…`).
        body = f"""    sendfile on;
    tcp_nopush on;
    server {{ listen 127.0.0.1:{port} backlog=4096; root {www}; client_max_body_size 16m;
              location = /put {{ return 204; }} {big} }}"""
        return _start_nginx(lab, "origin", "auto", body, port)
    if kind == "caching":
        # /1g: the big file, cacheable as the rest (cachedisk's 1 GiB from each cache).
        big = f"location = /1g {{ alias {lab.big_file}; }}" if lab.big_file else ""
        # /fleet/... answers the 1 KiB object for any path (the fleetcache measure's many URLs),
        # logged apart with the path as requested.
        body = f"""    log_format path '$uri';
    log_format requested '$request_uri';
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        access_log {d}/access.log path buffer=64k flush=1s;
        root {www};
        add_header Cache-Control "max-age=3600";
        location ^~ /fleet/ {{ access_log {d}/fleet.log requested buffer=64k flush=1s; try_files /1k =404; }}
        {big}
    }}"""
        return _start_nginx(lab, "origin", "1", body, port)
    if kind == "tls":
        _make_pki(lab.tmp)
        body = f"""    server {{
        listen 127.0.0.1:{port} ssl http2 backlog=4096;
        ssl_certificate {lab.tmp}/leaf.pem;
        ssl_certificate_key {lab.tmp}/leaf.key;
        root {www};
    }}"""
        return _start_nginx(lab, "origin", "1", body, port)
    raise ValueError(f"unknown origin kind {kind!r} (known: {', '.join(ORIGIN_KINDS)})")


def origin_requests(lab: Lab, path: str) -> int:
    """Requests for `path` the caching origin logged (its log is flushed every second)."""
    log = lab.tmp / "origin" / "access.log"
    return sum(1 for line in log.read_text().splitlines() if line == path) if log.exists() else 0


def _write_random(path: Path, size: int):
    """size bytes of printable random data (so no proxy is tempted to treat it as anything else)."""
    path.write_bytes(base64.b64encode(os.urandom(size))[:size])
    path.chmod(0o644)


def _make_pki(d: Path):
    """A throwaway CA and a leaf certificate for 127.0.0.1 (EC P-256), valid two days."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run = lambda *args: subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=bench CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
    run("req", "-new", *ec, "-keyout", "leaf.key", "-out", "leaf.csr", "-subj", "/CN=127.0.0.1")
    (d / "leaf.ext").write_text("basicConstraints=critical,CA:FALSE\nextendedKeyUsage=serverAuth\n"
                                "subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "leaf.pem", "-days", "2", "-extfile", "leaf.ext")


def _first_error(proc: Proc, d: Path) -> str:
    text = proc.tail(40)
    for log in sorted(d.glob("*.log")) + sorted(d.glob("log/*.log")):
        text += "\n" + log.read_text(errors="replace")[-4000:]
    for line in text.splitlines():
        if any(w in line.lower() for w in ("fatal", "emerg", "alert", "error", "cannot", "unable")):
            return line.strip()[:160]
    return "no error in its logs"


# ---------------------------------------------------------------------------------------------
# Sluice

PIPELINE = """monitors:
  - access_log: {{ path: {d}/access.log }}
policies:
  default:
    adapters:
      - headers: {{ set: {{ X-Forwarded-By: sluice }}, remove: [X-Debug] }}
      - bearer: bench-token-0123456789
      - api_key: {{ header: X-Api-Key, value: bench-key-0123456789 }}
"""

# AWS Signature Version 4 on every try (the `signing` scenario): fixed keys, the body hashed.
SIGV4 = ("      - aws_sigv4: { service: s3, region: eu-west-1, credentials: "
         "{ access_key_id: AKIDEXAMPLE, secret_access_key: bench-secret-0123456789 } }\n")

# A limit no load of the harness comes near (the most a rate may be, a burst of 100,000): what a
# limit costs a request that never waits.
RATE_LIMIT = "    rate_limit: { rate: 1000000/s, burst: 100000 }\n"

# The memory cache of sluice-cache and sluice-reload.
CACHE = "cache_store: { memory: 64MiB }\n"

# The `lua` scenario's edit (issue 35, item 8), the same in every proxy: read one request header
# and set another from it. sluice-lua runs LUA_EDIT as a `lua` stage after the pipeline's
# adapters; haproxy-lua (HAPROXY_LUA_EDIT) and nginx-lua (NGINX_LUA_EDIT) do the same in their
# own Lua. The loads of the scenario send `X-Client: bench` (its `headers`), so the origin gets
# `X-Seen: bench`; a request without it gets `X-Seen: none`.
LUA_EDIT = ('return { on_request = function(req, ctx) '
            'req.headers:set("X-Seen", req.headers:get("X-Client") or "none") end }\n')
LUA_STAGE = "      - lua: {{ file: {script}, on_error: fail_closed }}\n"

# The adapter value the reload soak changes in sluice-reload's file before each SIGHUP.
RELOADED_HEADER = "X-Forwarded-By: sluice"


def sluice_extra(lab: Lab, name: str, d: Path) -> str:
    """What each Sluice target adds to the common configuration:
    sluice          -- nothing;
    sluice-pipeline -- three header adapters and the JSON access log written to a file;
    sluice-curl     -- the same through the libcurl upstream transport (`engine: curl`);
    sluice-metrics  -- sluice-pipeline plus the metrics monitor and an admin listener;
    sluice-sigv4    -- sluice-pipeline plus `aws_sigv4` (SIGV4): every try signed, a body hashed;
    sluice-lua      -- sluice-pipeline plus a `lua` stage (LUA_STAGE) running LUA_EDIT, the script
                       in the target's own directory (lua_script; start_sluice writes it);
    sluice-ratelimit -- sluice-pipeline plus a `rate_limit` in its default policy far above any
                        load here (RATE_LIMIT): the cost of a limit that never holds a request back;
    sluice-fleet    -- sluice-ratelimit plus `fleet:` (fleet_section): the limit kept in a
                       redis-server of its own on loopback, one EVALSHA round trip per request;
    sluice-reload   -- sluice-fleet plus the memory cache (CACHE): what the reload soak reloads
                       (measures.reload_soak rewrites its header value, RELOADED_HEADER);
    sluice-cache    -- the memory cache (`cache_store: { memory: 64MiB }`);
    sluice-disk     -- the disk tier as the store (`memory: 256KiB`, so a body over 32 KiB is on
                       disk only and every hit of the 64 KiB object reads the disk tier), started,
                       filled, restarted (start_sluice): its hits come from the directory a
                       previous process wrote;
    sluice-h2 / sluice-http1 -- the TLS origin with `upstream.http2` auto (ALPN h2) / off (so
                       HTTP/1.1 over TLS on the native transport);
    sluice-http1-curl -- sluice-http1 through libcurl (`upstream.engine: curl`)."""
    pipeline = PIPELINE.format(d=d)
    target, name = name, kind(name)
    if name == "sluice":
        return ""
    if name == "sluice-pipeline":
        return pipeline
    if name == "sluice-curl":
        return pipeline.replace("  default:\n", "  default:\n    upstream: { engine: curl }\n")
    if name == "sluice-sigv4":
        return pipeline + SIGV4
    if name == "sluice-lua":
        return pipeline + LUA_STAGE.format(script=lua_script(lab, target))
    if name == "sluice-ratelimit":
        return pipeline.replace("  default:\n", "  default:\n" + RATE_LIMIT)
    if name == "sluice-fleet":
        return pipeline.replace("  default:\n", "  default:\n" + RATE_LIMIT) + fleet_section(lab, target)
    if name == "sluice-reload":
        return pipeline.replace("  default:\n", "  default:\n" + RATE_LIMIT) + fleet_section(lab, target) + CACHE
    if name == "sluice-metrics":
        return (pipeline.replace("monitors:\n", "monitors:\n  - metrics: {}\n")
                + f"admin: {{ listen: 127.0.0.1:{lab.port(helper_of(target, 'admin'))} }}\n")
    if name == "sluice-cache":
        return CACHE
    if name == "sluice-disk":
        if lab.big_file:   # room for the 1 GiB object too (big_download: 1 GiB from the disk tier)
            return (f"cache_store: {{ memory: 256KiB, max_object_size: 1GiB, "
                    f"disk: {{ path: {d}/cache, size: 2GiB }} }}\n")
        return f"cache_store: {{ memory: 256KiB, disk: {{ path: {d}/cache, size: 256MiB }} }}\n"
    if name in ("sluice-h2", "sluice-http1", "sluice-http1-curl"):
        mode = "auto" if name == "sluice-h2" else '"off"'
        engine = ", engine: curl" if name == "sluice-http1-curl" else ""
        return (f"tls: {{ ca_file: {lab.tmp}/ca.pem }}\npolicies:\n  127.0.0.1:\n"
                f"    upstream: {{ scheme: https, port: {lab.origin_port}, http2: {mode}{engine} }}\n")
    raise ValueError(name)


def lua_script(lab: Lab, target: str) -> Path:
    """Where a Lua target's script is: edit.lua in the target's directory (the configuration
    callgrind writes for it elsewhere names the same file)."""
    return lab.tmp / target / "edit.lua"


def fleet_section(lab: Lab, target: str) -> str:
    """The top-level `fleet:` of a fleet target: its redis-server on loopback, every other key
    (timeout 20ms, key_prefix, heartbeat 2s, on_redis_down) at Sluice's default."""
    return f'fleet: {{ redis: "127.0.0.1:{lab.port(helper_of(target, "redis"))}" }}\n'


def sluice_yaml(lab: Lab, name: str, port: int, workers: str, d: Path) -> str:
    return (f"# generated by Benchmarks/bench ({name})\n"
            f'listen: ["127.0.0.1:{port}"]\nworkers: {workers}\n'
            f"access:\n  allow_clients: [127.0.0.0/8]\n"
            f"{sluice_extra(lab, name, d)}{lab.sluice_yaml}\n")


def start_sluice(lab: Lab, name: str) -> Proc:
    """A Sluice target; a fleet target first starts its redis-server (start_redis), which is
    stopped with it (lab.stop_all stops the processes in reverse order: Sluice, then Redis)."""
    binary = lab.binary(name)
    if not binary.is_file():
        raise Unavailable(f"no binary at {binary} (build it with `make build`)")
    d = lab.dir(name)
    (d / "sluice.yaml").write_text(sluice_yaml(lab, name, lab.port(name), lab.sluice_workers, d))
    if kind(name) in LUA_TARGETS:
        lua_script(lab, name).write_text(LUA_EDIT)
        _sluice_check(lab, binary, d / "sluice.yaml")
    redis = start_redis(lab, name) if kind(name) in FLEET_TARGETS else None
    proc = lab.start(name, [str(binary), "run", "--config", str(d / "sluice.yaml")])
    if not wait_port(lab.port(name), proc, 15):
        proc.stop()
        if redis:
            redis.stop()
        raise Unavailable(f"did not start: {_first_error(proc, d)}")
    if kind(name) in RESTARTED_TARGETS:
        proc = _fill_and_restart(lab, name, proc, d)
    return proc


# The Sluice targets with a `lua` stage: `sluice check` runs on their configuration first, so a
# binary without the `lua` kind is skipped with check's own words.
LUA_TARGETS = {"sluice-lua"}


def _sluice_check(lab: Lab, binary: Path, config: Path):
    """`sluice check` of a configuration; Unavailable with its first error when it refuses it."""
    done = subprocess.run([str(binary), "check", "--config", str(config)], capture_output=True,
                          text=True, timeout=60)
    if done.returncode != 0:
        lines = (done.stdout + done.stderr).strip().splitlines()
        error = next((line for line in lines if "error" in line.lower()), lines[0] if lines else "no output")
        error = error.strip().replace(f"{config}:", f"{config.name}:")
        raise Unavailable(f"`sluice check` refuses its configuration: {error[:200]}")


# The Sluice targets measured after a restart: their objects are fetched once (stored), the
# process stopped with SIGTERM and started again on the same directory.
RESTARTED_TARGETS = {"sluice-disk"}


def _fill_and_restart(lab: Lab, name: str, proc: Proc, d: Path) -> Proc:
    proxy = f"http://127.0.0.1:{lab.port(name)}"
    urls = [f"http://{lab.origin_host}/{name}/{body}" for body in ("1k", "64k")]
    if lab.big_file:
        urls.append(f"http://{lab.origin_host}/1g")
    for url in urls:
        subprocess.run(["curl", "-s", "-o", "/dev/null", "--max-time", "120", "-x", proxy, url], check=False)
    proc.popen.send_signal(signal.SIGTERM)
    proc.popen.wait(30)
    proc.stop()
    proc = lab.start(f"{name}-restarted", [str(lab.binary(name)), "run", "--config", str(d / "sluice.yaml")])
    if not wait_port(lab.port(name), proc, 15):
        proc.stop()
        raise Unavailable(f"did not start again: {_first_error(proc, d)}")
    for url in urls[1:]:
        head = subprocess.run(["curl", "-s", "-o", "/dev/null", "-D", "-", "--max-time", "120", "-x", proxy, url],
                              capture_output=True, text=True).stdout
        if "detail=disk" not in head:
            proc.stop()
            raise Unavailable(f"{url.rsplit('/', 1)[1]} is not a disk hit after the restart: {head!r}")
    return proc


# ---------------------------------------------------------------------------------------------
# Redis: the store of a fleet target's limits

# The Sluice targets with `fleet:`; each starts its own redis-server on the "redis" port (so at
# most one of them per run).
FLEET_TARGETS = {"sluice-fleet", "sluice-reload"}


def start_redis(lab: Lab, target: str) -> Proc:
    """A redis-server for one fleet target, on 127.0.0.1 at the "redis" port, nothing persisted
    (`save ""`, `appendonly no`), its working directory in the run's temp dir; lab.redis[target]."""
    _require("redis-server")
    d = lab.dir(f"{target}-redis")
    port = lab.port(helper_of(target, "redis"))
    proc = lab.start(f"{target}-redis", ["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                                         "--save", "", "--appendonly", "no", "--dir", str(d)])
    if not wait_port(port, proc, 10):
        proc.stop()
        raise Unavailable(f"redis-server did not start: {_first_error(proc, d)}")
    lab.redis[target] = proc
    return proc


def redis_commandstats(port: int, timeout: float = 5.0) -> dict[str, dict[str, int]]:
    """`INFO commandstats` of the Redis on 127.0.0.1:port, over a raw RESP connection:
    {"evalsha": {"calls": N, "usec": ..., "failed_calls": ...}, ...} (stats.parse_commandstats)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(b"*2\r\n$4\r\nINFO\r\n$12\r\ncommandstats\r\n")
        buf = b""
        while b"\r\n" not in buf:
            buf += _recv(sock)
        head, _, rest = buf.partition(b"\r\n")
        if not head.startswith(b"$"):
            raise OSError(f"Redis answered INFO with {head[:80]!r}")
        size = int(head[1:])
        while len(rest) < size:
            rest += _recv(sock)
    return stats.parse_commandstats(rest[:size].decode(errors="replace"))


def _recv(sock: socket.socket) -> bytes:
    data = sock.recv(65536)
    if not data:
        raise OSError("Redis closed the connection")
    return data


# ---------------------------------------------------------------------------------------------
# The peers

# nginx-pipeline's share of sluice-pipeline's work (PIPELINE), as haproxy-pipeline's: the
# `headers`, `bearer` and `api_key` adapters' edits (proxy_set_header; "" removes a header), and a
# JSON line per request to a file, buffered as Sluice's access log is (its lines go to a writer
# thread in batches): 64 KiB or one second, whichever comes first.
NGINX_PIPELINE_HTTP = """    log_format bench escape=json '{"time":"$time_iso8601","client":"$remote_addr","method":"$request_method",'
                                 '"url":"$request_uri","status":$status,"bytes":$body_bytes_sent,"ms":$request_time}';
"""
NGINX_PIPELINE_SERVER = "        access_log {d}/access.log bench buffer=64k flush=1s;\n"
NGINX_PIPELINE_LOCATION = """            proxy_set_header X-Forwarded-By sluice;
            proxy_set_header X-Debug "";
            proxy_set_header Authorization "Bearer bench-token-0123456789";
            proxy_set_header X-Api-Key bench-key-0123456789;
"""

# nginx-lua: Debian's libnginx-mod-http-lua (lua-nginx-module on LuaJIT, with the NDK it needs),
# loaded by this configuration alone (the harness's nginx reads no /etc/nginx/modules-enabled).
NGINX_LUA_MODULES = ("/usr/share/nginx/modules/ndk_http_module.so",
                     "/usr/share/nginx/modules/ngx_http_lua_module.so")
# The `lua` scenario's edit (LUA_EDIT) in the rewrite phase, before proxy_pass sends the request.
NGINX_LUA_EDIT = """            rewrite_by_lua_block {
                local v = ngx.req.get_headers()["x-client"]
                ngx.req.set_header("X-Seen", v or "none")
            }
"""


def nginx_proxy_body(lab: Lab, name: str) -> str:
    """The http block's contents of an nginx target (start_nginx_proxy):
    nginx          -- a forward proxy to the one origin, no log, no header edits: its best case;
    nginx-cache    -- nginx plus proxy_cache;
    nginx-pipeline -- nginx plus the work of sluice-pipeline, as haproxy-pipeline does it: the
                      same three header edits and a JSON access log line per request to a file
                      (NGINX_PIPELINE_*);
    nginx-lua      -- nginx-pipeline plus the `lua` scenario's edit in Lua (NGINX_LUA_EDIT)."""
    d = lab.dir(name)
    http = server = location = cache_path = ""
    if name == "nginx-cache":
        size = "2g" if lab.big_file else "64m"   # with big_download: room for the 1 GiB object
        cache_path = (f"proxy_cache_path {d}/cache levels=1:2 keys_zone=hits:10m max_size={size} inactive=1h "
                      "use_temp_path=off;")
        location = """            proxy_cache hits;
            proxy_cache_valid 200 1h;
            add_header X-Cache-Status $upstream_cache_status;
"""
    if name in ("nginx-pipeline", "nginx-lua"):
        http, server = NGINX_PIPELINE_HTTP, NGINX_PIPELINE_SERVER.format(d=d)
        location = NGINX_PIPELINE_LOCATION + (NGINX_LUA_EDIT if name == "nginx-lua" else "")
    return f"""    {cache_path}
{http}    upstream origin {{
        server {lab.origin_host};
        keepalive 1024;
        keepalive_requests 1000000;
        keepalive_timeout 60s;
    }}
    server {{
        listen 127.0.0.1:{lab.port(name)} backlog=4096;
{server}        location / {{
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            # Stream large bodies through memory buffers, never through a temp file.
            proxy_max_temp_file_size 0;
{location}        }}
    }}"""


def nginx_lua_main() -> str:
    """The main-context lines that load the Lua module (nginx-lua)."""
    return "".join(f"load_module {module};\n" for module in NGINX_LUA_MODULES)


def nginx_callgrind_conf(lab: Lab, name: str, port: int) -> str:
    """`name`'s configuration for the callgrind measure: one process and no master (valgrind
    sees the process that serves), listening on `port`, its files in its own directory."""
    d = lab.dir(f"callgrind-{name}")
    main = nginx_lua_main() if name == "nginx-lua" else ""
    body = nginx_proxy_body(lab, name).replace(f"listen 127.0.0.1:{lab.port(name)} ", f"listen 127.0.0.1:{port} ")
    body = body.replace(str(lab.dir(name)), str(d))
    return _nginx_conf(lab, d, "1", body, main).replace("master_process on;", "master_process off;")


def start_nginx_proxy(lab: Lab, name: str) -> Proc:
    """nginx is no general forward proxy; this is its best case: absolute-form requests (nginx
    accepts them and routes on the path) sent to one fixed upstream over a pool of kept-alive
    connections. nginx-cache adds proxy_cache (a keys zone, files in the temp dir, which the
    page cache holds); nginx-pipeline and nginx-lua add the pipeline's work and the Lua edit
    (nginx_proxy_body)."""
    main = ""
    if name == "nginx-lua":
        missing = [m for m in NGINX_LUA_MODULES if not Path(m).exists()]
        if missing:
            raise Unavailable(f"libnginx-mod-http-lua is not installed (no {missing[0]})")
        main = nginx_lua_main()
    workers = lab.sluice_workers if name == "nginx-cache" else "auto"
    proc = _start_nginx(lab, name, workers, nginx_proxy_body(lab, name), lab.port(name), main)
    if name == "nginx-cache" and lab.big_file:
        # The 1 GiB object stored before anything is measured (as sluice-disk's, which is fetched
        # before its restart); a second fetch must be a hit.
        url, proxy = f"http://{lab.origin_host}/1g", f"http://127.0.0.1:{lab.port(name)}"
        for _ in range(2):
            head = subprocess.run(["curl", "-s", "-o", "/dev/null", "-D", "-", "--max-time", "120", "-x", proxy, url],
                                  capture_output=True, text=True).stdout
        if "x-cache-status: hit" not in head.lower():
            proc.stop()
            raise Unavailable(f"nginx does not answer the 1 GiB object from its cache: {head!r}")
    return proc


# haproxy-pipeline's share of sluice-pipeline's work (PIPELINE): the `headers`, `bearer` and
# `api_key` adapters' edits, and a JSON line per request (the fields Sluice's access log has
# that haproxy knows) to stdout, which start_haproxy sends to a file.
HAPROXY_PIPELINE = """    http-request set-header X-Forwarded-By sluice
    http-request del-header X-Debug
    http-request set-header Authorization "Bearer bench-token-0123456789"
    http-request set-header X-Api-Key bench-key-0123456789
    log stdout format raw local0 info
    option httplog
    log-format '{"time":"%tr","client":"%ci","method":"%HM","url":"%HU","status":%ST,"bytes":%B,"ms":%Ta}'
"""


# haproxy-lua: the `lua` scenario's edit (LUA_EDIT) as an action of haproxy's Lua 5.3, run by
# `http-request lua.edit` after haproxy-pipeline's edits. Header names in req_get_headers() are
# lower case, each a table of values from index 0.
HAPROXY_LUA_EDIT = """-- generated by Benchmarks/bench (haproxy-lua)
core.register_action("edit", { "http-req" }, function(txn)
    local v = txn.http:req_get_headers()["x-client"]
    txn.http:req_set_header("X-Seen", v and v[0] or "none")
end)
"""

# The haproxy targets that log to stdout (start_haproxy sends it to a file).
HAPROXY_LOGGING = {"haproxy-pipeline", "haproxy-lua"}


def haproxy_cfg(lab: Lab, name: str) -> str:
    """The configuration start_haproxy writes for `name`. haproxy-lua loads its script with
    `lua-load-per-thread`: a Lua state per thread, as Sluice keeps one per worker (with plain
    `lua-load` every thread would share one state under one lock)."""
    tls = f" ssl verify required ca-file {lab.tmp}/ca.pem" if name == "haproxy-tls" else ""
    pipeline = HAPROXY_PIPELINE if name in HAPROXY_LOGGING else ""
    what = "the pipeline's header edits and an access log" if pipeline else "no logging"
    lua = ""
    if name == "haproxy-lua":
        what += ", and the Lua edit"
        pipeline += "    http-request lua.edit\n"
        lua = f"    lua-load-per-thread {lua_script(lab, name)}\n"
    # About two descriptors per connection; haproxy refuses maxconn above what the limit allows.
    maxconn = min((lab.nofile - 200) // 2, 20000)
    return f"""# generated by Benchmarks/bench: haproxy as a forward proxy ({what})
global
    nbthread {_cores()}
    maxconn {maxconn}
{lua}
defaults
    mode http
    option http-keep-alive
    timeout connect 5s
    timeout client 75s
    timeout server 75s
    timeout http-request 30s
    timeout http-keep-alive 75s

frontend forward
    bind 127.0.0.1:{lab.port(name)} backlog 4096
    maxconn {maxconn}
    http-request set-dst url_ip
    http-request set-dst-port url_port
{pipeline}    default_backend dynamic

backend dynamic
    http-reuse always
    server origin 0.0.0.0:0{tls}
"""


def start_haproxy(lab: Lab, name: str) -> Proc:
    """haproxy has no forward-proxy mode; the known trick: each request's destination is the
    address and port of its absolute-form URL (an IP literal here), and the one server is
    "wherever the connection was set to go". Idle server connections are shared between client
    connections (`http-reuse always`), like the other proxies' pools; one thread per core.
    haproxy-tls: the same, over TLS to the origin (verified against the TLS origin's CA, HTTP/1.1),
    as sluice-http1 does for plain-http clients.
    haproxy-pipeline: the work of sluice-pipeline (PIPELINE): the same three header edits and a
    JSON access log line per request written to a file (haproxy writes its log to stdout, which
    goes to the file; it cannot open a file itself).
    haproxy-lua: haproxy-pipeline plus the Lua edit (HAPROXY_LUA_EDIT, in the target's directory)."""
    _require("haproxy")
    d = lab.dir(name)
    if name == "haproxy-lua":
        lua_script(lab, name).write_text(HAPROXY_LUA_EDIT)
    (d / "haproxy.cfg").write_text(haproxy_cfg(lab, name))
    command = ["haproxy", "-db", "-f", str(d / "haproxy.cfg")]   # -db: foreground
    if name in HAPROXY_LOGGING:
        command = ["sh", "-c", f'exec "$@" >{d}/access.log', "sh", *command]
    proc = lab.start(name, command)
    if not wait_port(lab.port(name), proc, 10):
        raise Unavailable(f"did not start: {_first_error(proc, d)}")
    return proc


def start_squid(lab: Lab, name: str) -> Proc:
    """squid with one SMP worker per core. squid: a pure forwarder (no cache, no logging, no
    per-client tables); squid-cache: the shared memory cache (`cache_mem 64 MB`, no disk cache,
    `refresh_pattern . 60 100% 3600`) and an access log that shows the hits. Its own service name
    (-n) keeps its shared memory and sockets apart from any other squid on the machine."""
    _require("squid")
    d = lab.dir(name)
    workers = lab.sluice_workers if name == "squid-cache" and lab.sluice_workers != "auto" else _cores()
    if name == "squid":
        caching = """access_log none
cache deny all
cache_mem 0 MB
client_db off
pinger_enable off"""
    else:
        caching = f"""access_log stdio:{d}/access.log
cache_mem 64 MB
maximum_object_size_in_memory 1 MB
memory_cache_shared on
refresh_pattern . 60 100% 3600"""
    (d / "squid.conf").write_text(f"""# generated by Benchmarks/bench ({name})
http_port 127.0.0.1:{lab.port(name)}
visible_hostname sluice-bench
workers {workers}
pid_filename {d}/squid.pid
cache_log {d}/cache.log
cache_store_log none
logfile_rotate 0
coredump_dir {d}
{caching}
max_filedescriptors {lab.nofile}
shutdown_lifetime 0 seconds
acl bench_clients src 127.0.0.0/8
http_access allow bench_clients
http_access deny all
""")
    if lab.is_root:
        _chown_tree(d, "proxy")
        run_dir = Path("/run/squid")
        if not run_dir.exists():
            run_dir.mkdir(parents=True)
            shutil.chown(run_dir, "proxy", "proxy")
    service = f"bench{lab.port(name)}"
    proc = lab.start(name, ["squid", "-n", service, "--foreground", "-f", str(d / "squid.conf")])
    if not wait_port(lab.port(name), proc, 20):
        raise Unavailable(f"did not start: {_first_error(proc, d)}")
    return proc


def start_trafficserver(lab: Lab, name: str) -> Proc:
    """Apache Traffic Server as a pure forward proxy (cache and logging off, one thread per core):
    traffic_server alone, in the foreground, every directory it uses in the temp dir."""
    _require("traffic_server")
    d = lab.dir(name)
    for sub in ("etc", "log", "run", "cache"):
        (d / sub).mkdir(exist_ok=True)
    (d / "runroot.yaml").write_text(f"""prefix: {d}
exec_prefix: /usr
bindir: /usr/bin
sbindir: /usr/sbin
sysconfdir: {d}/etc
datadir: {d}/share
includedir: /usr/include
libdir: /usr/lib/trafficserver
libexecdir: /usr/lib/trafficserver/modules
localstatedir: {d}/run
runtimedir: {d}/run
logdir: {d}/log
cachedir: {d}/cache
""")
    # Run as root it drops to the package's user, who must own its log and runtime dirs.
    user = "#-1"
    if _user_exists("trafficserver"):
        user = "trafficserver"
        for sub in ("log", "run", "cache"):
            _chown_tree(d / sub, user)
    throttle = min(lab.nofile - 1000, 30000)
    records = {
        "proxy.config.http.server_ports": f"STRING {lab.port(name)}:ipv4:ip-in=127.0.0.1",
        "proxy.config.reverse_proxy.enabled": "INT 0", "proxy.config.url_remap.remap_required": "INT 0",
        "proxy.config.http.cache.http": "INT 0", "proxy.config.exec_thread.autoconfig": "INT 0",
        "proxy.config.exec_thread.limit": f"INT {_cores()}", "proxy.config.accept_threads": "INT 0",
        "proxy.config.task_threads": "INT 1", "proxy.config.admin.user_id": f"STRING {user}",
        "proxy.config.log.logging_enabled": "INT 0", "proxy.config.http.insert_request_via_str": "INT 0",
        "proxy.config.http.insert_response_via_str": "INT 0", "proxy.config.http.insert_client_ip": "INT 0",
        "proxy.config.http.insert_squid_x_forwarded_for": "INT 0",
        "proxy.config.http.keep_alive_no_activity_timeout_in": "INT 75",
        "proxy.config.net.connections_throttle": f"INT {throttle}", "proxy.config.diags.debug.enabled": "INT 0",
    }
    (d / "etc" / "records.config").write_text("".join(f"CONFIG {k} {v}\n" for k, v in records.items()))
    (d / "etc" / "ip_allow.yaml").write_text(
        "ip_allow:\n" + "".join(f"  - apply: {way}\n    ip_addrs: 127.0.0.1\n    action: allow\n    methods: ALL\n"
                                for way in ("in", "out")))
    for f in ("storage.config", "remap.config", "plugin.config", "cache.config", "hosting.config",
              "volume.config", "parent.config", "socks.config", "splitdns.config", "ssl_multicert.config"):
        (d / "etc" / f).write_text("")   # it insists on them; empty storage.config: no cache
    proc = lab.start(name, ["traffic_server", f"--run-root={d}/runroot.yaml"])
    if not wait_port(lab.port(name), proc, 30):
        raise Unavailable(f"did not start: {_first_error(proc, d)}")
    return proc


def start_tinyproxy(lab: Lab, name: str) -> Proc:
    _require("tinyproxy")
    d = lab.dir(name)
    user = ""
    if lab.is_root:
        user = "User nobody\nGroup nogroup\n"
        _chown_tree(d, "nobody", "nogroup")
    # MaxClients: the default 100 would queue the 256-connection runs and the idle clients.
    (d / "tinyproxy.conf").write_text(f"""{user}Port {lab.port(name)}
Listen 127.0.0.1
Timeout 600
MaxClients 2048
LogFile "{d}/tinyproxy.log"
LogLevel Error
PidFile "{d}/tinyproxy.pid"
Allow 127.0.0.1
""")
    proc = lab.start(name, ["tinyproxy", "-d", "-c", str(d / "tinyproxy.conf")])   # -d: foreground
    if not wait_port(lab.port(name), proc, 10):
        raise Unavailable(f"did not start: {_first_error(proc, d)}")
    return proc


STARTERS = {
    "sluice": start_sluice, "sluice-pipeline": start_sluice, "sluice-curl": start_sluice,
    "sluice-metrics": start_sluice, "sluice-cache": start_sluice, "sluice-h2": start_sluice,
    "sluice-http1": start_sluice, "sluice-ratelimit": start_sluice, "sluice-fleet": start_sluice,
    "sluice-http1-curl": start_sluice, "sluice-disk": start_sluice, "sluice-sigv4": start_sluice,
    "sluice-reload": start_sluice, "haproxy": start_haproxy, "haproxy-tls": start_haproxy,
    "haproxy-pipeline": start_haproxy, "haproxy-lua": start_haproxy, "sluice-lua": start_sluice,
    "nginx": start_nginx_proxy, "nginx-cache": start_nginx_proxy, "nginx-pipeline": start_nginx_proxy,
    "nginx-lua": start_nginx_proxy, "squid": start_squid,
    "squid-cache": start_squid, "trafficserver": start_trafficserver, "tinyproxy": start_tinyproxy,
}
SLUICE_TARGETS = {name for name, f in STARTERS.items() if f is start_sluice}


def _require(command: str):
    if shutil.which(command) is None:
        raise Unavailable(f"{command} is not installed")


def _cores() -> int:
    return os.cpu_count() or 2


def _user_exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
        return True
    except KeyError:
        return False


def _chown_tree(d: Path, user: str, group: str | None = None):
    for path in [d, *d.rglob("*")]:
        shutil.chown(path, user, group or user)
