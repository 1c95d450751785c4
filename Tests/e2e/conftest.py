"""Fixtures for Sluice's end-to-end tests: real upstreams, real clients, the real binary.

Everything listens on 127.0.0.1 on ports picked in 20000-30000. Session-scoped upstreams
(httpbin on gunicorn, nginx with a test CA, an upload sink) start once; fault servers and
Sluice itself start per test. Every child process is killed at session end.

Run: python3 -m pytest Tests/e2e -q        (SLUICE_BIN overrides the binary's path;
     -m "not heavy" leaves out the 1 GiB tests; SLUICE_E2E_ENGINE=curl runs them with
     libcurl as the upstream engine, see `with_engine` below and `make e2e-curl`)
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import faultservers  # noqa: E402
from faultservers import HOST, pick_port  # noqa: E402
from support import MiB, clean_env, tail  # noqa: E402

REPO = HERE.parents[1]
SLUICE_BIN = os.environ.get("SLUICE_BIN", str(REPO / ".build" / "release" / "sluice"))
# The upstream engine for plain-http origins in every config sluice_factory writes: native
# (Sluice's own HTTP/1.1 client) or curl (libcurl); unset or empty: Sluice's default (native),
# and the configs are written as the tests give them. `make e2e-curl` sets curl.
E2E_ENGINE = os.environ.get("SLUICE_E2E_ENGINE", "").strip()
if E2E_ENGINE not in ("", "native", "curl"):
    raise pytest.UsageError(f"SLUICE_E2E_ENGINE={E2E_ENGINE!r}: expected native or curl (or unset)")
BIG_SIZE = 1 << 30

# ------------------------------------------------------------------------------------------
# pytest plumbing: markers, per-test deadline
# ------------------------------------------------------------------------------------------


# Modules whose first test builds something of its own (a static release build for the
# container image, the Debian package): run first, so that under pytest-xdist their minutes of
# compiling overlap the rest of the suite instead of trailing it.
BUILDS_FIRST = ("test_docker.py", "test_install.py")


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: 0 if item.path.name in BUILDS_FIRST else 1)  # stable: order kept within each


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    m = item.get_closest_marker("deadline")
    secs = float(m.args[0]) if m else (240.0 if item.get_closest_marker("heavy") else 60.0)

    def on_alarm(signum, frame):
        raise TimeoutError(f"test body exceeded its {secs:.0f}s deadline")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, secs)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# ------------------------------------------------------------------------------------------
# Child processes
# ------------------------------------------------------------------------------------------

_children: list[subprocess.Popen] = []
_children_lock = threading.Lock()


def spawn(args: list[str], **kw) -> subprocess.Popen:
    kw.setdefault("env", clean_env())
    p = subprocess.Popen(args, start_new_session=True, **kw)
    with _children_lock:
        _children.append(p)
    return p


def kill_tree(p: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Signal the child's own process group (it was started in its own session)."""
    if p.poll() is not None:
        return
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            p.send_signal(sig)
        except ProcessLookupError:
            pass


def _kill_all_children() -> None:
    with _children_lock:
        kids = list(_children)
    for p in kids:
        kill_tree(p, signal.SIGKILL)
    for p in kids:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


atexit.register(_kill_all_children)  # also on an interrupted run


@pytest.fixture(scope="session", autouse=True)
def _reap_children():
    yield
    _kill_all_children()


def stop_process(p: subprocess.Popen) -> None:
    """SIGTERM to the process tree, then SIGKILL if it is still there after 10 s."""
    if p.poll() is not None:
        return
    kill_tree(p, signal.SIGTERM)
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        kill_tree(p)
        p.wait(timeout=5)


def wait_port(port: int, timeout: float = 15.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(0.5)
        try:
            s.connect((HOST, port))
            return
        except OSError:
            time.sleep(0.02)  # poll interval: until the port accepts or the timeout
        finally:
            s.close()
    raise TimeoutError(f"nothing listening on {HOST}:{port} after {timeout}s")


# ------------------------------------------------------------------------------------------
# Sluice
# ------------------------------------------------------------------------------------------


class Sluice:
    def __init__(self, config_path: Path, port: int, workdir: Path):
        self.config_path = config_path
        self.port = port
        self.url = f"http://{HOST}:{port}"
        self.out_path = workdir / f"sluice-{port}.stdout"
        self.err_path = workdir / f"sluice-{port}.stderr"
        self.proc: subprocess.Popen | None = None
        self.expected_exit = False
        self.stop_rc: int | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 15.0, env: dict[str, str] | None = None) -> "Sluice":
        """`env`: variables added to the clean environment Sluice runs in."""
        self.out_f = open(self.out_path, "wb")
        self.err_f = open(self.err_path, "wb")
        self.proc = spawn([SLUICE_BIN, "run", "--config", str(self.config_path)],
                          stdout=self.out_f, stderr=self.err_f, stdin=subprocess.DEVNULL,
                          env=clean_env(**(env or {})))
        try:
            wait_port(self.port, timeout, self.proc)
            # The workers' listeners are bound before the admin API's: a test that asks the
            # admin API first waits for it too.
            admin = (yaml.safe_load(self.config_path.read_text()) or {}).get("admin") or {}
            if isinstance(admin, dict) and str(admin.get("listen", "")).startswith(f"{HOST}:"):
                wait_port(int(str(admin["listen"]).rsplit(":", 1)[1]), timeout, self.proc)
        except Exception as e:
            kill_tree(self.proc)
            self.proc.wait(timeout=5)
            raise RuntimeError(f"sluice did not start: {e}\nconfig:\n{self.config_path.read_text()}\n"
                               f"stderr:\n{self.stderr()}") from e
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def status(self) -> dict[str, int]:
        """VmRSS / VmHWM and friends from /proc, in KiB."""
        out = {}
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS", "VmHWM", "VmSize", "Threads")):
                    k, v = line.split(":", 1)
                    out[k] = int(v.split()[0])
        return out

    def rss_kib(self) -> int:
        return self.status()["VmRSS"]

    def hwm_kib(self) -> int:
        return self.status()["VmHWM"]

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.stop_rc = self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                kill_tree(self.proc)
                self.proc.wait(timeout=5)
                self.stop_rc = None
        for f in (self.out_f, self.err_f):
            f.close()
        return self.stop_rc

    def stderr(self) -> str:
        return tail(self.err_path)

    def stdout(self) -> str:
        return tail(self.out_path)


@contextlib.contextmanager
def shared_lock(path: Path):
    """An exclusive lock on `path` (created if missing) held across pytest-xdist workers."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def with_engine(cfg: dict) -> dict:
    """cfg with SLUICE_E2E_ENGINE's `engine` in policies.default.upstream (the section and the
    default policy are created when missing) and in every host policy's own `upstream` section
    (a host's `upstream` replaces the default's as a whole: docs/configuration.md, "Upstream
    engine"). An `engine` the test wrote itself is kept, and `native` is not written beside
    `http2: prior_knowledge` on plain http (h2c: a config error; libcurl serves it anyway).
    Unchanged when the variable is unset."""
    if not E2E_ENGINE:
        return cfg
    cfg = dict(cfg)
    policies = dict(cfg.get("policies") or {})
    for name, policy in list(policies.items()):
        if name == "default" or (isinstance(policy, dict) and isinstance(policy.get("upstream"), dict)):
            policy = dict(policy or {})
            section = dict(policy.get("upstream") or {})
            if E2E_ENGINE == "native" and section.get("http2") == "prior_knowledge" and section.get("scheme") != "https":
                continue
            policy["upstream"] = {"engine": E2E_ENGINE, **section}
            policies[name] = policy
    if "default" not in policies:
        policies["default"] = {"upstream": {"engine": E2E_ENGINE}}
    cfg["policies"] = policies
    return cfg


@pytest.fixture(scope="session")
def sluice_bin() -> str:
    if not (os.path.isfile(SLUICE_BIN) and os.access(SLUICE_BIN, os.X_OK)):
        pytest.fail(f"sluice binary not found at {SLUICE_BIN}: build it (swift build -c release) "
                    f"or set SLUICE_BIN", pytrace=False)
    return SLUICE_BIN


@pytest.fixture
def sluice_factory(sluice_bin, tmp_path, pki, nginx):
    """start(overrides: dict) -> running Sluice; overrides deep-merge into the test defaults
    (a None value deletes a key). Stopped with SIGTERM at teardown; its logs are printed
    (pytest shows them for failing tests) and a crash during the test fails it."""
    started: list[Sluice] = []

    def start(overrides: dict | None = None, name: str = "sluice", env: dict[str, str] | None = None) -> Sluice:
        port = pick_port()
        cfg = {
            "listen": [f"{HOST}:{port}"],
            "timeouts": {"drain": "5s"},
            "access": {"connect_ports": [443, nginx.https_port]},
            "tls": {"ca_file": str(pki.ca_pem)},
        }
        cfg = with_engine(deep_merge(cfg, overrides or {}))
        port = int(str(cfg["listen"][0]).rsplit(":", 1)[1])  # a test may pass its own listen list
        path = tmp_path / f"{name}-{port}.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        s = Sluice(path, port, tmp_path)
        started.append(s)
        return s.start(env=env)

    yield start

    problems = []
    for s in started:
        crashed_rc = s.proc.poll() if s.proc else None
        rc = s.stop()
        print(f"---- sluice :{s.port} config {s.config_path.name} ----\n{s.config_path.read_text()}"
              f"---- exit code at teardown: {rc if crashed_rc is None else crashed_rc} ----\n"
              f"---- stderr (tail) ----\n{s.stderr()}\n---- stdout (tail) ----\n{s.stdout()}")
        if crashed_rc is not None and not s.expected_exit:
            problems.append(f"sluice :{s.port} exited during the test with code {crashed_rc}")
        elif rc is not None and rc < 0 and rc != -signal.SIGTERM:
            problems.append(f"sluice :{s.port} died from signal {-rc} at shutdown")
    if problems:
        pytest.fail("; ".join(problems), pytrace=False)


@pytest.fixture
def proxy(sluice_factory) -> Sluice:
    """Sluice with the test defaults (test CA trusted, CONNECT allowed to nginx's TLS port)."""
    return sluice_factory()


# ------------------------------------------------------------------------------------------
# Test PKI (openssl CLI) and nginx
# ------------------------------------------------------------------------------------------


class PKI:
    def __init__(self, d: Path):
        self.dir = d
        self.ca_pem = d / "ca.pem"
        self.ca_key = d / "ca.key"
        self.leaf_pem = d / "leaf.pem"
        self.leaf_key = d / "leaf.key"
        self.chain_pem = d / "leaf-chain.pem"
        self.wrong_chain_pem = d / "wrong-chain.pem"  # valid chain, but only for wrong.test
        self.wrong_key = d / "wrong.key"


def _openssl(args: list[str], cwd: Path) -> None:
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {r.stderr.decode()}")


@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> PKI:
    d = tmp_path_factory.mktemp("pki")
    p = PKI(d)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(["req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "3",
              "-subj", "/CN=Sluice E2E Test CA",
              "-addext", "basicConstraints=critical,CA:TRUE",
              "-addext", "keyUsage=critical,keyCertSign,cRLSign",
              "-addext", "subjectKeyIdentifier=hash"], d)
    _openssl(["req", "-new", *ec, "-keyout", "leaf.key", "-out", "leaf.csr", "-subj", "/CN=127.0.0.1"], d)
    (d / "leaf.ext").write_text(
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid,issuer\n")
    _openssl(["x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
              "-CAcreateserial", "-out", "leaf.pem", "-days", "2", "-extfile", "leaf.ext"], d)
    p.chain_pem.write_bytes(p.leaf_pem.read_bytes() + p.ca_pem.read_bytes())
    _openssl(["req", "-new", *ec, "-keyout", "wrong.key", "-out", "wrong.csr", "-subj", "/CN=wrong.test"], d)
    (d / "wrong.ext").write_text((d / "leaf.ext").read_text().replace(
        "subjectAltName=IP:127.0.0.1,DNS:localhost", "subjectAltName=DNS:wrong.test"))
    _openssl(["x509", "-req", "-in", "wrong.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
              "-CAcreateserial", "-out", "wrong.pem", "-days", "2", "-extfile", "wrong.ext"], d)
    p.wrong_chain_pem.write_bytes((d / "wrong.pem").read_bytes() + p.ca_pem.read_bytes())
    return p


class Nginx:
    def __init__(self, d: Path, www: Path, http_port: int, https_port: int, https_wrong_name_port: int):
        self.dir = d
        self.www = www
        self.http_port = http_port
        self.https_port = https_port
        self.https_wrong_name_port = https_wrong_name_port
        self.proc: subprocess.Popen | None = None
        self.file_1k = b""
        self.medium = b""
        self.json_body = b""
        self.json_gz = b""

    def url(self, path: str) -> str:
        return f"http://{HOST}:{self.http_port}{path}"

    def tls_url(self, path: str) -> str:
        return f"https://{HOST}:{self.https_port}{path}"


def nginx_conf(d: Path, http_body: str, *, connections: int = 1024, error_level: str = "warn",
               log_directives: str | None = None) -> str:
    """An nginx.conf for a test server: one worker in the foreground, pid, logs and temp files
    under d, and `http_body` (already formatted) inside `http { }`; runs as root when we are."""
    user = "user root root;\n" if os.geteuid() == 0 else ""
    temp = "".join(f"    {k}_temp_path {d}/{k};\n" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return (f"{user}worker_processes 1;\ndaemon off;\npid {d}/nginx.pid;\nerror_log {d}/error.log {error_level};\n"
            f"events {{ worker_connections {connections}; }}\nhttp {{\n"
            f"    {log_directives if log_directives is not None else f'access_log {d}/access.log;'}\n{temp}{http_body}}}\n")


NGINX_HTTP = """\
    types {{ application/octet-stream bin; application/json json; text/plain txt; }}
    default_type application/octet-stream;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 100000;
    server {{
        listen {host}:{http_port};
        root {www};
        location = /data.json {{ gzip_static on; gzip_proxied any; }}
    }}
    server {{
        listen {host}:{https_port} ssl;
        ssl_certificate {chain};
        ssl_certificate_key {key};
        root {www};
        # What a request carried in `Sluice-Lua-Depth` (test_lua_http.py): "[]" for nothing.
        location = /echo/lua-depth {{ default_type text/plain; return 200 "[$http_sluice_lua_depth]"; }}
    }}
    server {{
        listen {host}:{https_wrong_name_port} ssl;
        ssl_certificate {wrong_chain};
        ssl_certificate_key {wrong_key};
        root {www};
    }}
"""


@pytest.fixture(scope="session")
def nginx(tmp_path_factory, pki) -> Nginx:
    d = tmp_path_factory.mktemp("nginx")
    www = d / "www"
    www.mkdir()
    n = Nginx(d, www, pick_port(), pick_port(), pick_port())
    n.file_1k = os.urandom(1024)
    (www / "1k").write_bytes(n.file_1k)
    n.medium = os.urandom(32 * MiB)
    (www / "medium.bin").write_bytes(n.medium)
    n.json_body = json.dumps({"items": [{"n": i, "name": f"item-{i}", "pad": "x" * 40} for i in range(300)]}).encode()
    n.json_gz = gzip.compress(n.json_body, mtime=0)
    (www / "data.json").write_bytes(n.json_body)
    (www / "data.json.gz").write_bytes(n.json_gz)
    conf = d / "nginx.conf"
    conf.write_text(nginx_conf(d, NGINX_HTTP.format(
        www=www, host=HOST,
        http_port=n.http_port, https_port=n.https_port, chain=pki.chain_pem, key=pki.leaf_key,
        https_wrong_name_port=n.https_wrong_name_port, wrong_chain=pki.wrong_chain_pem, wrong_key=pki.wrong_key)))
    log = open(d / "stderr.log", "wb")
    n.proc = spawn(["nginx", "-p", str(d), "-e", str(d / "error.log"), "-c", str(conf)],
                   stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    try:
        wait_port(n.http_port, 15, n.proc)
        wait_port(n.https_port, 15, n.proc)
        wait_port(n.https_wrong_name_port, 15, n.proc)
    except Exception as e:
        raise RuntimeError(f"nginx did not start: {e}\n{tail(d / 'stderr.log')}\n{tail(d / 'error.log')}")
    yield n
    stop_process(n.proc)
    log.close()


class BigFile:
    def __init__(self, path: Path, sha256: str, size: int, url_path: str):
        self.path = path
        self.sha256 = sha256
        self.size = size
        self.url_path = url_path


@pytest.fixture(scope="session")
def big_file(nginx, tmp_path_factory) -> BigFile:
    """1 GiB of random bytes served by nginx at /big.bin; its sha256 computed while writing.

    Made once per run, not once per pytest-xdist worker: the first worker to need it writes
    it into the run's shared temporary directory under a lock, the others wait for it; each
    worker's nginx serves a hard link. The last worker done with it removes it."""
    shared = tmp_path_factory.getbasetemp().parent
    path, sha_path, users = shared / "big.bin", shared / "big.bin.sha256", shared / "big.bin.users"
    with shared_lock(shared / "big.bin.lock"):
        if not sha_path.exists():
            r = subprocess.run(["bash", "-c", f"set -o pipefail; head -c {BIG_SIZE} /dev/urandom | tee {path} | sha256sum"],
                               capture_output=True, timeout=180)
            assert r.returncode == 0, r.stderr
            sha_path.write_text(r.stdout.split()[0].decode() + "\n")
        users.write_text(str(int(users.read_text() or 0) + 1) if users.exists() else "1")
    sha = sha_path.read_text().strip()
    assert path.stat().st_size == BIG_SIZE
    served = nginx.www / "big.bin"
    os.link(path, served)
    (nginx.dir / "big.bin.sha256").write_text(sha + "\n")
    yield BigFile(served, sha, BIG_SIZE, "/big.bin")
    served.unlink(missing_ok=True)
    with shared_lock(shared / "big.bin.lock"):
        left = int(users.read_text()) - 1
        users.write_text(str(left))
        if left == 0:
            path.unlink(missing_ok=True)
            sha_path.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------
# Python upstreams in subprocesses
# ------------------------------------------------------------------------------------------


class PyServer:
    def __init__(self, kind: str, d: Path):
        self.port = pick_port()
        self.url = f"http://{HOST}:{self.port}"
        self.log_path = d / f"{kind}.log"
        self.log = open(self.log_path, "wb")
        self.proc = spawn([sys.executable, str(HERE / "faultservers.py"), kind, str(self.port)],
                          stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL)
        try:
            wait_port(self.port, 30, self.proc)
        except Exception as e:
            raise RuntimeError(f"{kind} did not start: {e}\n{tail(self.log_path)}")

    def stop(self):
        kill_tree(self.proc, signal.SIGTERM)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            kill_tree(self.proc)
        self.log.close()


@pytest.fixture(scope="session")
def httpbin(tmp_path_factory) -> PyServer:
    s = PyServer("httpbin", tmp_path_factory.mktemp("httpbin"))
    yield s
    s.stop()


@pytest.fixture(scope="session")
def upload_sink(tmp_path_factory) -> PyServer:
    s = PyServer("upload-sink", tmp_path_factory.mktemp("upload-sink"))
    yield s
    s.stop()


# ------------------------------------------------------------------------------------------
# In-process fault servers (fresh per test, so what they record belongs to that test)
# ------------------------------------------------------------------------------------------


def _server_fixture(cls):
    @pytest.fixture
    def fx():
        s = cls()
        yield s
        s.stop()
    return fx


recorder = _server_fixture(faultservers.RecordingServer)
stall_server = _server_fixture(faultservers.StallServer)
close_server = _server_fixture(faultservers.CloseServer)
garbage_server = _server_fixture(faultservers.GarbageServer)
reset_server = _server_fixture(faultservers.ResetServer)
slow_forever_server = _server_fixture(faultservers.SlowForeverServer)
slow_sink_server = _server_fixture(faultservers.SlowSinkServer)
banner_server = _server_fixture(faultservers.BannerServer)
echo_server = _server_fixture(faultservers.EchoServer)
blackhole = _server_fixture(faultservers.Blackhole)


@pytest.fixture
def closed_port() -> int:
    """A loopback port with nothing listening on it."""
    return pick_port()
