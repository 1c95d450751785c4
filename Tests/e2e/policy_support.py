"""Helpers for the per-host policy tests (adapters, redirects, monitors, reload, routes,
`sluice check --host`): secrets in the environment, config rewrites + SIGHUP, access-log and
debug-log readers, and a `sluice check` runner.

Secrets reach Sluice the way they do in production, as `${NAME}` references resolved from
its environment: the `secret_env` fixture puts distinctive values into os.environ (via
monkeypatch), and both `spawn` (conftest) and `run_check` below hand a copy of os.environ
(minus proxy variables) to the child.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets as pysecrets
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import SLUICE_BIN, Sluice
from support import clean_env, session_via, tail, wait_until

# ------------------------------------------------------------------------------------------
# Secrets
# ------------------------------------------------------------------------------------------


class Secrets:
    """Distinctive secret values, exported as environment variables for Sluice."""

    def __init__(self):
        tag = pysecrets.token_hex(6)
        self.token = f"tokSECRET{tag}"          # bearer
        self.user = "svcuser"
        self.password = f"pwSECRET{tag}"        # basic password
        self.header_key = f"hkSECRET{tag}"      # api_key in a header
        self.query_key = f"qkSECRET{tag}"       # api_key in the query
        self.env = {
            "E2E_TOKEN": self.token,
            "E2E_PASSWORD": self.password,
            "E2E_HEADER_KEY": self.header_key,
            "E2E_QUERY_KEY": self.query_key,
        }

    @property
    def basic_b64(self) -> str:
        return base64.b64encode(f"{self.user}:{self.password}".encode()).decode()

    def values(self) -> list[str]:
        """Every string whose presence in output would leak a secret."""
        return [self.token, self.password, self.header_key, self.query_key, self.basic_b64]

    def assert_absent(self, text: str, where: str) -> None:
        for v in self.values():
            assert v not in text, f"secret {v!r} appears in {where}:\n{_context(text, v)}"


def _context(text: str, needle: str, width: int = 300) -> str:
    i = text.find(needle)
    return text[max(0, i - width): i + len(needle) + width]


# The ${...} references in the example config (config/sluice.yaml).
EXAMPLE_SECRET_VARS = ("SLUICE_API_TOKEN", "SLUICE_API_PASSWORD", "SLUICE_API_KEY", "SLUICE_SEARCH_KEY",
                       "SLUICE_OAUTH_SECRET", "SLUICE_OAUTH_REFRESH", "SLUICE_CORP_PASSWORD", "SLUICE_CORP_PROXY_PASSWORD",
                       "SLUICE_CORP_CLIENT_KEY_PASSPHRASE", "SLUICE_ADMIN_TOKEN", "SLUICE_AWS_SECRET",
                       "SLUICE_AWS_TOKEN", "SLUICE_FLEET_SECRET")


@pytest.fixture
def secret_env(monkeypatch, tmp_path) -> Secrets:
    s = Secrets()
    for k, v in s.env.items():
        monkeypatch.setenv(k, v)
    # the example config (config/sluice.yaml) uses these
    for k in EXAMPLE_SECRET_VARS:
        monkeypatch.setenv(k, f"{k.lower()}-SECRET-{pysecrets.token_hex(4)}")
    # ... and http_signature's key: an HMAC secret in base64
    monkeypatch.setenv("SLUICE_SIGNING_KEY", base64.b64encode(pysecrets.token_bytes(32)).decode())
    # ... and an AWS shared credentials file with the `queues` profile (its secret is checked too)
    aws = tmp_path / "aws-credentials"
    aws_secret = f"aws-file-SECRET-{pysecrets.token_hex(8)}"
    aws.write_text(f"[queues]\naws_access_key_id = AKIAEXAMPLEQUEUES\naws_secret_access_key = {aws_secret}\n")
    monkeypatch.setenv("SLUICE_AWS_CREDENTIALS", str(aws))
    monkeypatch.setenv("SLUICE_AWS_FILE_SECRET", aws_secret)
    # ... and a client certificate whose key is encrypted with SLUICE_CORP_CLIENT_KEY_PASSPHRASE
    d = tmp_path / "example-client-cert"
    d.mkdir()
    env = dict(os.environ)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-keyout", str(d / "client.key"), "-out", str(d / "client.pem"), "-days", "2",
                    "-subj", "/CN=sluice-example-client", "-passout", "env:SLUICE_CORP_CLIENT_KEY_PASSPHRASE"],
                   check=True, capture_output=True, timeout=60, env=env)
    monkeypatch.setenv("SLUICE_CORP_CLIENT_CERT", str(d / "client.pem"))
    monkeypatch.setenv("SLUICE_CORP_CLIENT_KEY", str(d / "client.key"))
    # ... and a users file for access.proxy_auth (SHA-256 crypt of a random password)
    users = d / "users"
    hashed = subprocess.run(["openssl", "passwd", "-5", pysecrets.token_hex(8)], check=True, capture_output=True,
                            text=True, timeout=30).stdout.strip()
    users.write_text(f"example:{hashed}\n")
    monkeypatch.setenv("SLUICE_USERS_FILE", str(users))
    return s


# ------------------------------------------------------------------------------------------
# sluice check
# ------------------------------------------------------------------------------------------


def run_check(config: Path | str, host: str | None = None, timeout: float = 20) -> subprocess.CompletedProcess:
    args = [SLUICE_BIN, "check", "--config", str(config)]
    if host is not None:
        args += ["--host", host]
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=clean_env(),
                          stdin=subprocess.DEVNULL)


def write_yaml(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


# ------------------------------------------------------------------------------------------
# Reload
# ------------------------------------------------------------------------------------------


def read_config(s: Sluice) -> dict:
    return yaml.safe_load(s.config_path.read_text())


def write_config_text(s: Sluice, text: str) -> None:
    """Replace the file atomically, so a reload never reads a half-written file."""
    tmp = s.config_path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, s.config_path)


def set_sections(s: Sluice, **sections) -> dict:
    """Rewrite Sluice's config file with these top-level sections replaced (None removes)."""
    cfg = read_config(s)
    for k, v in sections.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    write_config_text(s, yaml.safe_dump(cfg, sort_keys=False))
    return cfg


def sighup(s: Sluice) -> None:
    os.kill(s.pid, signal.SIGHUP)


def stderr_len(s: Sluice) -> int:
    try:
        return s.err_path.stat().st_size
    except OSError:
        return 0


def stderr_since(s: Sluice, offset: int) -> str:
    try:
        with open(s.err_path, "rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


# ------------------------------------------------------------------------------------------
# Requests
# ------------------------------------------------------------------------------------------


def get_json(proxy_url: str, url: str, method: str = "GET", timeout: float = 15, **kw) -> tuple[int, dict | None, object]:
    r = session_via(proxy_url).request(method, url, timeout=timeout, allow_redirects=False, **kw)
    try:
        j = r.json()
    except ValueError:
        j = None
    return r.status_code, j, r


def header_values(headers: list[tuple[str, str]], name: str) -> list[str]:
    return [v for k, v in headers if k.lower() == name.lower()]


# ------------------------------------------------------------------------------------------
# Monitors
# ------------------------------------------------------------------------------------------


class AccessLog:
    def __init__(self, path: Path):
        self.path = Path(path)

    def text(self) -> str:
        try:
            return self.path.read_text("utf-8", "replace")
        except OSError:
            return ""

    def lines(self) -> list[dict]:
        """The complete lines: a last line without its newline is still being written."""
        out = []
        text = self.text()
        if not text.endswith("\n"):
            text = text[:text.rfind("\n") + 1]
        for raw in text.splitlines():
            if raw.strip():
                try:
                    out.append(json.loads(raw))
                except ValueError as e:
                    raise AssertionError(f"access log line is not JSON: {raw!r} ({e})") from e
        return out

    def wait_for(self, pred=lambda e: True, n: int = 1, timeout: float = 5.0) -> list[dict]:
        """Wait (the writer flushes at least every 200 ms) until n lines match pred."""
        found: list[dict] = []

        def ok():
            nonlocal found
            found = [e for e in self.lines() if pred(e)]
            return len(found) >= n

        assert wait_until(ok, timeout, 0.05), (
            f"expected {n} matching access-log line(s) in {self.path} within {timeout}s, "
            f"found {len(found)}; log:\n{self.text()[-4000:]}")
        return found


DEBUG_RE = re.compile(r"^debug (\S+) try (\d+): curl (.*)$")


def debug_lines(text: str) -> list[re.Match]:
    return [m for m in (DEBUG_RE.match(line.strip()) for line in text.splitlines()) if m]


def wait_debug(path_or_fn, pred, timeout: float = 5.0) -> list[re.Match]:
    """Debug lines (from a file path or a text-producing callable) matching pred."""
    got: list[re.Match] = []

    def text():
        return path_or_fn() if callable(path_or_fn) else tail(path_or_fn, 1 << 20)

    def ok():
        nonlocal got
        got = [m for m in debug_lines(text()) if pred(m)]
        return bool(got)

    assert wait_until(ok, timeout, 0.05), f"no matching debug line within {timeout}s; output:\n{text()[-4000:]}"
    return got


def monitors(access: Path | None = None, debug: Path | str | None = None) -> list[dict]:
    out = []
    if access is not None:
        out.append({"access_log": {"path": str(access)}})
    if debug is not None:
        out.append({"debug": {"path": str(debug)}})
    return out


def until(cond, timeout: float = 5.0, interval: float = 0.05, what: str = "condition") -> None:
    assert wait_until(cond, timeout, interval), f"{what} not reached within {timeout}s"


def monotonic_deadline(seconds: float) -> float:
    return time.monotonic() + seconds
