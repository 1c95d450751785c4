"""TLS interception (policy `intercept: true`) and the `sluice ca` command line
(.contract-trust.md, "Policy `intercept: true`"; top-level `tls.ca_dir`).

- `sluice ca init|export`: the files, their modes, the CA's extensions, the printed
  fingerprint, refusing to overwrite without --force.
- Interception: a CONNECT to an intercepted host is answered by Sluice itself with a leaf for
  the SNI name signed by the CA from `ca_dir`; the requests inside go through the host's
  policy (adapters, trust evaluation of the real upstream) and get their own access-log lines.
  The upstream here is a dedicated nginx terminating TLS (the test PKI's leaf for 127.0.0.1
  and localhost) in front of httpbin, so what the origin received is echoed back.
- Hosts without `intercept` are tunnelled untouched; a client that rejects Sluice's leaf, or
  an SNI that differs from the CONNECT host, fails the handshake; no CA → no start.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import socket
import ssl
import stat
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from conftest import SLUICE_BIN, kill_tree, nginx_conf, spawn, stop_process, wait_port
from faultservers import pick_port
from policy_support import AccessLog, set_sections, sighup, stderr_len, stderr_since
from rawhttp import RawConn, request_bytes
from support import HOST, RSS_SCALE, clean_env, port_open, run_curl, session_via, tail, wait_until

SLUICE_CA_CN = "Sluice Local CA"
TEST_CA_CN = "Sluice E2E Test CA"
ADAPTER = {"headers": {"set": {"X-Intercepted": "yes"}}}
WRONG_PIN = "sha256/" + base64.b64encode(b"\0" * 32).decode()  # sha256/AAAA...=
PEM_RE = re.compile(r"-----BEGIN CERTIFICATE-----\r?\n.*?-----END CERTIFICATE-----", re.S)


# ------------------------------------------------------------------------------------------
# Helpers: the CLI, openssl
# ------------------------------------------------------------------------------------------


def sluice_cli(*args: str, env: dict | None = None, timeout: float = 20) -> subprocess.CompletedProcess:
    """`sluice ARGS` with bytes output (export must be compared byte for byte)."""
    return subprocess.run([SLUICE_BIN, *args], capture_output=True, timeout=timeout,
                          env=env or clean_env(), stdin=subprocess.DEVNULL)


def out(r: subprocess.CompletedProcess) -> str:
    return (f"exit {r.returncode}\nstdout: {r.stdout.decode('utf-8', 'replace')}\n"
            f"stderr: {r.stderr.decode('utf-8', 'replace')}")


def openssl(args: list[str], input: bytes | str | None = None, timeout: float = 15) -> str:
    if isinstance(input, str):
        input = input.encode()
    r = subprocess.run(["openssl", *args], input=input, capture_output=True, timeout=timeout,
                       env=clean_env())
    assert r.returncode == 0, f"openssl {' '.join(args)} failed: {r.stderr.decode('utf-8', 'replace')}"
    return r.stdout.decode("utf-8", "replace")


def cert_text(pem: str | Path) -> str:
    data = Path(pem).read_text() if isinstance(pem, Path) else pem
    return openssl(["x509", "-noout", "-text"], input=data)


def cert_field(pem: str | Path, what: str) -> str:
    """`subject`, `issuer`, `serial`, `startdate`, `enddate`: the value after '='."""
    data = Path(pem).read_text() if isinstance(pem, Path) else pem
    line = openssl(["x509", "-noout", f"-{what}", "-nameopt", "RFC2253"], input=data).strip()
    return line.split("=", 1)[1].strip()


def san_of(pem: str) -> str:
    """The Subject Alternative Name extension's value line, '' without one."""
    m = re.search(r"X509v3 Subject Alternative Name:.*?\n\s*(.*)\n", cert_text(pem))
    return m.group(1).strip() if m else ""


def fingerprint_hex(pem: Path) -> str:
    line = openssl(["x509", "-in", str(pem), "-noout", "-fingerprint", "-sha256"]).strip()
    return line.split("=", 1)[1].replace(":", "").lower()


def spki_pin(pem: Path) -> str:
    der_pub = subprocess.run(
        ["bash", "-c", f"set -o pipefail; openssl x509 -in '{pem}' -pubkey -noout | openssl pkey -pubin -outform der"],
        capture_output=True, timeout=15, check=True).stdout
    return "sha256/" + base64.b64encode(hashlib.sha256(der_pub).digest()).decode()


def s_client(proxy_port: int, host: str, port: int, servername: str | None = None,
             noservername: bool = False, cafile: Path | None = None,
             timeout: float = 15) -> subprocess.CompletedProcess:
    """openssl s_client through the proxy (it sends CONNECT host:port itself), stdin closed so
    it leaves right after the handshake. Text output."""
    args = ["openssl", "s_client", "-proxy", f"{HOST}:{proxy_port}", "-connect", f"{host}:{port}",
            "-showcerts"]
    if servername is not None:
        args += ["-servername", servername]
    if noservername:
        args += ["-noservername"]
    if cafile is not None:
        args += ["-CAfile", str(cafile), "-verify_return_error"]
    return subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout, env=clean_env())


def presented_leaf(r: subprocess.CompletedProcess) -> str:
    certs = PEM_RE.findall(r.stdout)
    assert r.returncode == 0 and certs, (f"handshake through the proxy failed (exit {r.returncode}):\n"
                                         f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return certs[0] + "\n"


def curl_via(proxy, url: str, cacert: Path | None, *extra: str, timeout: float = 15):
    args = ["-x", proxy.url, *extra]
    if cacert is not None:
        args += ["--cacert", str(cacert)]
    return run_curl([*args, url], timeout=timeout)


def curl_issuer(verbose_stderr: bytes) -> str:
    m = re.search(r"^\*\s+issuer: (.*)$", verbose_stderr.decode("utf-8", "replace"), re.M)
    assert m, f"no 'issuer:' line in curl -v output:\n{verbose_stderr.decode('utf-8', 'replace')[-3000:]}"
    return m.group(1)


def connect_lines(log: AccessLog) -> list[dict]:
    return [e for e in log.lines() if e.get("method") == "CONNECT"]


# ------------------------------------------------------------------------------------------
# Fixtures: nginx with TLS in front of httpbin; a CA from `sluice ca init`; intercepting Sluice
# ------------------------------------------------------------------------------------------

TLS_HTTPBIN_CONF = """\
    client_max_body_size 16m;
    server {{
        listen {host}:{port} ssl;
        ssl_certificate {chain};
        ssl_certificate_key {key};
        location / {{
            proxy_pass http://{host}:{httpbin_port};
            proxy_set_header Host $host;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
"""


class TlsHttpbin:
    def __init__(self, d: Path, port: int):
        self.dir = d
        self.port = port
        self.proc: subprocess.Popen | None = None

    def url(self, path: str, host: str = "localhost") -> str:
        return f"https://{host}:{self.port}{path}"

    def access_log(self) -> str:
        return tail(self.dir / "access.log", 1 << 20)


@pytest.fixture(scope="module")
def tls_httpbin(tmp_path_factory, pki, httpbin) -> TlsHttpbin:
    """nginx terminating TLS (test PKI leaf for 127.0.0.1 and localhost) in front of httpbin."""
    d = tmp_path_factory.mktemp("tls-httpbin")
    t = TlsHttpbin(d, pick_port())
    conf = d / "nginx.conf"
    conf.write_text(nginx_conf(d, TLS_HTTPBIN_CONF.format(
        host=HOST, port=t.port, chain=pki.chain_pem, key=pki.leaf_key, httpbin_port=httpbin.port), connections=256))
    log = open(d / "stderr.log", "wb")
    t.proc = spawn(["nginx", "-p", str(d), "-e", str(d / "error.log"), "-c", str(conf)],
                   stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    try:
        wait_port(t.port, 15, t.proc)
    except Exception as e:
        raise RuntimeError(f"nginx (TLS → httpbin) did not start: {e}\n{tail(d / 'stderr.log')}\n"
                           f"{tail(d / 'error.log')}")
    yield t
    stop_process(t.proc)
    log.close()


@pytest.fixture
def ca_dir(tmp_path, sluice_bin) -> Path:
    d = tmp_path / "sluice-ca"
    r = sluice_cli("ca", "init", "--dir", str(d))
    assert r.returncode == 0, f"`sluice ca init --dir {d}` failed:\n{out(r)}"
    assert (d / "ca.pem").is_file() and (d / "ca.key").is_file(), out(r)
    return d


@pytest.fixture
def intercepting(sluice_factory, ca_dir, tls_httpbin, nginx, tmp_path):
    """start(policy=None, hosts=("localhost",), extra=None) -> (Sluice, AccessLog): Sluice with
    tls.ca_dir = the fresh CA, an access log, and an `intercept: true` policy carrying the
    X-Intercepted adapter for each of hosts (policy entries merged in)."""
    n = 0

    def start(policy: dict | None = None, hosts=("localhost",), extra: dict | None = None):
        nonlocal n
        n += 1
        log = tmp_path / f"access-{n}.log"
        entry = {"intercept": True, "adapters": [ADAPTER], **(policy or {})}
        cfg = {
            "tls": {"ca_dir": str(ca_dir)},
            "access": {"connect_ports": [443, nginx.https_port, tls_httpbin.port]},
            "monitors": [{"access_log": {"path": str(log)}}],
            "policies": {h: dict(entry) for h in hosts},
        }
        cfg.update(extra or {})
        return sluice_factory(cfg, name=f"intercept-{n}"), AccessLog(log)

    return start


# ------------------------------------------------------------------------------------------
# The upstream itself (no Sluice): if this fails, the fixture is broken, not the proxy
# ------------------------------------------------------------------------------------------

def test_tls_httpbin_fixture_direct(tls_httpbin, pki):
    r = run_curl(["--cacert", str(pki.ca_pem), "-H", "X-Probe: direct", tls_httpbin.url("/headers")],
                 timeout=15)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["headers"]["X-Probe"] == "direct"


# ------------------------------------------------------------------------------------------
# sluice ca init / export
# ------------------------------------------------------------------------------------------

def test_ca_init_creates_key_and_certificate(tmp_path, sluice_bin):
    d = tmp_path / "new" / "ca"
    r = sluice_cli("ca", "init", "--dir", str(d))
    assert r.returncode == 0, out(r)
    key, pem = d / "ca.key", d / "ca.pem"
    assert key.is_file() and pem.is_file(), f"{sorted(p.name for p in d.iterdir()) if d.exists() else 'no dir'}\n{out(r)}"
    assert stat.S_IMODE(d.stat().st_mode) == 0o700, f"{d} has mode {oct(stat.S_IMODE(d.stat().st_mode))}"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600, f"ca.key has mode {oct(stat.S_IMODE(key.stat().st_mode))}"
    assert stat.S_IMODE(pem.stat().st_mode) == 0o644, f"ca.pem has mode {oct(stat.S_IMODE(pem.stat().st_mode))}"
    assert b"-----BEGIN" in key.read_bytes() and b"PRIVATE KEY-----" in key.read_bytes(), "ca.key is not a PEM key"

    text = cert_text(pem)
    assert re.search(r"CA:TRUE", text), text
    assert re.search(r"pathlen:0", text), f"no pathlen 0:\n{text}"
    m = re.search(r"X509v3 Key Usage:.*?\n\s*(.*)\n", text)
    assert m and "Certificate Sign" in m.group(1), f"key usage lacks Certificate Sign:\n{text}"
    assert f"CN={SLUICE_CA_CN}" in cert_field(pem, "subject"), text
    assert cert_field(pem, "subject") == cert_field(pem, "issuer"), "not self-signed"
    assert "prime256v1" in text or "P-256" in text, f"not an EC P-256 key:\n{text}"
    # self-signed and valid: it verifies against itself
    assert ": OK" in openssl(["verify", "-CAfile", str(pem), str(pem)])
    # the key belongs to the certificate
    assert openssl(["pkey", "-in", str(key), "-pubout"]) == openssl(["x509", "-in", str(pem), "-noout", "-pubkey"])
    # 10 years
    fmt = "%b %d %H:%M:%S %Y %Z"
    nb = datetime.strptime(cert_field(pem, "startdate"), fmt)
    na = datetime.strptime(cert_field(pem, "enddate"), fmt)
    assert 3640 <= (na - nb).days <= 3660, f"validity {nb} .. {na}"
    assert abs((datetime.now(timezone.utc).replace(tzinfo=None) - nb).total_seconds()) < 2 * 86400, f"notBefore {nb} is not about now"

    stdout = r.stdout.decode()
    assert str(key) in stdout and str(pem) in stdout, f"paths not printed:\n{stdout}"
    fp = fingerprint_hex(pem)
    printed = [re.sub(r"[^0-9a-f]", "", h.lower()) for h in
               re.findall(r"(?:[0-9A-Fa-f]{2}:){31}[0-9A-Fa-f]{2}|\b[0-9A-Fa-f]{64}\b", stdout)]
    assert fp in printed, f"SHA-256 fingerprint {fp} (openssl x509 -fingerprint -sha256) not in stdout:\n{stdout}"


def test_ca_init_refuses_to_overwrite(ca_dir):
    key, pem = ca_dir / "ca.key", ca_dir / "ca.pem"
    before = (key.read_bytes(), pem.read_bytes(), key.stat().st_mtime_ns, pem.stat().st_mtime_ns)
    r = sluice_cli("ca", "init", "--dir", str(ca_dir))
    assert r.returncode == 1, out(r)
    msg = (r.stdout + r.stderr).decode()
    assert "already exists" in msg, out(r)
    assert str(ca_dir) in msg and "--force" in msg, out(r)
    after = (key.read_bytes(), pem.read_bytes(), key.stat().st_mtime_ns, pem.stat().st_mtime_ns)
    assert after == before, "a refused `ca init` touched the existing CA"


def test_ca_init_force_replaces(ca_dir):
    key, pem = ca_dir / "ca.key", ca_dir / "ca.pem"
    old_key, old_pem = key.read_bytes(), pem.read_bytes()
    r = sluice_cli("ca", "init", "--dir", str(ca_dir), "--force")
    assert r.returncode == 0, out(r)
    assert key.read_bytes() != old_key and pem.read_bytes() != old_pem, "--force did not replace the CA"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert openssl(["pkey", "-in", str(key), "-pubout"]) == openssl(["x509", "-in", str(pem), "-noout", "-pubkey"])
    assert fingerprint_hex(pem) in re.sub(r"[^0-9a-f\n]", "", r.stdout.decode().lower()), out(r)


def test_ca_export_prints_the_certificate(ca_dir):
    r = sluice_cli("ca", "export", "--dir", str(ca_dir))
    assert r.returncode == 0, out(r)
    assert r.stdout == (ca_dir / "ca.pem").read_bytes(), out(r)
    assert b"PRIVATE" not in r.stdout + r.stderr


def test_ca_export_without_ca_fails(tmp_path, sluice_bin):
    empty = tmp_path / "empty"
    empty.mkdir()
    r = sluice_cli("ca", "export", "--dir", str(empty))
    assert r.returncode == 1, out(r)
    assert "sluice ca init" in (r.stdout + r.stderr).decode(), out(r)
    assert b"BEGIN CERTIFICATE" not in r.stdout
    assert list(empty.iterdir()) == [], "export created files"


def test_ca_default_dir_is_state_directory_ca(tmp_path, sluice_bin):
    """Without --dir: $STATE_DIRECTORY/ca (the default of tls.ca_dir under systemd)."""
    state = tmp_path / "state"
    state.mkdir()
    env = clean_env(STATE_DIRECTORY=str(state))
    r = sluice_cli("ca", "init", env=env)
    assert r.returncode == 0, out(r)
    assert (state / "ca" / "ca.pem").is_file() and (state / "ca" / "ca.key").is_file(), out(r)
    r = sluice_cli("ca", "export", env=env)
    assert r.returncode == 0 and r.stdout == (state / "ca" / "ca.pem").read_bytes(), out(r)


# ------------------------------------------------------------------------------------------
# Start-up
# ------------------------------------------------------------------------------------------

def test_intercept_without_ca_refuses_to_start(tmp_path, sluice_bin, pki):
    empty = tmp_path / "no-ca"
    empty.mkdir()
    port = pick_port()
    cfg = tmp_path / "sluice.yaml"
    cfg.write_text(yaml.safe_dump({
        "listen": [f"{HOST}:{port}"],
        "tls": {"ca_file": str(pki.ca_pem), "ca_dir": str(empty)},
        "policies": {"localhost": {"intercept": True}},
    }, sort_keys=False))
    p = spawn([SLUICE_BIN, "run", "--config", str(cfg)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
              stdin=subprocess.DEVNULL)
    try:
        so, se = p.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        listening = port_open(port)
        kill_tree(p)
        p.communicate(timeout=5)
        pytest.fail(f"sluice still running 10 s after start with no CA in {empty} (listening: {listening})")
    msg = (so + se).decode("utf-8", "replace")
    assert p.returncode != 0, msg
    assert "sluice ca init" in msg, msg
    assert str(empty) in msg, msg
    assert not port_open(port)


def test_ca_dir_not_read_without_intercept_policy(sluice_factory, httpbin, tmp_path):
    """ca_dir is read only when some policy intercepts: a missing one is fine otherwise."""
    proxy = sluice_factory({"tls": {"ca_dir": str(tmp_path / "does-not-exist")},
                            "policies": {"localhost": {"adapters": [ADAPTER]}}})
    r = session_via(proxy.url).get(httpbin.url + "/get", timeout=10)
    assert r.status_code == 200


# ------------------------------------------------------------------------------------------
# Interception with curl
# ------------------------------------------------------------------------------------------

def test_intercept_curl_adapter_runs_on_decrypted_request(intercepting, ca_dir, tls_httpbin):
    proxy, log = intercepting()
    r = curl_via(proxy, tls_httpbin.url("/headers"), ca_dir / "ca.pem", "-v", "-H", "X-Client: curl")
    assert r.returncode == 0, r.stderr.decode("utf-8", "replace")[-3000:]
    j = json.loads(r.stdout)
    assert j["headers"].get("X-Intercepted") == "yes", j
    assert j["headers"].get("X-Client") == "curl", j
    issuer = curl_issuer(r.stderr)
    assert SLUICE_CA_CN in issuer, f"curl saw issuer {issuer!r}, not Sluice's CA"


def test_intercept_curl_offering_h2_gets_http11(intercepting, ca_dir, tls_httpbin):
    """Inside the tunnel Sluice speaks HTTP/1.1: a client offering h2 by ALPN falls back."""
    proxy, _ = intercepting()
    r = curl_via(proxy, tls_httpbin.url("/headers"), ca_dir / "ca.pem", "-v", "--http2")
    err = r.stderr.decode("utf-8", "replace")
    assert r.returncode == 0, err[-3000:]
    assert "ALPN: server accepted h2" not in err and "using HTTP/2" not in err, err[-3000:]
    assert json.loads(r.stdout)["headers"].get("X-Intercepted") == "yes"


def test_intercept_access_log_lines(intercepting, ca_dir, tls_httpbin):
    proxy, log = intercepting()
    url = tls_httpbin.url("/headers")
    r = curl_via(proxy, url, ca_dir / "ca.pem")
    assert r.returncode == 0, r.stderr
    inner = log.wait_for(lambda e: e.get("method") == "GET")[0]
    assert inner["url"] == url, inner
    assert inner["status"] == 200 and inner["outcome"] == "ok", inner
    assert inner["policy"] == "localhost", inner
    conn = log.wait_for(lambda e: e.get("method") == "CONNECT")[0]
    assert conn["outcome"] == "intercepted", conn
    assert f"localhost:{tls_httpbin.port}" in conn["url"], conn
    time.sleep(0.3)  # window: no third access-log line may appear in it
    assert len(log.lines()) == 2, f"expected one inner and one CONNECT line:\n{log.text()}"


def test_intercept_presented_leaf_with_openssl(intercepting, ca_dir, tls_httpbin, tmp_path):
    proxy, _ = intercepting()
    r = s_client(proxy.port, "localhost", tls_httpbin.port, servername="localhost",
                 cafile=ca_dir / "ca.pem")
    leaf = presented_leaf(r)
    assert "Verify return code: 0 (ok)" in r.stdout, r.stdout[-3000:]
    assert f"CN={SLUICE_CA_CN}" in cert_field(leaf, "issuer"), cert_text(leaf)
    assert "localhost" in cert_field(leaf, "subject") or "DNS:localhost" in san_of(leaf), cert_text(leaf)
    assert "DNS:localhost" in san_of(leaf), cert_text(leaf)
    text = cert_text(leaf)
    assert "CA:TRUE" not in text, "the leaf must not be a CA"
    assert "TLS Web Server Authentication" in text, f"no serverAuth extended key usage:\n{text}"
    fmt = "%b %d %H:%M:%S %Y %Z"
    nb = datetime.strptime(cert_field(leaf, "startdate"), fmt)
    na = datetime.strptime(cert_field(leaf, "enddate"), fmt)
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    assert nb <= now < na and (na - nb).days <= 398, f"leaf validity {nb} .. {na}"
    p = tmp_path / "leaf.pem"
    p.write_text(leaf)
    assert ": OK" in openssl(["verify", "-CAfile", str(ca_dir / "ca.pem"), str(p)])
    # the origin's certificate (test CA) is nowhere in what the client saw
    assert TEST_CA_CN not in r.stdout, r.stdout[-3000:]


def test_intercept_leaf_without_sni_is_for_connect_host(intercepting, ca_dir, tls_httpbin):
    proxy, _ = intercepting()
    r = s_client(proxy.port, "localhost", tls_httpbin.port, noservername=True)
    leaf = presented_leaf(r)
    assert "DNS:localhost" in san_of(leaf), cert_text(leaf)
    assert f"CN={SLUICE_CA_CN}" in cert_field(leaf, "issuer")


def test_intercept_ip_literal_gets_ip_san(intercepting, ca_dir, tls_httpbin):
    proxy, log = intercepting(hosts=(HOST,))
    url = tls_httpbin.url("/headers", host=HOST)
    r = curl_via(proxy, url, ca_dir / "ca.pem", "-v")  # curl checks an IP against IP SANs only
    assert r.returncode == 0, r.stderr.decode("utf-8", "replace")[-3000:]
    assert json.loads(r.stdout)["headers"].get("X-Intercepted") == "yes"
    assert SLUICE_CA_CN in curl_issuer(r.stderr)
    leaf = presented_leaf(s_client(proxy.port, HOST, tls_httpbin.port, noservername=True))
    assert f"IP Address:{HOST}" in san_of(leaf), cert_text(leaf)
    assert log.wait_for(lambda e: e.get("method") == "GET")[0]["url"] == url


def test_intercept_leaf_is_cached(intercepting, tls_httpbin):
    proxy, _ = intercepting()
    a = presented_leaf(s_client(proxy.port, "localhost", tls_httpbin.port, servername="localhost"))
    b = presented_leaf(s_client(proxy.port, "localhost", tls_httpbin.port, servername="localhost"))
    assert cert_field(a, "serial") == cert_field(b, "serial"), "a new leaf for every handshake"
    assert a == b


def test_intercept_sni_different_from_connect_host_is_refused(intercepting, ca_dir, tls_httpbin):
    proxy, log = intercepting()
    r = s_client(proxy.port, "localhost", tls_httpbin.port, servername="other.test")
    assert r.returncode != 0 or not PEM_RE.search(r.stdout), (
        f"handshake with SNI other.test inside CONNECT localhost succeeded:\n{r.stdout[-3000:]}")
    assert "other.test" not in "".join(san_of(c + "\n") for c in PEM_RE.findall(r.stdout))
    # the proxy is fine afterwards
    ok = curl_via(proxy, tls_httpbin.url("/get"), ca_dir / "ca.pem")
    assert ok.returncode == 0, ok.stderr
    assert "other.test" not in tls_httpbin.access_log()


def test_intercept_client_rejecting_the_leaf(intercepting, pki, tls_httpbin):
    """curl trusting only the test CA (which signed the origin's certificate) rejects Sluice's leaf."""
    proxy, _ = intercepting()
    marker = "/anything/rejected-leaf-marker"
    r = curl_via(proxy, tls_httpbin.url(marker), pki.ca_pem)
    assert r.returncode != 0, f"curl accepted Sluice's leaf with only the test CA: {r.stdout[:500]!r}"
    assert b"certificate" in r.stderr.lower(), r.stderr
    want = f"interception of localhost:{tls_httpbin.port} failed: the client rejected Sluice's certificate"
    assert wait_until(lambda: want in proxy.stderr(), 5), f"no {want!r} on stderr:\n{proxy.stderr()}"
    line = next(x for x in proxy.stderr().splitlines() if want in x)
    assert "alert" in line.lower(), f"the TLS alert is not named: {line}"
    assert marker not in tls_httpbin.access_log(), "the request reached the origin"


def test_intercept_connect_ports_still_apply(intercepting, closed_port, tls_httpbin):
    proxy, _ = intercepting()
    with RawConn(HOST, proxy.port) as c:
        c.send(f"CONNECT localhost:{closed_port} HTTP/1.1\r\nHost: localhost:{closed_port}\r\n\r\n".encode())
        r = c.read_response(timeout=10)
    assert r is not None and r.status == 403, r


# ------------------------------------------------------------------------------------------
# Raw client: the CONNECT answer, origin-form and absolute-form inside the tunnel
# ------------------------------------------------------------------------------------------

def test_intercept_raw_origin_and_absolute_form(intercepting, ca_dir, tls_httpbin):
    proxy, log = intercepting()
    auth = f"localhost:{tls_httpbin.port}"
    with RawConn(HOST, proxy.port) as c:
        c.send(f"CONNECT {auth} HTTP/1.1\r\nHost: {auth}\r\n\r\n".encode())
        head = c.read_head(timeout=10)
        assert head is not None and head.status == 200, head
        assert head.raw_head.startswith(b"HTTP/1.1 200 Connection established\r\n"), head.raw_head
        assert not c.buf, f"bytes after the CONNECT answer: {bytes(c.buf)!r}"
        ctx = ssl.create_default_context(cafile=str(ca_dir / "ca.pem"))
        ctx.verify_flags |= ssl.VERIFY_X509_STRICT  # the default from Python 3.13 on
        c.sock = ctx.wrap_socket(c.sock, server_hostname="localhost")
        issuer = dict(x[0] for x in c.sock.getpeercert()["issuer"])
        assert issuer.get("commonName") == SLUICE_CA_CN, c.sock.getpeercert()

        c.send(request_bytes("GET", "/anything/origin-form", host=auth))
        r1 = c.read_response(timeout=10)
        c.send(request_bytes("GET", f"https://{auth}/anything/absolute-form"))
        r2 = c.read_response(timeout=10)
    for r, path in ((r1, "/anything/origin-form"), (r2, "/anything/absolute-form")):
        assert r is not None and r.status == 200, r
        j = json.loads(r.body)
        assert j["headers"].get("X-Intercepted") == "yes", j
        assert j["url"].endswith(path), j
    urls = [e["url"] for e in log.wait_for(lambda e: e.get("method") == "GET", n=2)]
    assert urls == [f"https://{auth}/anything/origin-form", f"https://{auth}/anything/absolute-form"], urls


# ------------------------------------------------------------------------------------------
# Interception with Python requests
# ------------------------------------------------------------------------------------------

def test_intercept_requests_get_post_keep_alive(intercepting, ca_dir, tls_httpbin):
    proxy, log = intercepting()
    s = session_via(proxy.url)
    s.verify = str(ca_dir / "ca.pem")
    body = (hashlib.sha256(b"intercept").hexdigest() * 2048).encode()  # 128 KiB of text
    try:
        r = s.get(tls_httpbin.url("/headers"), timeout=15)
        assert r.status_code == 200, r.text
        assert r.json()["headers"].get("X-Intercepted") == "yes", r.text
        r = s.post(tls_httpbin.url("/anything/post"), data=body,
                   headers={"Content-Type": "application/octet-stream"}, timeout=15)
        assert r.status_code == 200, r.text[:500]
        j = r.json()
        assert j["method"] == "POST"
        assert j["data"].encode() == body, f"body not echoed intact ({len(j['data'])} of {len(body)} chars)"
        assert j["headers"].get("X-Intercepted") == "yes"
        r = s.post(tls_httpbin.url("/anything/json"), json={"k": [1, 2, 3], "s": "é"}, timeout=15)
        assert r.status_code == 200 and r.json()["json"] == {"k": [1, 2, 3], "s": "é"}, r.text[:500]
        for i in range(3):
            r = s.get(tls_httpbin.url(f"/get?n={i}"), timeout=15)
            assert r.status_code == 200 and r.json()["args"] == {"n": str(i)}, r.text[:500]
    finally:
        s.close()
    inner = log.wait_for(lambda e: e.get("method") in ("GET", "POST"), n=6)
    assert [e["url"] for e in inner] == (
        [tls_httpbin.url("/headers"), tls_httpbin.url("/anything/post"), tls_httpbin.url("/anything/json")]
        + [tls_httpbin.url(f"/get?n={i}") for i in range(3)]), [e["url"] for e in inner]
    post = inner[1]
    assert post["method"] == "POST" and post["bytes_in"] == len(body), post
    conns = log.wait_for(lambda e: e.get("method") == "CONNECT")
    time.sleep(0.3)  # window: no second CONNECT line may appear in it
    conns = connect_lines(log)
    assert len(conns) == 1, f"{len(conns)} CONNECTs for one keep-alive session:\n{log.text()}"
    assert conns[0]["outcome"] == "intercepted", conns[0]


def test_intercept_chunked_upload_and_streamed_response(intercepting, ca_dir, tls_httpbin):
    proxy, log = intercepting()
    s = session_via(proxy.url)
    s.verify = str(ca_dir / "ca.pem")
    part = (hashlib.sha256(b"chunk").hexdigest() * 1024).encode()  # 64 KiB
    try:
        r = s.post(tls_httpbin.url("/anything/chunked"), data=(part for _ in range(32)),
                   headers={"Content-Type": "application/octet-stream"}, timeout=20)
        assert r.status_code == 200, r.text[:500]
        j = r.json()
        assert j["headers"].get("X-Intercepted") == "yes"
        assert j["data"].encode() == part * 32, f"2 MiB chunked upload echoed as {len(j['data'])} chars"
        r = s.get(tls_httpbin.url("/stream/20"), timeout=15, stream=True)
        assert r.status_code == 200
        lines = [json.loads(x) for x in r.iter_lines() if x]
        assert [x["id"] for x in lines] == list(range(20)), lines[:3]
    finally:
        s.close()
    post = log.wait_for(lambda e: e.get("method") == "POST")[0]
    assert post["bytes_in"] == 32 * len(part) and post["status"] == 200, post


def test_intercept_concurrent_clients(intercepting, ca_dir, tls_httpbin):
    """8 clients at once, 3 requests each on their own tunnel: all intercepted, and all see the
    leaf cached by an earlier handshake. (The cache is warmed first: two handshakes racing on a
    cold cache may each sign a leaf, which the contract does not forbid.)"""
    import threading
    proxy, log = intercepting()
    warm = presented_leaf(s_client(proxy.port, "localhost", tls_httpbin.port, servername="localhost"))
    errors: list[str] = []
    peers: set[bytes] = set()
    lock = threading.Lock()

    def client(i: int):
        try:
            auth = f"localhost:{tls_httpbin.port}"
            with RawConn(HOST, proxy.port, timeout=15) as c:
                c.send(f"CONNECT {auth} HTTP/1.1\r\nHost: {auth}\r\n\r\n".encode())
                head = c.read_head(timeout=10)
                assert head is not None and head.status == 200, head
                ctx = ssl.create_default_context(cafile=str(ca_dir / "ca.pem"))
                c.sock = ctx.wrap_socket(c.sock, server_hostname="localhost")
                with lock:
                    peers.add(c.sock.getpeercert(binary_form=True))
                for k in range(3):
                    c.send(request_bytes("GET", f"/get?c={i}&k={k}", host=auth))
                    r = c.read_response(timeout=15)
                    assert r is not None and r.status == 200, r
                    j = json.loads(r.body)
                    assert j["args"] == {"c": str(i), "k": str(k)}, j
                    assert j["headers"].get("X-Intercepted") == "yes", j
        except Exception as e:  # noqa: BLE001 - reported below
            with lock:
                errors.append(f"client {i}: {e!r}")

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads), "a client hung"
    assert len(peers) == 1, f"{len(peers)} different leaves for one name"
    assert ssl.DER_cert_to_PEM_cert(peers.pop()).strip() == warm.strip(), "not the cached leaf"
    log.wait_for(lambda e: e.get("method") == "CONNECT")  # the warm-up's s_client
    log.wait_for(lambda e: e.get("method") == "GET", n=24)
    conns = log.wait_for(lambda e: e.get("method") == "CONNECT", n=9)
    assert all(e["outcome"] == "intercepted" for e in conns), conns


# ------------------------------------------------------------------------------------------
# Trust evaluation of the real upstream still applies
# ------------------------------------------------------------------------------------------

def test_intercept_wrong_pin_is_502_inside_the_tunnel(intercepting, ca_dir, tls_httpbin):
    proxy, log = intercepting({"trust": {"public_keys": [WRONG_PIN]}})
    s = session_via(proxy.url)
    s.verify = str(ca_dir / "ca.pem")
    marker = "/anything/pin-mismatch-marker"
    try:
        for _ in range(2):  # the connection is kept: the second goes through the same tunnel
            r = s.get(tls_httpbin.url(marker), timeout=15)
            assert r.status_code == 502, r.text[:500]
            want = (f"sluice: TLS trust evaluation failed for upstream localhost:{tls_httpbin.port} "
                    f"(evaluator: public_keys): public key pin mismatch")
            assert r.text.strip() == want, r.text
    finally:
        s.close()
    e = log.wait_for(lambda e: e.get("method") == "GET")[0]
    assert e["outcome"] == "error" and e["status"] == 502, e
    assert e.get("trust_failure") == {"evaluator": "public_keys", "reason": "public key pin mismatch"}, e
    assert e["url"] == tls_httpbin.url(marker), e
    log.wait_for(lambda e: e.get("method") == "CONNECT")
    time.sleep(0.3)  # window: the origin must not log the marker, nor a second CONNECT line appear, in it
    assert marker not in tls_httpbin.access_log(), "the request was sent to an upstream that failed trust"
    assert len(connect_lines(log)) == 1, f"the 502 did not keep the tunnel open:\n{log.text()}"


def test_intercept_right_pin_passes(intercepting, ca_dir, tls_httpbin, pki):
    proxy, _ = intercepting({"trust": {"public_keys": [spki_pin(pki.leaf_pem)]}})
    r = curl_via(proxy, tls_httpbin.url("/headers"), ca_dir / "ca.pem")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["headers"].get("X-Intercepted") == "yes"


def test_intercept_default_trust_rejects_unknown_origin_ca(intercepting, ca_dir, tls_httpbin):
    """Without tls.ca_file the origin's test-CA certificate is untrusted upstream: the client,
    which trusts Sluice's leaf, still gets a 502 from the default evaluator."""
    proxy, _ = intercepting(extra={"tls": {"ca_file": None, "ca_dir": str(ca_dir)}})  # system CAs
    r = session_via(proxy.url).get(tls_httpbin.url("/headers"), verify=str(ca_dir / "ca.pem"), timeout=15)
    assert r.status_code == 502, r.text[:500]
    assert r.text.startswith(f"sluice: TLS trust evaluation failed for upstream localhost:{tls_httpbin.port} "
                             f"(evaluator: default): untrusted certificate"), r.text


# ------------------------------------------------------------------------------------------
# Hosts without intercept are tunnelled untouched
# ------------------------------------------------------------------------------------------

def test_non_intercepted_host_is_tunnelled(intercepting, ca_dir, pki, tls_httpbin):
    proxy, log = intercepting()  # the policy is keyed "localhost"; 127.0.0.1 is not intercepted
    url = tls_httpbin.url("/headers", host=HOST)
    r = curl_via(proxy, url, pki.ca_pem, "-v")
    assert r.returncode == 0, r.stderr.decode("utf-8", "replace")[-3000:]
    assert "X-Intercepted" not in json.loads(r.stdout)["headers"], r.stdout
    assert TEST_CA_CN in curl_issuer(r.stderr)
    # only the Sluice CA: the origin's certificate is not trusted, so the tunnel is untouched
    bad = curl_via(proxy, url, ca_dir / "ca.pem")
    assert bad.returncode != 0, "the Sluice CA validated a tunnelled origin's certificate"
    leaf = presented_leaf(s_client(proxy.port, HOST, tls_httpbin.port))
    assert f"CN={TEST_CA_CN}" in cert_field(leaf, "issuer"), cert_text(leaf)
    assert leaf.strip() == pki.leaf_pem.read_text().strip(), "not the origin's own certificate"
    lines = log.wait_for(lambda e: e.get("method") == "CONNECT", n=3)
    assert lines[0]["outcome"] == "tunnel", lines[0]
    assert not [e for e in lines if e["outcome"] == "intercepted"], lines
    assert not [e for e in log.lines() if e.get("method") != "CONNECT"], log.text()


# ------------------------------------------------------------------------------------------
# Reload: the CA is read when a reloaded file turns interception on
# ------------------------------------------------------------------------------------------

def issuer_seen(proxy, port: int) -> str:
    return cert_field(presented_leaf(s_client(proxy.port, "localhost", port, servername="localhost")), "issuer")


def test_reload_turns_interception_on(sluice_factory, ca_dir, tls_httpbin, nginx):
    proxy = sluice_factory({"tls": {"ca_dir": str(ca_dir)},
                            "access": {"connect_ports": [443, nginx.https_port, tls_httpbin.port]},
                            "policies": {"localhost": {"adapters": [ADAPTER]}}})
    assert TEST_CA_CN in issuer_seen(proxy, tls_httpbin.port)
    set_sections(proxy, policies={"localhost": {"intercept": True, "adapters": [ADAPTER]}})
    sighup(proxy)
    assert wait_until(lambda: SLUICE_CA_CN in issuer_seen(proxy, tls_httpbin.port), 5, 0.1), \
        f"still tunnelling 5 s after a reload turned interception on\nstderr:\n{proxy.stderr()}"
    r = curl_via(proxy, tls_httpbin.url("/headers"), ca_dir / "ca.pem")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["headers"].get("X-Intercepted") == "yes"


def test_reload_with_intercept_and_no_ca_keeps_old_config(sluice_factory, tls_httpbin, nginx, tmp_path):
    empty = tmp_path / "no-ca"
    empty.mkdir()
    proxy = sluice_factory({"tls": {"ca_dir": str(empty)},
                            "access": {"connect_ports": [443, nginx.https_port, tls_httpbin.port]},
                            "policies": {"localhost": {"adapters": [ADAPTER]}}})
    off = stderr_len(proxy)
    set_sections(proxy, policies={"localhost": {"intercept": True, "adapters": [ADAPTER]}})
    sighup(proxy)
    assert wait_until(lambda: "sluice ca init" in stderr_since(proxy, off), 5, 0.05), \
        f"no 'sluice ca init' on stderr after the reload:\n{stderr_since(proxy, off)}"
    assert proxy.alive(), "sluice exited on a reload with no CA"
    assert TEST_CA_CN in issuer_seen(proxy, tls_httpbin.port), "the old (tunnelling) config was not kept"


# ------------------------------------------------------------------------------------------
# Closing, timeouts and bad input inside intercepted tunnels
# ------------------------------------------------------------------------------------------

def _intercepted_tls(proxy, ca_dir: Path, auth: str) -> RawConn:
    c = RawConn(HOST, proxy.port)
    c.send(f"CONNECT {auth} HTTP/1.1\r\nHost: {auth}\r\n\r\n".encode())
    head = c.read_head(timeout=10)
    assert head is not None and head.status == 200, head
    ctx = ssl.create_default_context(cafile=str(ca_dir / "ca.pem"))
    c.sock = ctx.wrap_socket(c.sock, server_hostname="localhost")
    return c


def test_intercept_connection_close_response_is_delivered(intercepting, ca_dir, tls_httpbin):
    """A response that ends the connection (client asked Connection: close) reaches the
    client whole before the TLS connection closes."""
    proxy, _ = intercepting()
    auth = f"localhost:{tls_httpbin.port}"
    with _intercepted_tls(proxy, ca_dir, auth) as c:
        c.send(b"GET /bytes/65536?seed=1 HTTP/1.1\r\nHost: " + auth.encode() + b"\r\nConnection: close\r\n\r\n")
        r = c.read_response(timeout=10)
    assert r is not None and r.status == 200, r
    assert len(r.body) == 65536


def test_intercept_closing_error_is_delivered(intercepting, ca_dir, tls_httpbin):
    """An error that closes the connection (a request for another authority) is readable."""
    proxy, _ = intercepting()
    auth = f"localhost:{tls_httpbin.port}"
    with _intercepted_tls(proxy, ca_dir, auth) as c:
        c.send(b"GET https://elsewhere.test/x HTTP/1.1\r\nHost: elsewhere.test\r\n\r\n")
        r = c.read_response(timeout=10)
    assert r is not None and r.status == 400, r
    assert b"carries requests for" in r.body, r.body


def test_intercept_handshake_timeout_closes(intercepting, ca_dir, tls_httpbin):
    """A client that never starts the TLS handshake is disconnected at the header timeout."""
    proxy, _ = intercepting(extra={"timeouts": {"client_header": "500ms"}})
    auth = f"localhost:{tls_httpbin.port}"
    with RawConn(HOST, proxy.port) as c:
        c.send(f"CONNECT {auth} HTTP/1.1\r\nHost: {auth}\r\n\r\n".encode())
        head = c.read_head(timeout=10)
        assert head is not None and head.status == 200, head
        c.sock.settimeout(5)
        start = time.monotonic()
        data = c.sock.recv(100)  # no ClientHello sent: Sluice must close, not wait forever
        assert data == b"", data
        assert time.monotonic() - start < 4
    assert "no TLS handshake within 500 ms" in proxy.stderr()


def test_intercept_bytes_before_the_answer_are_refused(intercepting, tls_httpbin):
    """Bytes sent with the CONNECT, before its answer, are not taken as a TLS handshake."""
    proxy, _ = intercepting()
    auth = f"localhost:{tls_httpbin.port}"
    with RawConn(HOST, proxy.port) as c:
        c.send(f"CONNECT {auth} HTTP/1.1\r\nHost: {auth}\r\n\r\n".encode() + b"\x16\x03\x01garbage")
        head = c.read_head(timeout=10)
        assert head is not None and head.status == 400, head
    assert proxy.alive()


def test_intercept_download_is_backpressured(intercepting, ca_dir, nginx):
    """A client that stops reading an intercepted download makes Sluice pause the origin:
    its memory does not grow by the 32 MiB body."""
    proxy, _ = intercepting()
    auth = f"localhost:{nginx.https_port}"
    before = proxy.rss_kib()
    with _intercepted_tls(proxy, ca_dir, auth) as c:
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        c.send(f"GET /medium.bin HTTP/1.1\r\nHost: {auth}\r\n\r\n".encode())
        # window: the client does not read; Sluice must not take in the 32 MiB body the origin would send by now
        time.sleep(2.0)
        grown = proxy.rss_kib() - before
        assert grown < 16 * 1024 * RSS_SCALE, f"sluice grew by {grown} KiB while the client was not reading"
        r = c.read_response(timeout=60)
    assert r is not None and r.status == 200, r
    assert hashlib.sha256(r.body).digest() == hashlib.sha256(nginx.medium).digest()


# ------------------------------------------------------------------------------------------
# The shared cache inside an interception, never inside a plain tunnel (docs/caching.md)
# ------------------------------------------------------------------------------------------

def test_intercepted_requests_are_cached_tunnels_never(intercepting, ca_dir, tls_httpbin, nginx, pki):
    proxy, log = intercepting(extra={"cache_store": {"memory": "8MiB"}})
    url = tls_httpbin.url("/cache/60")  # public, max-age=60 (stored although the policy adds a header)
    heads = []
    for _ in range(2):
        r = curl_via(proxy, url, ca_dir / "ca.pem", "-D", "-", "-o", "/dev/null")
        assert r.returncode == 0, r.stderr.decode("utf-8", "replace")[-2000:]
        heads.append(r.stdout.decode("utf-8", "replace").lower())
    assert "cache-status: sluice; fwd=uri-miss; stored" in heads[0], heads[0]
    assert "cache-status: sluice; hit" in heads[1], heads[1]
    lines = log.wait_for(lambda e: e.get("url") == url, n=2)
    assert sorted(e.get("cache", "").split(";")[0] for e in lines) == ["fwd=uri-miss", "hit"], lines
    # 127.0.0.1 is not intercepted: its CONNECT is a byte tunnel, which the cache never sees.
    for _ in range(2):
        r = curl_via(proxy, f"https://127.0.0.1:{nginx.https_port}/1k", pki.ca_pem, "-D", "-", "-o", "/dev/null")
        assert r.returncode == 0 and b"cache-status" not in r.stdout.lower(), r.stdout


# ------------------------------------------------------------------------------------------
# A script's sub-request to an intercepted host
# ------------------------------------------------------------------------------------------

def test_a_scripts_https_sub_request_to_an_intercepted_host(intercepting, ca_dir, tls_httpbin, httpbin):
    """`sluice.http` to an `https://` URL whose host's policy intercepts: the CONNECT through
    this Sluice's listener is intercepted, the decrypted sub-request goes through that policy
    (its adapter), and the depth field with its token, which the interception reads and
    drops, never reaches the origin."""
    url = tls_httpbin.url("/headers")
    source = (f'return {{ on_request = function(req) local r, err = sluice.http{{url = "{url}"}}; '
              f'req.headers:set("X-Echo", r and (r.status .. " " .. r.body:gsub("%s", "")) or err) end }}')
    lua = {"adapters": [{"lua": {"source": source, "allow_hosts": [f"localhost:{tls_httpbin.port}"]}}]}
    proxy, log = intercepting(extra={"policies": {
        "localhost": {"intercept": True, "adapters": [ADAPTER]}, HOST: lua}})
    with session_via(proxy.url) as s:
        r = s.get(f"http://{HOST}:{httpbin.port}/headers", timeout=15)
    assert r.status_code == 200, r.text
    echo = r.json()["headers"].get("X-Echo", "")
    assert echo.startswith("200 "), echo
    seen = json.loads(echo[4:])["headers"]
    assert seen.get("X-Intercepted") == "yes", seen
    assert not any(k.lower() == "sluice-lua-depth" for k in seen), seen
    inner = log.wait_for(lambda e: e.get("method") == "GET" and e.get("policy") == "localhost")[0]
    assert inner["url"] == url and inner["status"] == 200, inner
    # The CA the interception signs with is the one it loaded, not the file: a new CA written
    # while Sluice runs changes neither the leaves nor what the sub-request trusts.
    r = sluice_cli("ca", "init", "--force", "--dir", str(ca_dir))
    assert r.returncode == 0, out(r)
    with session_via(proxy.url) as s:
        again = s.get(f"http://{HOST}:{httpbin.port}/headers", timeout=15)
    assert again.json()["headers"].get("X-Echo", "").startswith("200 "), again.text
