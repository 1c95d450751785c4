"""PKI and TLS servers for the trust tests (test_trust.py), made with the `openssl` and
`nginx` command-line tools inside temporary directories.

- `CA`: a root CA with a minimal `openssl ca` database (index.txt, serial, crlnumber), so its
  certificates can be revoked, listed in a CRL and answered for by an offline OCSP response.
  `CA.issue()` makes server or client leaves with chosen SANs and validity (an expired leaf
  is `openssl ca -startdate ... -enddate ...` in the past), optionally with an encrypted key.
- `self_signed()`: a self-signed leaf for names no CA vouches for.
- `spki_pin()`: `sha256/BASE64` of the DER SubjectPublicKeyInfo, with the openssl pipeline of
  the contract (`x509 -pubkey | pkey -pubin -outform der | dgst -sha256 -binary | base64`).
- `TLSNginx`: one nginx process with any number of purpose-built TLS servers (certificate
  chain, optional client-certificate requirement, optional stapled OCSP response), each with
  its own access log whose lines carry `$connection $connection_requests $ssl_session_reused`
  (so handshakes and reused sessions can be counted) and the client certificate's DN.

Everything listens on 127.0.0.1; `TLSNginx.stop()` must be called at fixture teardown.
"""

from __future__ import annotations

import base64
import datetime as dt
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from conftest import nginx_conf, spawn, stop_process, wait_port
from faultservers import HOST, pick_port
from support import tail



def openssl(args: list[str], cwd: Path | None = None, input: bytes | None = None) -> bytes:
    r = subprocess.run(["openssl", *args], cwd=cwd, input=input, capture_output=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(map(str, args))} failed ({r.returncode}):\n"
                           f"{r.stderr.decode(errors='replace')}")
    return r.stdout


def asn1_time(t: dt.datetime) -> str:
    """The YYYYMMDDHHMMSSZ form `openssl ca -startdate/-enddate` takes."""
    return t.astimezone(dt.timezone.utc).strftime("%Y%m%d%H%M%SZ")


def new_key(path: Path, slash_pin: bool = False, tries: int = 5000) -> Path:
    """A fresh EC P-256 private key (PKCS#8 PEM, unencrypted) at path. Its SPKI pin's base64
    starts with "/" when slash_pin, and never does otherwise: `sha256/` + such a base64 reads
    like the `sha256//` alias, an ambiguity a dedicated test covers; the other tests keep
    clear of it so that they stay deterministic."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    for _ in range(tries):
        k = ec.generate_private_key(ec.SECP256R1())
        spki = k.public_key().public_bytes(serialization.Encoding.DER,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
        h = hashes.Hash(hashes.SHA256())
        h.update(spki)
        if base64.b64encode(h.finalize()).startswith(b"/") == slash_pin:
            path.write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption()))
            return path
    raise RuntimeError(f"no key with slash_pin={slash_pin} in {tries} tries")


def _san(names: list[str]) -> str:
    out = []
    for n in names:
        if re.fullmatch(r"[0-9.]+|[0-9a-fA-F:]*:[0-9a-fA-F:]*", n):
            out.append(f"IP:{n}")
        else:
            out.append(f"DNS:{n}")
    return ",".join(out)


# ------------------------------------------------------------------------------------------
# Certificates
# ------------------------------------------------------------------------------------------


@dataclass
class Cert:
    """A certificate and its key; `chain` is the leaf followed by its issuer (what a server
    presents), or the certificate alone when self-signed."""
    name: str
    cert: Path
    key: Path
    chain: Path
    passphrase: str | None = None
    issuer: "CA | None" = None

    @property
    def pin(self) -> str:
        return spki_pin(self.cert)

    def subject(self) -> str:
        return openssl(["x509", "-in", str(self.cert), "-noout", "-subject", "-nameopt", "RFC2253"]).decode().strip()


CA_CONF = """\
[ ca ]
default_ca = CA_default

[ CA_default ]
dir = {d}
database = $dir/index.txt
new_certs_dir = $dir/newcerts
serial = $dir/serial
crlnumber = $dir/crlnumber
certificate = $dir/ca.pem
private_key = $dir/ca.key
default_md = sha256
default_days = 2
default_crl_days = 2
policy = policy_any
unique_subject = no
copy_extensions = none
email_in_dn = no
preserve = no

[ policy_any ]
commonName = supplied
organizationName = optional
"""


class CA:
    """A self-signed root CA (EC P-256) with an `openssl ca` database in its own directory."""

    def __init__(self, d: Path, cn: str, days: int = 30):
        self.dir = Path(d)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cn = cn
        self.pem = self.dir / "ca.pem"
        self.key = self.dir / "ca.key"
        self.conf = self.dir / "ca.cnf"
        (self.dir / "newcerts").mkdir(exist_ok=True)
        (self.dir / "index.txt").write_text("")
        (self.dir / "serial").write_text("1000\n")
        (self.dir / "crlnumber").write_text("1000\n")
        self.conf.write_text(CA_CONF.format(d=self.dir))
        new_key(self.key)
        openssl(["req", "-x509", "-key", "ca.key", "-out", "ca.pem", "-days", str(days),
                 "-subj", f"/CN={cn}",
                 "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign",
                 "-addext", "subjectKeyIdentifier=hash"], cwd=self.dir)

    @property
    def pin(self) -> str:
        return spki_pin(self.pem)

    def issue(self, name: str, sans: list[str] | None = None, *, client: bool = False,
              not_before: dt.datetime | None = None, not_after: dt.datetime | None = None,
              passphrase: str | None = None, cn: str | None = None) -> Cert:
        """A leaf signed by this CA. Server leaves get serverAuth and the SANs (default
        127.0.0.1 and localhost); client leaves get clientAuth. Validity: from an hour ago for
        two days unless given. A passphrase encrypts the key (PKCS#8, AES-256)."""
        now = dt.datetime.now(dt.timezone.utc)
        not_before = not_before or now - dt.timedelta(hours=1)
        not_after = not_after or now + dt.timedelta(days=2)
        sans = ["127.0.0.1", "localhost"] if sans is None and not client else (sans or [])
        d = self.dir
        key, csr, ext = d / f"{name}.key", d / f"{name}.csr", d / f"{name}.ext"
        cert, chain = d / f"{name}.pem", d / f"{name}-chain.pem"
        new_key(key)
        openssl(["req", "-new", "-key", str(key), "-out", str(csr),
                 "-subj", f"/O=Sluice E2E/CN={cn or name}"], cwd=d)
        lines = ["[ext]", "basicConstraints=critical,CA:FALSE",
                 "keyUsage=critical,digitalSignature,keyEncipherment",
                 f"extendedKeyUsage={'clientAuth' if client else 'serverAuth'}",
                 "subjectKeyIdentifier=hash", "authorityKeyIdentifier=keyid,issuer"]
        if sans:
            lines.append(f"subjectAltName={_san(sans)}")
        ext.write_text("\n".join(lines) + "\n")
        openssl(["ca", "-batch", "-config", str(self.conf), "-notext", "-in", str(csr), "-out", str(cert),
                 "-startdate", asn1_time(not_before), "-enddate", asn1_time(not_after),
                 "-extfile", str(ext), "-extensions", "ext"], cwd=d)
        if passphrase is not None:
            r = subprocess.run(["openssl", "pkcs8", "-topk8", "-v2", "aes-256-cbc", "-in", str(key),
                                "-passout", "env:SLUICE_E2E_KEYPASS"], capture_output=True, timeout=60,
                               env={**os.environ, "SLUICE_E2E_KEYPASS": passphrase})
            if r.returncode != 0:
                raise RuntimeError(f"encrypting {key}: {r.stderr.decode(errors='replace')}")
            key.write_bytes(r.stdout)
        chain.write_bytes(cert.read_bytes() + self.pem.read_bytes())
        return Cert(name, cert, key, chain, passphrase, self)

    def revoke(self, c: Cert) -> None:
        openssl(["ca", "-batch", "-config", str(self.conf), "-revoke", str(c.cert),
                 "-crl_reason", "keyCompromise"], cwd=self.dir)

    def crl(self, name: str = "crl.pem") -> Path:
        """A fresh CRL (PEM) listing everything revoked so far."""
        out = self.dir / name
        openssl(["ca", "-batch", "-config", str(self.conf), "-gencrl", "-out", str(out), "-crldays", "2"],
                cwd=self.dir)
        return out

    def ocsp_response(self, c: Cert, name: str | None = None) -> Path:
        """An OCSP response (DER) for the leaf, signed by this CA, made offline from the index
        (good unless revoked), valid for two days: what nginx's `ssl_stapling_file` takes."""
        req = self.dir / f"{c.name}.ocsp-req.der"
        out = self.dir / (name or f"{c.name}.ocsp-resp.der")
        openssl(["ocsp", "-issuer", str(self.pem), "-cert", str(c.cert), "-no_nonce", "-reqout", str(req)],
                cwd=self.dir)
        openssl(["ocsp", "-index", str(self.dir / "index.txt"), "-CA", str(self.pem), "-rsigner", str(self.pem),
                 "-rkey", str(self.key), "-reqin", str(req), "-respout", str(out), "-ndays", "2"], cwd=self.dir)
        return out


def self_signed(d: Path, name: str, sans: list[str] | None = None, slash_pin: bool = False) -> Cert:
    """A self-signed server certificate (not a CA) for 127.0.0.1 and localhost by default;
    slash_pin: its pin's base64 starts with "/" (see new_key)."""
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    key, cert = d / f"{name}.key", d / f"{name}.pem"
    new_key(key, slash_pin)
    openssl(["req", "-x509", "-key", str(key), "-out", str(cert), "-days", "2",
             "-subj", f"/O=Sluice E2E/CN={name}",
             "-addext", "basicConstraints=critical,CA:FALSE",
             "-addext", "keyUsage=critical,digitalSignature,keyEncipherment",
             "-addext", "extendedKeyUsage=serverAuth",
             "-addext", f"subjectAltName={_san(sans or ['127.0.0.1', 'localhost'])}"], cwd=d)
    return Cert(name, cert, key, cert)


def spki_pin(pem: Path) -> str:
    """`sha256/BASE64` of the certificate's DER SubjectPublicKeyInfo (the contract's pipeline)."""
    r = subprocess.run(["bash", "-c", "set -o pipefail; openssl x509 -in \"$1\" -pubkey -noout | "
                        "openssl pkey -pubin -outform der | openssl dgst -sha256 -binary | base64", "_", str(pem)],
                       capture_output=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"pin of {pem}: {r.stderr.decode(errors='replace')}")
    return "sha256/" + r.stdout.decode().strip()


def public_key_pem(c: Cert, out: Path) -> Path:
    """The certificate's public key as a PEM file (a `public_keys:` entry may name one)."""
    out.write_bytes(openssl(["x509", "-in", str(c.cert), "-pubkey", "-noout"]))
    return out


def ocsp_status(resp_der: Path) -> str:
    """`good` / `revoked` / ... as `openssl ocsp -respin -text` reads it (for fixture checks)."""
    txt = openssl(["ocsp", "-respin", str(resp_der), "-resp_text", "-noverify"]).decode()
    m = re.search(r"Cert Status: (\w+)", txt)
    return m.group(1) if m else txt


# ------------------------------------------------------------------------------------------
# nginx with purpose-built TLS servers
# ------------------------------------------------------------------------------------------

LOG_FORMAT = ("log_format tls '$connection $connection_requests $ssl_session_reused $status "
              "\"$request\" \"$ssl_client_s_dn\" \"$ssl_protocol\" \"$http_host\"';")
LINE_RE = re.compile(r'^(\d+) (\d+) (\S+) (\d+) "([^"]*)" "([^"]*)" "([^"]*)" "([^"]*)"$')


@dataclass
class LogLine:
    connection: int
    connection_requests: int
    session_reused: bool
    status: int
    request: str
    client_dn: str
    protocol: str
    host: str


@dataclass
class TLSServerSpec:
    name: str
    chain: Path
    key: Path
    client_ca: Path | None = None          # ssl_verify_client on; ssl_client_certificate
    stapling_file: Path | None = None      # ssl_stapling on; ssl_stapling_file
    port: int = 0
    access_log: Path = field(default_factory=Path)

    def url(self, path: str, host: str = HOST) -> str:
        return f"https://{host}:{self.port}{path}"

    def lines(self) -> list[LogLine]:
        out = []
        try:
            text = self.access_log.read_text("utf-8", "replace")
        except OSError:
            return out
        for raw in text.splitlines():
            m = LINE_RE.match(raw.strip())
            if not m:
                raise AssertionError(f"unexpected nginx log line in {self.access_log}: {raw!r}")
            out.append(LogLine(int(m[1]), int(m[2]), m[3] == "r", int(m[4]), m[5], m[6], m[7], m[8]))
        return out

    def lines_for(self, tag: str) -> list[LogLine]:
        """The lines whose request line contains tag (tests put a unique query in each URL)."""
        return [ln for ln in self.lines() if tag in ln.request]

    def log_text(self) -> str:
        return tail(self.access_log, 8000)


SERVER_BLOCK = """\
    server {{
        listen {host}:{port} ssl;
        ssl_certificate {chain};
        ssl_certificate_key {key};
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_session_cache shared:{name}:1m;
        access_log {log} tls;
        root {www};
{extra}        location = /token {{
            default_type application/json;
            return 200 '{{"access_token":"tls-token-1","token_type":"Bearer","expires_in":3600}}';
        }}
        location = /whoami {{
            add_header X-Client-DN "$ssl_client_s_dn" always;
            return 200 "dn=$ssl_client_s_dn\\n";
        }}
    }}
"""

NGINX_TLS_HTTP = """\
    types {{ application/octet-stream bin; text/plain txt; }}
    default_type application/octet-stream;
    keepalive_requests 100000;
    keepalive_timeout 120s;
{servers}"""


class TLSNginx:
    """One nginx process serving the given TLS servers (each on its own loopback port) from a
    www directory with `/1k` (1024 random bytes) and `/hello.txt`."""

    def __init__(self, d: Path, specs: list[TLSServerSpec]):
        self.dir = Path(d)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.www = self.dir / "www"
        self.www.mkdir(exist_ok=True)
        self.file_1k = os.urandom(1024)
        (self.www / "1k").write_bytes(self.file_1k)
        (self.www / "hello.txt").write_bytes(b"hello from a trust-test server\n")
        self.servers: dict[str, TLSServerSpec] = {}
        blocks = []
        for s in specs:
            s.port = pick_port()
            s.access_log = self.dir / f"{s.name}.access.log"
            extra = ""
            if s.client_ca is not None:
                extra += f"        ssl_verify_client on;\n        ssl_client_certificate {s.client_ca};\n"
            if s.stapling_file is not None:
                extra += f"        ssl_stapling on;\n        ssl_stapling_file {s.stapling_file};\n"
            blocks.append(SERVER_BLOCK.format(host=HOST, port=s.port, chain=s.chain, key=s.key, name=s.name,
                                              log=s.access_log, www=self.www, extra=extra))
            self.servers[s.name] = s
        self.conf = self.dir / "nginx.conf"
        self.conf.write_text(nginx_conf(self.dir, NGINX_TLS_HTTP.format(servers="".join(blocks)),
                                        error_level="info", log_directives=LOG_FORMAT))
        self.log = open(self.dir / "stderr.log", "wb")
        self.proc = spawn(["nginx", "-p", str(self.dir), "-e", str(self.dir / "error.log"), "-c", str(self.conf)],
                          stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL)
        try:
            for s in specs:
                wait_port(s.port, 15, self.proc)
        except Exception as e:
            self.stop()
            raise RuntimeError(f"nginx did not start: {e}\n{tail(self.dir / 'stderr.log')}\n"
                               f"{tail(self.dir / 'error.log')}\nconfig:\n{self.conf.read_text()}") from e

    def __getitem__(self, name: str) -> TLSServerSpec:
        return self.servers[name]

    def error_log(self) -> str:
        return tail(self.dir / "error.log")

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()


def handshake_figures(lines: list[LogLine]) -> dict[str, int]:
    """From a TLS server's log lines: requests, distinct upstream connections, handshakes (first
    request on a connection) and how many of those resumed a session."""
    firsts = [ln for ln in lines if ln.connection_requests == 1]
    return {"requests": len(lines), "connections": len({ln.connection for ln in lines}),
            "handshakes": len(firsts), "reused_sessions": sum(1 for ln in firsts if ln.session_reused)}
