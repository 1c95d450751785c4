"""The command line: `sluice check` (exit codes, FILE:LINE:COL errors, did-you-mean),
`sluice run` with a bad file, `--version`, `--help`."""

import re
import socket
import subprocess
import time

import pytest

from conftest import REPO, SLUICE_BIN
from faultservers import pick_port
from support import clean_env


def sluice(*args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run([SLUICE_BIN, *args], capture_output=True, text=True, timeout=timeout,
                          env=clean_env(), stdin=subprocess.DEVNULL)


def check(tmp_path, text: str, name: str = "sluice.yaml") -> tuple[subprocess.CompletedProcess, str]:
    p = tmp_path / name
    p.write_text(text)
    return sluice("check", "--config", str(p)), str(p)


def assert_located_error(r: subprocess.CompletedProcess, path: str, line: int | tuple[int, ...],
                         cols: tuple[int, ...]) -> str:
    lines = line if isinstance(line, tuple) else (line,)
    assert r.returncode == 1, f"exit {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"
    m = re.search(re.escape(path) + r":(\d+):(\d+): error: (.*)", r.stderr)
    assert m, f"no '{path}:LINE:COL: error: ...' in stderr:\n{r.stderr}"
    assert int(m.group(1)) in lines, f"error at line {m.group(1)}, expected {line}: {m.group(0)}"
    assert int(m.group(2)) in cols, f"error at column {m.group(2)}, expected one of {cols}: {m.group(0)}"
    return m.group(3)


@pytest.fixture(autouse=True)
def _needs_binary(sluice_bin):
    return sluice_bin


VALID = """\
# a complete, valid configuration
listen: ["127.0.0.1:{port}"]
workers: auto
limits:
  request_line: 8KiB
  header_section: 64KiB
  header_count: 100
  request_body: unlimited
timeouts:
  client_header: 30s
  client_idle: 60s
  upstream_connect: 10s
  upstream_per_try: 60s
  total: unlimited
  drain: 30s
access:
  allow_clients: [127.0.0.0/8, "::1/128"]
  connect_ports: [443]
  deny: [169.254.0.0/16, "fe80::/10", "fd00:ec2::254/128", 100.100.100.200/32, 192.0.0.192/32, 168.63.129.16/32]
tls:
  ca_file: {ca}
"""


def test_version():
    r = sluice("--version")
    assert r.returncode == 0, r.stderr
    assert re.search(r"\d+\.\d+", r.stdout), r.stdout


def test_help():
    r = sluice("--help")
    assert r.returncode == 0, r.stderr
    assert "run" in r.stdout and "check" in r.stdout, r.stdout


def test_check_valid_file(tmp_path, pki):
    port = pick_port()
    r, _ = check(tmp_path, VALID.format(port=port, ca=pki.ca_pem))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip(), "check printed nothing on stdout for a valid file"
    # check starts nothing
    s = socket.socket()
    s.settimeout(1)
    with pytest.raises(OSError):
        s.connect(("127.0.0.1", port))
    s.close()


def test_check_docs_example_is_valid(tmp_path, pki):
    """The example in docs/configuration.md is itself a valid file (with a real CA path)."""
    doc = (REPO / "docs" / "configuration.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", doc, re.S).group(1)
    block = block.replace("/path/ca.pem", str(pki.ca_pem))
    r, _ = check(tmp_path, block)
    assert r.returncode == 0, r.stderr


def test_check_units(tmp_path):
    text = """\
listen: ["127.0.0.1:3128", "[::1]:3128"]
workers: 3
limits:
  request_line: 4096
  header_section: 64KB
  header_count: 50
  request_body: 1GiB
timeouts:
  client_header: 500ms
  client_idle: 2m
  upstream_connect: 1s
  upstream_per_try: 1h
  total: 90s
  drain: 1s
"""
    r, _ = check(tmp_path, text)
    assert r.returncode == 0, r.stderr


def test_check_unknown_key_did_you_mean(tmp_path):
    r, path = check(tmp_path, '# top\nworkers: 2\nlistn: ["127.0.0.1:3128"]\n')
    msg = assert_located_error(r, path, 3, (1,))
    assert "listn" in msg
    assert "listen" in msg.replace("listn", ""), f"no did-you-mean for listen: {r.stderr}"


def test_check_unknown_nested_key_did_you_mean(tmp_path):
    r, path = check(tmp_path, "limits:\n  header_count: 10\n  request_lin: 8KiB\n")
    assert_located_error(r, path, 3, (3,))
    assert "request_line" in r.stderr, r.stderr


def test_check_bad_workers_value(tmp_path):
    r, path = check(tmp_path, 'listen: ["127.0.0.1:3128"]\nworkers: -3\n')
    assert_located_error(r, path, 2, (1, 10))
    assert "workers" in r.stderr or "-3" in r.stderr, r.stderr


@pytest.mark.parametrize("text,line,cols", [
    ("limits:\n  request_body: 12XB\n", 2, (3, 17)),
    ("limits:\n  header_count: lots\n", 2, (3, 17)),
    ("timeouts:\n  client_header: soon\n", 2, (3, 18)),
    ("timeouts:\n  drain: -5s\n", 2, (3, 10)),
    ('access:\n  allow_clients: ["10.0.0.0/99"]\n', 2, (3, 18, 19)),
    ("access:\n  connect_ports: [70000]\n", 2, (3, 18, 19)),
    ('listen: ["no-port-here"]\n', 1, (1, 9, 10)),
    ("workers: 0\n", 1, (1, 10)),
])
def test_check_bad_values(tmp_path, text, line, cols):
    r, path = check(tmp_path, text)
    assert_located_error(r, path, line, cols)


def test_check_yaml_syntax_error(tmp_path):
    r, path = check(tmp_path, 'listen: ["127.0.0.1:3128"\nworkers: 2\n')
    assert r.returncode == 1, r.stderr
    assert re.search(re.escape(path) + r":\d+:\d+: error: ", r.stderr), r.stderr


def test_check_missing_file(tmp_path):
    p = tmp_path / "nope.yaml"
    r = sluice("check", "--config", str(p))
    assert r.returncode != 0
    assert str(p) in r.stderr, r.stderr


def test_run_with_bad_config_exits_1_without_listening(tmp_path):
    port = pick_port()
    p = tmp_path / "bad.yaml"
    p.write_text(f'listen: ["127.0.0.1:{port}"]\nworkerz: 2\n')
    t0 = time.monotonic()
    r = sluice("run", "--config", str(p), timeout=20)
    assert r.returncode == 1, r.stderr
    assert time.monotonic() - t0 < 10
    assert re.search(re.escape(str(p)) + r":2:1: error: ", r.stderr), r.stderr
    assert "workers" in r.stderr


def test_run_refuses_port_in_use(tmp_path):
    port = pick_port()
    busy = socket.socket()
    busy.bind(("127.0.0.1", port))
    busy.listen(1)
    try:
        p = tmp_path / "busy.yaml"
        p.write_text(f'listen: ["127.0.0.1:{port}"]\n')
        r = sluice("run", "--config", str(p), timeout=20)
        assert r.returncode != 0, "sluice started on a port already in use"
        assert str(port) in r.stderr, r.stderr
    finally:
        busy.close()


def test_check_reports_every_error(tmp_path):
    r, path = check(tmp_path, 'listen: ["127.0.0.1:3128"]\nworkerz: 2\nlimits:\n  header_count: 10\n  request_lin: 1KiB\n')
    assert r.returncode == 1
    found = {int(m) for m in re.findall(re.escape(path) + r":(\d+):\d+: error: ", r.stderr)}
    assert found == {2, 5}, f"expected errors on lines 2 and 5:\n{r.stderr}"
