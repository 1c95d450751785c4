"""The container image (docker/, docs/operations.md "Container image"), built and run for real
without a Docker engine: `make image` builds it with buildah (a static-stdlib binary, the base
image from debootstrap when missing), and Sluice runs inside it with `buildah run
--isolation=chroot`, which keeps the host's network namespace, so everything stays on loopback.

What it proves: the image carries the settings an engine acts on (non-root numeric user, the
HEALTHCHECK command, STOPSIGNAL SIGTERM, /etc/sluice a volume, port 3128, the entry point) and
the shipped docker/sluice.yaml; the binary finds every library it needs in the image and no
Swift runtime library; Sluice started from the image's entry point with a configuration
mounted at /etc/sluice, as the image's own user inside the image's root file system, proxies
a request (body intact, Via added both ways, an access-log line on stdout), refuses to proxy to
its own admin listener (the shipped access.deny), the image's HEALTHCHECK command succeeds
against it and fails when nothing or something else answers, sends SLUICE_ADMIN_TOKEN when
set, and SIGTERM (what `docker stop` sends the container's PID 1) ends it with exit 0.

Skipped only where buildah is absent (scripts/install-deps.sh test installs it). The first
run builds the static binary (minutes) and the base image (debootstrap); later runs reuse
.build-static/, the base image and buildah's layer cache. The timings are printed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
import yaml

from conftest import REPO, spawn, wait_port
from faultservers import HOST, pick_port
from support import clean_env, tail, wait_until

# One worker runs the module: its image fixture is per module and per worker, and two
# `make image` at once race in buildah's layer cache ("layer not known").
pytestmark = [pytest.mark.skipif(shutil.which("buildah") is None,
                                 reason="buildah is not installed (scripts/install-deps.sh test)"),
              pytest.mark.xdist_group("docker-image")]

IMAGE = "localhost/sluice:e2e"
SHIPPED_CONFIG = REPO / "docker" / "sluice.yaml"
# The upstream listens on a loopback address other than Sluice's admin listener (127.0.0.1),
# so the shipped deny list can stay in force for the admin address.
UPSTREAM_HOST = "127.0.0.2"
UID = 999


def report(request, line: str) -> None:
    """A line in pytest's output even under -q and output capture (timings)."""
    plugins = request.config.pluginmanager
    reporter, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
    if reporter is None or capture is None:
        print(f"test_docker: {line}")
        return
    with capture.global_and_fixture_disabled():
        reporter.ensure_newline()
        reporter.write_line(f"test_docker: {line}")


def buildah(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    p = subprocess.run(["buildah", *args], capture_output=True, text=True, timeout=timeout,
                       env=clean_env())
    if check and p.returncode != 0:
        raise AssertionError(f"buildah {' '.join(args)} exited {p.returncode}:\n{p.stdout}{p.stderr}")
    return p


def run_in(ctr: str, *command: str, env: dict[str, str] | None = None,
           check: bool = True) -> subprocess.CompletedProcess:
    """`buildah run` a command in the container as the image's user, like `docker exec`."""
    args = ["run", "--isolation=chroot"]
    for k, v in (env or {}).items():
        args += ["--env", f"{k}={v}"]
    return buildah(*args, ctr, "--", *command, check=check)


# ------------------------------------------------------------------------------------------
# The image and a container of it
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def image(request, tmp_path_factory) -> dict:
    """`make image` with a test tag; its configuration as `buildah inspect` shows it. The
    image stays in the local storage, like .build-static/: its layers are the next run's
    cache (`buildah rmi localhost/sluice:e2e` removes it)."""
    log = tmp_path_factory.mktemp("image") / "make-image.log"
    cold = {
        "static build": not (REPO / ".build-static" / "release" / "sluice").exists(),
        "base image": buildah("inspect", "--type", "image", "debian:bookworm-slim", check=False).returncode != 0,
    }
    before = buildah("inspect", "--type", "image", "--format", "{{.FromImageID}}", IMAGE, check=False)
    t0 = time.monotonic()
    with open(log, "w") as out:
        p = subprocess.run(["make", "-C", str(REPO), "image", f"IMAGE={IMAGE}"], stdout=out,
                           stderr=subprocess.STDOUT, env=clean_env(), timeout=3600)
    elapsed = time.monotonic() - t0
    assert p.returncode == 0, f"make image exited {p.returncode}:\n{tail(log)}"
    # The previous build of this tag (and its cache layers that the new one does not share)
    # would otherwise stay behind untagged at every change of the sources.
    if before.returncode == 0:
        old_id = before.stdout.strip()
        if old_id and old_id != buildah("inspect", "--type", "image", "--format", "{{.FromImageID}}", IMAGE).stdout.strip():
            buildah("rmi", old_id, check=False)
    text = log.read_text(errors="replace")
    # The base image is made only when it is missing.
    assert ("base image debian:bookworm-slim: made" in text) == cold["base image"], tail(log)
    info = json.loads(buildah("inspect", "--type", "image", IMAGE).stdout)
    size = subprocess.run(["podman", "image", "inspect", "--format", "{{.Size}}", IMAGE],
                          capture_output=True, text=True).stdout.strip()
    fresh = ", ".join(k for k, v in cold.items() if v) or "nothing"
    size_text = f"{int(size) / 1e6:.0f} MB" if size.isdigit() else "unknown"
    report(request, f"make image: {elapsed:.1f}s (made from nothing: {fresh}); image size {size_text}")
    assert size.isdigit() and int(size) < 200e6, f"the image grew to {size_text}"
    return info


@pytest.fixture(scope="module")
def container(image) -> str:
    name = f"sluice-e2e-{os.getpid()}"
    buildah("rm", name, check=False)
    buildah("from", "--name", name, IMAGE)
    try:
        yield name
    finally:
        buildah("rm", name, check=False)


def _descendants(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parents[int(entry)] = int(stat[stat.rindex(")") + 2:].split()[1])
    found, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        kids = [c for c, p in parents.items() if p == pid]
        found += kids
        frontier += kids
    return found


class ContainedSluice:
    """`sluice run` started through the image's entry point and default command in a
    container, with `config` mounted at /etc/sluice (read-only) as a user would."""

    def __init__(self, ctr: str, config: dict, workdir: Path, env: dict[str, str] | None = None):
        self.ctr = ctr
        self.config_dir = Path(tempfile.mkdtemp(prefix="etc-sluice-", dir=workdir))
        self.config_dir.chmod(0o755)                         # the image's user reads it
        (self.config_dir / "sluice.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        (self.config_dir / "sluice.yaml").chmod(0o644)
        self.port = int(config["listen"][0].rsplit(":", 1)[1])
        self.out_path = workdir / f"container-{self.port}.stdout"
        self.err_path = workdir / f"container-{self.port}.stderr"
        self.env = env or {}
        self.proc: subprocess.Popen | None = None

    def start(self, entrypoint_and_cmd: list[str]) -> "ContainedSluice":
        args = ["buildah", "run", "--isolation=chroot", "-v", f"{self.config_dir}:/etc/sluice:ro"]
        for k, v in self.env.items():
            args += ["--env", f"{k}={v}"]
        args += [self.ctr, "--", *entrypoint_and_cmd]
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = spawn(args, stdout=out, stderr=err)
        wait_port(self.port, timeout=30, proc=self.proc)
        return self

    def pid(self) -> int:
        """The sluice process itself (buildah's chroot helpers sit between)."""
        assert self.proc is not None
        for pid in _descendants(self.proc.pid):
            try:
                argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            except OSError:
                continue
            if argv0 == b"/usr/bin/sluice":
                return pid
        raise AssertionError(f"no /usr/bin/sluice under buildah run (pid {self.proc.pid})")

    def stdout(self) -> str:
        return tail(self.out_path)

    def stderr(self) -> str:
        return tail(self.err_path)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.kill(self.pid(), signal.SIGKILL)
            except (AssertionError, ProcessLookupError):
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)


@pytest.fixture
def contained(container, tmp_path):
    started: list[ContainedSluice] = []

    def start(config: dict, command: list[str], env: dict[str, str] | None = None) -> ContainedSluice:
        s = ContainedSluice(container, config, tmp_path, env)
        started.append(s)
        return s.start(command)

    yield start
    for s in started:
        s.stop()


def shipped_config(port: int, admin_port: int) -> dict:
    """docker/sluice.yaml with loopback ports of this test instead of 0.0.0.0:3128 and 9901,
    and 127.0.0.1/32 instead of 127.0.0.0/8 in access.deny (the upstream is on 127.0.0.2).
    Everything else as shipped: allow_clients, the rest of deny, drain, the access log."""
    config = yaml.safe_load(SHIPPED_CONFIG.read_text())
    assert config["listen"] == ["0.0.0.0:3128"] and config["admin"]["listen"] == "127.0.0.1:9901"
    config["listen"] = [f"{HOST}:{port}"]
    config["admin"]["listen"] = f"{HOST}:{admin_port}"
    deny = config["access"]["deny"]
    deny[deny.index("127.0.0.0/8")] = "127.0.0.1/32"
    return config


def entry_command(info: dict) -> list[str]:
    """What an engine runs: ENTRYPOINT + CMD."""
    c = info["Docker"]["config"]
    return list(c["Entrypoint"]) + list(c["Cmd"])


def healthcheck_command(info: dict) -> list[str]:
    test = info["Docker"]["config"]["Healthcheck"]["Test"]
    if test[0] == "CMD-SHELL":
        return ["/bin/sh", "-c", test[1]]
    assert test[0] == "CMD", test
    return list(test[1:])


# ------------------------------------------------------------------------------------------
# An upstream on loopback that echoes what it received
# ------------------------------------------------------------------------------------------


class EchoHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        body = json.dumps({"path": self.path, "headers": dict(self.headers.items()),
                           "marker": "served-from-the-host"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def echo_upstream():
    server = ThreadingHTTPServer((UPSTREAM_HOST, 0), EchoHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://{UPSTREAM_HOST}:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def via_proxy(port: int) -> requests.Session:
    s = requests.Session()
    s.trust_env = False                                      # no proxy variables, no .netrc
    s.proxies = {"http": f"http://{HOST}:{port}"}
    return s


# ------------------------------------------------------------------------------------------
# Tests
# ------------------------------------------------------------------------------------------


def test_image_settings_libraries_and_shipped_config(image, container):
    c = image["Docker"]["config"]
    assert c["User"] == f"{UID}:{UID}"
    assert c["StopSignal"] == "SIGTERM"
    assert "/etc/sluice" in (c.get("Volumes") or {})
    assert "3128/tcp" in (c.get("ExposedPorts") or {})
    assert c["Entrypoint"] == ["/usr/bin/sluice"]
    assert c["Cmd"] == ["run", "--config", "/etc/sluice/sluice.yaml"]
    hc = c["Healthcheck"]
    assert hc["Test"] == ["CMD", "/usr/lib/sluice/healthcheck"], hc
    assert hc["Interval"] == 30 * 10**9 and hc["Timeout"] == 5 * 10**9 and hc["Retries"] == 3, hc

    # The user exists in the image under that id and owns the state directory.
    assert run_in(container, "id", "-un").stdout.strip() == "sluice"
    assert run_in(container, "stat", "-c", "%u:%g %a", "/var/lib/sluice").stdout.strip() == f"{UID}:{UID} 750"
    # The shipped configuration is the image's default one.
    assert run_in(container, "cat", "/etc/sluice/sluice.yaml").stdout == SHIPPED_CONFIG.read_text()
    # Every library resolves inside the image, and the Swift runtime is linked in.
    ldd = run_in(container, "ldd", "/usr/bin/sluice").stdout
    assert "not found" not in ldd, ldd
    assert "libevent_core" in ldd, ldd
    # libcurl is opened on first use (dlopen, Sources/CShims/curl_loader.c), not linked: the
    # image must still hold the one the loader asks for.
    libcurl = run_in(container, "sh", "-c", "ldconfig -p | grep -F 'libcurl.so.4 '", check=False).stdout
    assert "libcurl.so.4" in libcurl, libcurl
    assert not re.search(r"libswift|libFoundation|libdispatch", ldd), ldd
    assert run_in(container, "sh", "-c", "command -v swift swiftc", check=False).stdout == ""
    assert run_in(container, "/usr/bin/sluice", "check", "--config", "/etc/sluice/sluice.yaml").returncode == 0


@pytest.mark.deadline(120)
def test_proxies_through_sluice_in_the_image(request, image, container, contained, echo_upstream):
    port, admin_port = pick_port(), pick_port()
    config = shipped_config(port, admin_port)
    health = healthcheck_command(image)
    health_env = {"SLUICE_ADMIN_ADDRESS": f"{HOST}:{admin_port}"}

    # Nothing runs yet: the HEALTHCHECK fails.
    down = run_in(container, *health, env=health_env, check=False)
    assert down.returncode != 0 and "unhealthy: nothing listens" in down.stdout, down

    t0 = time.monotonic()
    sluice = contained(config, entry_command(image))
    report(request, f"sluice in the container listening after {time.monotonic() - t0:.2f}s")
    ctr = container
    pid = sluice.pid()

    # It runs as the image's user, inside the image's root file system.
    uids = re.search(r"^Uid:\s+(.*)$", Path(f"/proc/{pid}/status").read_text(), re.M).group(1).split()
    assert uids == [str(UID)] * 4, uids
    assert os.readlink(f"/proc/{pid}/root") != "/"
    assert Path(f"/proc/{pid}/root/usr/lib/sluice/healthcheck").exists()

    # One request through it to an upstream on the host's loopback.
    r = via_proxy(port).get(f"{echo_upstream}/through/the/image?x=1", timeout=15)
    assert r.status_code == 200, (r.status_code, r.text, sluice.stderr())
    got = r.json()
    assert got["marker"] == "served-from-the-host" and got["path"] == "/through/the/image?x=1"
    assert "sluice" in got["headers"].get("Via", "").lower(), got["headers"]   # added upstream
    assert "sluice" in r.headers.get("Via", "").lower(), r.headers            # and to the client

    # The shipped deny list keeps clients away from the admin listener on the container's
    # loopback, which answers without a token.
    r = via_proxy(port).get(f"http://{HOST}:{admin_port}/healthz", timeout=15)
    assert r.status_code == 403 and "denied by access.deny" in r.text, (r.status_code, r.text)

    # The image's HEALTHCHECK command, run in the container as the engine would.
    t1 = time.monotonic()
    up = run_in(ctr, *health, env=health_env, check=False)
    report(request, f"HEALTHCHECK in the container: {time.monotonic() - t1:.2f}s")
    assert up.returncode == 0 and up.stdout.startswith("healthy: HTTP/1."), up
    # A listener that is not the admin API answers, but not 200: unhealthy.
    other = run_in(ctr, *health, env={"SLUICE_ADMIN_ADDRESS": f"{HOST}:{port}"}, check=False)
    assert other.returncode != 0 and re.match(r"unhealthy: HTTP/1\.. 400", other.stdout), other

    # Access log on stdout (what `docker logs` shows).
    assert wait_until(lambda: "/through/the/image" in sluice.stdout(), 5), sluice.stdout()
    line = next(json.loads(l) for l in sluice.stdout().splitlines() if "/through/the/image" in l)
    assert line["status"] == 200 and line["method"] == "GET", line

    # SIGTERM to the container's process (the image's STOPSIGNAL; `docker stop`): drains, exits 0.
    t2 = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    code = sluice.proc.wait(timeout=15)
    report(request, f"SIGTERM to exit: {time.monotonic() - t2:.2f}s")
    assert code == 0, (code, sluice.stderr())
    assert "draining" in sluice.stderr(), sluice.stderr()


def test_healthcheck_sends_the_admin_token(image, container, contained):
    port, admin_port = pick_port(), pick_port()
    config = shipped_config(port, admin_port)
    config["admin"]["token"] = "${SLUICE_ADMIN_TOKEN}"
    token = "s3cret-admin-token"
    contained(config, entry_command(image), env={"SLUICE_ADMIN_TOKEN": token})
    health = healthcheck_command(image)
    address = {"SLUICE_ADMIN_ADDRESS": f"{HOST}:{admin_port}"}

    ok = run_in(container, *health, env={**address, "SLUICE_ADMIN_TOKEN": token}, check=False)
    assert ok.returncode == 0 and ok.stdout.startswith("healthy:"), ok
    wrong = run_in(container, *health, env={**address, "SLUICE_ADMIN_TOKEN": "wrong"}, check=False)
    assert wrong.returncode != 0 and "401" in wrong.stdout, wrong
    missing = run_in(container, *health, env=address, check=False)
    assert missing.returncode != 0 and "401" in missing.stdout, missing
