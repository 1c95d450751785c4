"""`sluice check --config FILE --host NAME` (docs/configuration.md, "Checking"): prints the
effective policy of a host: the matched entry, the adapters in order with the entry each
comes from, the redirect behaviour and the monitors; secrets print as <redacted>. Run on the
shipped example config/sluice.yaml."""

import re

import pytest

from conftest import REPO
from policy_support import EXAMPLE_SECRET_VARS, run_check, secret_env  # noqa: F401

EXAMPLE = REPO / "config" / "sluice.yaml"


def adapter_lines(out: str, names: list[str]) -> list[str]:
    """The first line mentioning each adapter name, in output order; asserts the order."""
    lines = out.splitlines()
    found = []
    start = 0
    for name in names:
        for i in range(start, len(lines)):
            if re.search(rf"\b{name}\b", lines[i]):
                found.append(lines[i])
                start = i + 1
                break
        else:
            raise AssertionError(f"adapter {name!r} not listed (in order {names}) in:\n{out}")
    return found


@pytest.mark.parametrize("host,entry,adapters,redirect", [
    ("api.example.com", "api.example.com",
     [("headers", "default"), ("bearer", "api.example.com"), ("basic", "api.example.com"),
      ("api_key", "api.example.com"), ("deflate", "api.example.com")], "follow"),
    ("API.Example.COM", "api.example.com",
     [("headers", "default"), ("bearer", "api.example.com"), ("basic", "api.example.com"),
      ("api_key", "api.example.com"), ("deflate", "api.example.com")], "follow"),
    ("search.example.com", "search.example.com",
     [("headers", "default"), ("api_key", "search.example.com"), ("deflate", "search.example.com")], "modify"),
    ("reports.example.com", "reports.example.com",
     [("headers", "default"), ("oauth2", "reports.example.com")], "do_not_follow"),
    ("s3.eu-west-1.amazonaws.com", "s3.eu-west-1.amazonaws.com",
     [("headers", "default"), ("aws_sigv4", "s3.eu-west-1.amazonaws.com")], "do_not_follow"),
    ("payments.example.com", "payments.example.com",
     [("headers", "default"), ("http_signature", "payments.example.com")], "do_not_follow"),
    ("sqs.eu-west-1.amazonaws.com", "sqs.eu-west-1.amazonaws.com",
     [("headers", "default"), ("aws_sigv4", "sqs.eu-west-1.amazonaws.com")], "do_not_follow"),
    ("build.corp.internal", "*.corp.internal", [("headers", "default")], "modify"),
    ("elsewhere.test", "default", [("headers", "default")], "do_not_follow"),
])
def test_check_host_prints_effective_policy(secret_env, host, entry, adapters, redirect):
    r = run_check(EXAMPLE, host)
    assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    out = r.stdout
    assert entry in out, f"matched entry {entry!r} not named:\n{out}"
    for line, (name, origin) in zip(adapter_lines(out, [a for a, _ in adapters]), adapters):
        assert origin in line, f"adapter {name} should be shown as coming from {origin!r}: {line!r}\n{out}"
    for absent in {"bearer", "basic", "api_key", "deflate", "oauth2", "aws_sigv4", "http_signature"} - {
            a for a, _ in adapters}:
        assert not re.search(rf"\b{absent}\b", out), f"{host}: adapter {absent} should not apply:\n{out}"
    assert redirect in out, f"redirect behaviour {redirect!r} not shown:\n{out}"
    assert "access_log" in out and "debug" in out, f"monitors not shown:\n{out}"


def test_check_host_redacts_secrets(secret_env, monkeypatch):
    import os
    r = run_check(EXAMPLE, "api.example.com")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("<redacted>") >= 3, f"bearer, password and key should print as <redacted>:\n{r.stdout}"
    for var in EXAMPLE_SECRET_VARS:
        assert os.environ[var] not in r.stdout + r.stderr, f"{var}'s value printed:\n{r.stdout}"
    # the api_key in a query, the oauth2 client secret and refresh token, the credentials password
    # ... and the signers' secret access key and HMAC key
    for host in ("search.example.com", "reports.example.com", "build.corp.internal", "s3.eu-west-1.amazonaws.com",
                 "payments.example.com", "sqs.eu-west-1.amazonaws.com"):
        r = run_check(EXAMPLE, host)
        assert r.returncode == 0 and ("<redacted>" in r.stdout or "sqs" in host), r.stdout
        for var in EXAMPLE_SECRET_VARS + ("SLUICE_SIGNING_KEY", "SLUICE_AWS_FILE_SECRET"):
            assert os.environ[var] not in r.stdout + r.stderr, f"{host}: {var}'s value printed:\n{r.stdout}"


def test_check_host_fails_like_check_on_invalid_file(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("policies:\n  default:\n    adapters:\n      - bearr: x\n")
    r = run_check(p, "a.test")
    assert r.returncode == 1, r.stdout
    assert re.search(re.escape(str(p)) + r":4:\d+: error: .*bearr", r.stderr), r.stderr
    assert "bearer" in r.stderr.replace("bearr", ""), f"no did-you-mean for bearer: {r.stderr}"


@pytest.mark.parametrize("host,line", [
    ("elsewhere.test", "upstream engine: native (plain http origin)"),
    ("legacy.example.com", "upstream engine: curl (upstream.engine: curl)"),
    ("inventory.example.com", "upstream engine: curl (https origin, HTTP/2 offered by ALPN), then native "
                              "(https origin that chose HTTP/1.1 by ALPN)"),
    ("build.corp.internal", "upstream engine: curl (credentials (auth challenges))"),
])
def test_check_host_shows_the_upstream_engine(secret_env, host, line):
    """The engine a plain-http request to the host gets (docs/configuration.md, "Upstream engine")."""
    r = run_check(EXAMPLE, host)
    assert r.returncode == 0, r.stderr
    assert f"  {line}\n" in r.stdout, r.stdout
