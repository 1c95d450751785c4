"""Per-host policies (docs/configuration.md, "Policies"): the adapters `headers`, `bearer`,
`basic`, `api_key`; default adapters running before the host's; exact vs wildcard matching
(live through httpbin and the recording upstream, and through `sluice check --host`);
secret references (`${ENV}`, `file:`) and their errors."""

import re
import time

import pytest

from policy_support import get_json, header_values, run_check, secret_env, write_yaml  # noqa: F401
from rawhttp import RawConn, request_bytes
from support import HOST, session_via


def pol(**entries) -> dict:
    return {"policies": entries}


def hdrs(set=None, add=None, remove=None) -> dict:
    h = {}
    if remove is not None:
        h["remove"] = remove
    if set is not None:
        h["set"] = set
    if add is not None:
        h["add"] = add
    return {"headers": h}


def recorded_one(recorder) -> dict:
    reqs = recorder.requests()
    assert len(reqs) == 1, f"upstream saw {len(reqs)} requests: {[q['raw_head'] for q in reqs]}"
    return reqs[0]


# ------------------------------------------------------------------------------------------
# Adapter order: the default policy's first, then the host's, each list in order
# ------------------------------------------------------------------------------------------

def test_default_adapters_run_before_host_adapters_httpbin(sluice_factory, httpbin):
    proxy = sluice_factory(pol(**{
        "default": {"adapters": [hdrs(set={"X-Order": "default"})]},
        HOST: {"adapters": [hdrs(add={"X-Order": "host"})]},
    }))
    status, j, r = get_json(proxy.url, httpbin.url + "/headers", headers={"X-Order": "client"})
    assert status == 200, r.text
    # httpbin joins repeated fields with ","; set replaced the client's value, then add appended
    assert j["headers"].get("X-Order") == "default,host", j


def test_adapter_order_on_the_wire(sluice_factory, recorder):
    """Exact field lines as the upstream sees them: default's set, then host's adds in list order."""
    proxy = sluice_factory(pol(**{
        "default": {"adapters": [hdrs(set={"X-Order": "default"})]},
        HOST: {"adapters": [hdrs(add={"X-Order": "host-1"}), hdrs(add={"X-Order": "host-2"})]},
    }))
    with RawConn(HOST, proxy.port) as c:
        c.send(request_bytes("GET", recorder.url + "/order", {"X-Order": "client"}))
        r = c.read_response()
    assert r.status == 200, r
    q = recorded_one(recorder)
    assert header_values(q["headers"], "X-Order") == ["default", "host-1", "host-2"], q["raw_head"]


def test_host_adapters_later_in_list_see_earlier_edits(sluice_factory, recorder):
    """Within one policy, adapters run in list order: a later `set` overrides an earlier `add`."""
    proxy = sluice_factory(pol(**{
        HOST: {"adapters": [hdrs(add={"X-Step": "first"}), hdrs(set={"X-Step": "second"})]},
    }))
    r = session_via(proxy.url).get(recorder.url + "/steps", timeout=10)
    assert r.status_code == 200
    assert header_values(recorded_one(recorder)["headers"], "X-Step") == ["second"]


# ------------------------------------------------------------------------------------------
# headers: set / add / remove
# ------------------------------------------------------------------------------------------

def test_headers_set_add_remove(sluice_factory, recorder):
    proxy = sluice_factory(pol(default={"adapters": [hdrs(
        set={"X-Forwarded-By": "sluice"}, add={"X-Trace": "a"}, remove=["X-Internal"])]}))
    with RawConn(HOST, proxy.port) as c:
        c.send(request_bytes("GET", recorder.url + "/h", [
            ("X-Internal", "one"), ("x-internal", "two"), ("X-Forwarded-By", "client"),
            ("X-Trace", "client"), ("X-Other", "kept")]))
        r = c.read_response()
    assert r.status == 200, r
    h = recorded_one(recorder)["headers"]
    assert header_values(h, "X-Internal") == [], f"remove left a field: {h}"
    assert header_values(h, "X-Forwarded-By") == ["sluice"], h
    assert header_values(h, "X-Trace") == ["client", "a"], h
    assert header_values(h, "X-Other") == ["kept"], h


def test_headers_edits_run_remove_then_set_then_add(sluice_factory, recorder):
    """In one `headers` adapter: remove first (so set/add of the same name survive), then set,
    then add (so add appends to what set wrote)."""
    proxy = sluice_factory(pol(default={"adapters": [hdrs(
        remove=["X-A", "X-B", "X-C"], set={"X-A": "set", "X-C": "set"}, add={"X-B": "added", "X-C": "added"})]}))
    with RawConn(HOST, proxy.port) as c:
        c.send(request_bytes("GET", recorder.url + "/h", [("X-A", "client"), ("X-B", "client"), ("X-C", "client")]))
        r = c.read_response()
    assert r.status == 200, r
    h = recorded_one(recorder)["headers"]
    assert header_values(h, "X-A") == ["set"], h
    assert header_values(h, "X-B") == ["added"], h
    assert header_values(h, "X-C") == ["set", "added"], h


def test_headers_set_is_case_insensitive(sluice_factory, recorder):
    proxy = sluice_factory(pol(default={"adapters": [hdrs(set={"X-Mixed-Case": "sluice"})]}))
    with RawConn(HOST, proxy.port) as c:
        c.send(request_bytes("GET", recorder.url + "/h", [("x-mixed-case", "client")]))
        assert c.read_response().status == 200
    assert header_values(recorded_one(recorder)["headers"], "X-Mixed-Case") == ["sluice"]


# ------------------------------------------------------------------------------------------
# bearer / basic / api_key, with secrets from the environment and from a file
# ------------------------------------------------------------------------------------------

def test_bearer_from_env(sluice_factory, httpbin, secret_env):
    proxy = sluice_factory(pol(**{HOST: {"adapters": [{"bearer": "${E2E_TOKEN}"}]}}))
    status, j, r = get_json(proxy.url, httpbin.url + "/bearer")
    assert status == 200, r.text
    assert j == {"authenticated": True, "token": secret_env.token}
    # the client's own Authorization is replaced, not duplicated
    status, j, r = get_json(proxy.url, httpbin.url + "/bearer", headers={"Authorization": "Bearer client"})
    assert status == 200 and j["token"] == secret_env.token, r.text


def test_bearer_literal_token(sluice_factory, httpbin):
    proxy = sluice_factory(pol(**{HOST: {"adapters": [{"bearer": "plain-literal-token"}]}}))
    status, j, r = get_json(proxy.url, httpbin.url + "/bearer")
    assert status == 200 and j["token"] == "plain-literal-token", r.text


def test_basic_from_env(sluice_factory, httpbin, secret_env):
    proxy = sluice_factory(pol(**{HOST: {"adapters": [
        {"basic": {"username": secret_env.user, "password": "${E2E_PASSWORD}"}}]}}))
    status, j, r = get_json(proxy.url, f"{httpbin.url}/basic-auth/{secret_env.user}/{secret_env.password}")
    assert status == 200, f"{status} {r.text}"
    assert j == {"authenticated": True, "user": secret_env.user}
    # and a wrong password in the path is refused by httpbin: the header really carries it
    status, _, _ = get_json(proxy.url, f"{httpbin.url}/basic-auth/{secret_env.user}/wrong")
    assert status == 401


def test_basic_password_from_file_strips_trailing_newlines(sluice_factory, httpbin, tmp_path):
    pw = tmp_path / "password"
    pw.write_text("fromFILEpw42\n\n")
    proxy = sluice_factory(pol(**{HOST: {"adapters": [
        {"basic": {"username": "fileuser", "password": f"file:{pw}"}}]}}))
    status, j, r = get_json(proxy.url, f"{httpbin.url}/basic-auth/fileuser/fromFILEpw42")
    assert status == 200, f"{status} {r.text}"


def test_api_key_in_header(sluice_factory, httpbin, secret_env):
    proxy = sluice_factory(pol(**{HOST: {"adapters": [
        {"api_key": {"header": "X-Api-Key", "value": "${E2E_HEADER_KEY}"}}]}}))
    status, j, r = get_json(proxy.url, httpbin.url + "/anything/k", headers={"X-Api-Key": "client-value"})
    assert status == 200, r.text
    assert j["headers"].get("X-Api-Key") == secret_env.header_key, j["headers"]


def test_api_key_in_query_added_and_replaced(sluice_factory, httpbin, secret_env):
    proxy = sluice_factory(pol(**{HOST: {"adapters": [
        {"api_key": {"query": "api_key", "value": "${E2E_QUERY_KEY}"}}]}}))
    status, j, r = get_json(proxy.url, httpbin.url + "/anything/q?x=1")
    assert status == 200, r.text
    assert j["args"] == {"x": "1", "api_key": secret_env.query_key}, j
    status, j, r = get_json(proxy.url, httpbin.url + "/anything/q?api_key=client&y=2")
    assert status == 200, r.text
    assert j["args"] == {"api_key": secret_env.query_key, "y": "2"}, \
        f"api_key should be replaced (one value), got {j['args']}"
    status, j, r = get_json(proxy.url, httpbin.url + "/anything/q")
    assert j["args"] == {"api_key": secret_env.query_key}, j


# ------------------------------------------------------------------------------------------
# Matching
# ------------------------------------------------------------------------------------------

def test_exact_names_ip_vs_localhost_and_no_entry(sluice_factory, httpbin):
    proxy = sluice_factory(pol(**{
        "default": {"adapters": [hdrs(set={"X-Default": "yes"})]},
        HOST: {"adapters": [hdrs(set={"X-Policy": "ip"})]},
    }))
    _, j, _ = get_json(proxy.url, f"http://127.0.0.1:{httpbin.port}/headers")
    assert j["headers"].get("X-Policy") == "ip" and j["headers"].get("X-Default") == "yes", j
    # localhost has no entry: default alone
    _, j, _ = get_json(proxy.url, f"http://localhost:{httpbin.port}/headers")
    assert "X-Policy" not in j["headers"] and j["headers"].get("X-Default") == "yes", j

    proxy2 = sluice_factory(pol(**{
        HOST: {"adapters": [hdrs(set={"X-Policy": "ip"})]},
        "localhost": {"adapters": [hdrs(set={"X-Policy": "localhost"})]},
    }), name="two")
    _, j, _ = get_json(proxy2.url, f"http://127.0.0.1:{httpbin.port}/headers")
    assert j["headers"].get("X-Policy") == "ip", j
    _, j, _ = get_json(proxy2.url, f"http://localhost:{httpbin.port}/headers")
    assert j["headers"].get("X-Policy") == "localhost", j


def test_wildcard_matching_live(sluice_factory, httpbin):
    """`*.localhost` names resolve to loopback inside libcurl (not via /etc/hosts), so these
    requests really reach httpbin through wildcard entries."""
    proxy = sluice_factory(pol(**{
        "*.localhost": {"adapters": [hdrs(set={"X-Policy": "wild"})]},
        "*.b.localhost": {"adapters": [hdrs(set={"X-Policy": "wild-longer"})]},
        "exact.localhost": {"adapters": [hdrs(set={"X-Policy": "exact"})]},
    }))

    def policy_for(host: str) -> str | None:
        with RawConn(HOST, proxy.port, timeout=15) as c:
            c.send(request_bytes("GET", f"http://{host}:{httpbin.port}/headers"))
            r = c.read_response()
        assert r is not None and r.status == 200, f"{host}: {r!r}"
        import json
        return json.loads(r.body)["headers"].get("X-Policy")

    assert policy_for("foo.localhost") == "wild"
    assert policy_for("deep.foo.localhost") == "wild"
    assert policy_for("a.b.localhost") == "wild-longer", "the longest wildcard suffix wins"
    assert policy_for("exact.localhost") == "exact", "an exact name beats any wildcard"
    assert policy_for("x.exact.localhost") == "wild", "an exact entry does not cover subdomains"
    assert policy_for("FOO.LocalHost") == "wild", "matching is case-insensitive"
    assert policy_for("A.B.LOCALHOST") == "wild-longer"
    assert policy_for("EXACT.localhost") == "exact"
    assert policy_for("localhost") is None, "*.localhost must not match localhost itself"
    assert policy_for("b.localhost") == "wild", "*.b.localhost must not match b.localhost itself"


# Each entry gets a different adapter kind, so `check --host` output shows which matched.
MATCH_CONFIG = {
    "listen": ["127.0.0.1:3128"],
    "policies": {
        "default": {"adapters": [{"headers": {"set": {"X-Default": "1"}}}]},
        "b.example": {"adapters": [{"bearer": "literal-bearer"}]},
        "*.example": {"adapters": [{"basic": {"username": "u", "password": "p"}}]},
        "*.b.example": {"adapters": [{"api_key": {"header": "X-K", "value": "v"}}]},
        "*.c.b.example": {"adapters": ["deflate"]},
    },
}


@pytest.mark.parametrize("host,entry,kind", [
    ("b.example", "b.example", "bearer"),            # exact beats *.example
    ("x.example", "*.example", "basic"),
    ("a.b.example", "*.b.example", "api_key"),        # longest suffix: *.b.example over *.example
    ("z.a.b.example", "*.b.example", "api_key"),
    ("q.c.b.example", "*.c.b.example", "deflate"),
    ("A.B.EXAMPLE", "*.b.example", "api_key"),        # case-insensitive
    ("example", "default", None),                     # *.example does not match example itself
    ("other.org", "default", None),
])
def test_matching_via_check_host(tmp_path, host, entry, kind):
    cfg = write_yaml(tmp_path / "match.yaml", MATCH_CONFIG)
    r = run_check(cfg, host)
    assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    out = r.stdout
    kinds = ["bearer", "basic", "api_key", "deflate"]
    assert "headers" in out, f"default's headers adapter not listed for {host}:\n{out}"
    for k in kinds:
        if k == kind:
            assert k in out, f"{host}: expected entry {entry!r} (adapter {k}) to match:\n{out}"
            assert out.index("headers") < out.index(k), f"default's adapters must come first:\n{out}"
        else:
            assert not re.search(rf"\b{k}\b", out), f"{host}: adapter {k} listed, but {entry!r} should match:\n{out}"
    if entry.startswith("*"):
        assert entry in out, f"matched entry {entry!r} not named in:\n{out}"
    for other in ("*.example", "*.b.example", "*.c.b.example"):
        if other != entry:
            assert other not in out, f"{host}: {other!r} named, but {entry!r} should match:\n{out}"


# ------------------------------------------------------------------------------------------
# Secret references: errors
# ------------------------------------------------------------------------------------------

def test_unset_env_secret_is_a_located_config_error(tmp_path, monkeypatch):
    monkeypatch.delenv("E2E_DEFINITELY_UNSET", raising=False)
    p = tmp_path / "unset.yaml"
    p.write_text('listen: ["127.0.0.1:3128"]\npolicies:\n  api.test:\n    adapters:\n'
                 '      - bearer: ${E2E_DEFINITELY_UNSET}\n')
    r = run_check(p)
    assert r.returncode == 1, f"exit {r.returncode}: {r.stdout}{r.stderr}"
    assert re.search(re.escape(str(p)) + r":5:\d+: error: ", r.stderr), r.stderr
    assert "E2E_DEFINITELY_UNSET" in r.stderr, r.stderr


def test_unreadable_file_secret_is_a_located_config_error(tmp_path):
    missing = tmp_path / "no-such-secret"
    p = tmp_path / "nofile.yaml"
    p.write_text('listen: ["127.0.0.1:3128"]\npolicies:\n  api.test:\n    adapters:\n'
                 f'      - basic: {{ username: u, password: "file:{missing}" }}\n')
    r = run_check(p)
    assert r.returncode == 1, f"exit {r.returncode}: {r.stdout}{r.stderr}"
    assert re.search(re.escape(str(p)) + r":5:\d+: error: ", r.stderr), r.stderr
    assert str(missing) in r.stderr, r.stderr


def test_run_with_unset_secret_exits_1(tmp_path, monkeypatch):
    import subprocess
    from conftest import SLUICE_BIN
    from faultservers import pick_port
    from support import clean_env
    monkeypatch.delenv("E2E_DEFINITELY_UNSET", raising=False)
    p = tmp_path / "unset-run.yaml"
    p.write_text(f'listen: ["127.0.0.1:{pick_port()}"]\npolicies:\n  default:\n    adapters:\n'
                 '      - bearer: ${E2E_DEFINITELY_UNSET}\n')
    r = subprocess.run([SLUICE_BIN, "run", "--config", str(p)], capture_output=True, text=True,
                       timeout=20, env=clean_env(), stdin=subprocess.DEVNULL)
    assert r.returncode == 1, r.stderr
    assert "E2E_DEFINITELY_UNSET" in r.stderr


def test_api_key_query_value_is_percent_encoded(sluice_factory, httpbin):
    """A key with &, =, space and + must arrive as one parameter with exactly that value."""
    proxy = sluice_factory(pol(**{HOST: {"adapters": [
        {"api_key": {"query": "api_key", "value": "k&v=1 2+3"}}]}}))
    status, j, r = get_json(proxy.url, httpbin.url + "/anything/enc?x=1")
    assert status == 200, r.text
    assert j["args"] == {"x": "1", "api_key": "k&v=1 2+3"}, j["args"]


@pytest.mark.parametrize("where", ["bearer-env", "headers-set"])
def test_crlf_in_configured_value_cannot_inject_header(sluice_factory, recorder, tmp_path, monkeypatch, where):
    """A configured value with CR LF inside (from the environment or the YAML) must never
    split into a second header field upstream: either the config is refused, or the adapter
    fails (502, nothing sent), or the value is sent without the line break."""
    monkeypatch.setenv("E2E_CRLF", "tok\r\nX-Injected: evil")
    adapter = {"bearer": "${E2E_CRLF}"} if where == "bearer-env" else \
        {"headers": {"set": {"X-A": "a\r\nX-Injected: evil"}}}
    cfg = {"listen": ["127.0.0.1:3128"], "policies": {HOST: {"adapters": [adapter]}}}
    c = run_check(write_yaml(tmp_path / "crlf.yaml", cfg))
    if c.returncode != 0:
        assert re.search(r":\d+:\d+: error: ", c.stderr), c.stderr
        return
    proxy = sluice_factory({"policies": cfg["policies"]})
    with RawConn(HOST, proxy.port) as conn:
        conn.send(request_bytes("GET", recorder.url + "/crlf"))
        r = conn.read_response()
    assert r is not None, "no response"
    time.sleep(0.3)  # window: no injected header field may reach the upstream in it
    seen = recorder.received()
    assert b"\nX-Injected:" not in seen and b"\rX-Injected:" not in seen, \
        f"header injection through a configured value: {seen!r}"


def test_policy_names_in_config_are_case_insensitive(sluice_factory, httpbin, tmp_path):
    """An entry written `LocalHost` / `*.LOCALHOST` matches `localhost` / `x.localhost`."""
    proxy = sluice_factory(pol(**{
        "LocalHost": {"adapters": [hdrs(set={"X-Policy": "exact-mixed-case"})]},
        "*.LOCALHOST": {"adapters": [hdrs(set={"X-Policy": "wild-upper-case"})]},
    }))
    _, j, _ = get_json(proxy.url, f"http://localhost:{httpbin.port}/headers")
    assert j["headers"].get("X-Policy") == "exact-mixed-case", j["headers"]
    _, j, _ = get_json(proxy.url, f"http://x.localhost:{httpbin.port}/headers")
    assert j["headers"].get("X-Policy") == "wild-upper-case", j["headers"]
