"""config/sluice.schema.json against the shipped files and the implementation: every
config/*.yaml validates against the schema AND passes `sluice check`; the example uses every
key the schema knows; schema defaults agree with the embedded default; the docs' examples
validate; and a table of small files is accepted (or rejected, with FILE:LINE:COL) by the
schema and by `sluice check` alike."""

import json
import re

import jsonschema
import pytest
import yaml

from conftest import REPO
from policy_support import run_check, secret_env  # noqa: F401

CONFIG_DIR = REPO / "config"
SCHEMA_PATH = CONFIG_DIR / "sluice.schema.json"
SHIPPED = sorted(CONFIG_DIR.glob("*.yaml"))


@pytest.fixture(scope="module")
def schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


@pytest.fixture(scope="module")
def validator(schema):
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


def errors_of(validator, data) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
            for e in validator.iter_errors(data)]


def test_schema_is_valid_draft_2020_12(schema):
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


def test_shipped_configs_found():
    names = {p.name for p in SHIPPED}
    assert {"default.yaml", "sluice.yaml"} <= names, names
    assert (CONFIG_DIR / "default.yaml").resolve() == (REPO / "Sources" / "SluiceConfig" / "default.yaml").resolve()


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_config_validates_against_schema(validator, path):
    data = yaml.safe_load(path.read_text()) or {}
    errs = errors_of(validator, data)
    assert not errs, f"{path.name} does not match the schema:\n" + "\n".join(errs)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_config_passes_sluice_check(sluice_bin, secret_env, path):
    r = run_check(path)
    assert r.returncode == 0, f"sluice check --config {path} exited {r.returncode}\n{r.stdout}\n{r.stderr}"


# ------------------------------------------------------------------------------------------
# The example covers the schema; the schema covers the docs; defaults agree
# ------------------------------------------------------------------------------------------

def schema_property_names(node, out: set | None = None) -> set:
    out = set() if out is None else out
    if isinstance(node, dict):
        for k, v in node.get("properties", {}).items():
            out.add(k)
        for v in node.values():
            schema_property_names(v, out)
    elif isinstance(node, list):
        for v in node:
            schema_property_names(v, out)
    return out


def yaml_keys(node, out: set | None = None, skip_children_of=("policies", "set", "add")) -> set:
    """Every mapping key, except the free-form names under policies (host names) and
    headers set/add (field names)."""
    out = set() if out is None else out
    if isinstance(node, dict):
        for k, v in node.items():
            if k in skip_children_of and isinstance(v, dict):
                out.add(k)
                for vv in v.values():
                    yaml_keys(vv, out, skip_children_of)
            else:
                out.add(k)
                yaml_keys(v, out, skip_children_of)
    elif isinstance(node, list):
        for v in node:
            yaml_keys(v, out, skip_children_of)
    return out


def test_example_uses_every_schema_key(schema):
    example = yaml.safe_load((CONFIG_DIR / "sluice.yaml").read_text())
    # `disabled` (and its `insecure: true`) stays out of the example on purpose: it turns
    # certificate verification off, which no example should show as a live setting.
    missing = schema_property_names(schema) - yaml_keys(example) - {"disabled", "insecure"}
    assert not missing, f"config/sluice.yaml does not use these keys: {sorted(missing)}"


def test_example_uses_every_form(schema):
    ex = yaml.safe_load((CONFIG_DIR / "sluice.yaml").read_text())
    pols = ex["policies"]
    assert "default" in pols and any(k.startswith("*.") for k in pols), "default and a wildcard entry"
    adapters = [a for p in pols.values() for a in p.get("adapters", [])]
    assert "deflate" in adapters, "the bare word `deflate`"
    assert any(isinstance(a, dict) and "deflate" in a for a in adapters), "deflate with options"
    api_keys = [a["api_key"] for a in adapters if isinstance(a, dict) and "api_key" in a]
    assert any("header" in k for k in api_keys) and any("query" in k for k in api_keys)
    redirects = [p.get("redirect") for p in pols.values()]
    assert "do_not_follow" in redirects
    assert any(isinstance(r, dict) and "follow" in r for r in redirects)
    assert any(isinstance(r, dict) and "modify" in r for r in redirects)
    text = (CONFIG_DIR / "sluice.yaml").read_text()
    assert re.search(r"\$\{[A-Z_]+\}", text), "secrets as ${ENV} references"
    retries = [p["retry"] for p in pols.values() if "retry" in p]
    assert "none" in retries and {} in retries, "retry: none and retry: {}"
    assert any(isinstance(r, dict) and r for r in retries), "a retry section with options"
    assert any(isinstance(p.get("validate"), dict) for p in pols.values()), "a validate section"
    assert any(isinstance(p.get("credentials"), dict) for p in pols.values()), "a credentials section"
    upgrades = [p["upgrades"] for p in pols.values() if "upgrades" in p]
    assert any(isinstance(u, list) for u in upgrades) and any(isinstance(u, dict) for u in upgrades), \
        "upgrades as a list and as a map"
    oauth = [a["oauth2"] for a in adapters if isinstance(a, dict) and "oauth2" in a]
    assert oauth, "an oauth2 adapter"
    for o in oauth:
        for secret_key in ("client_secret", "refresh_token"):
            if secret_key in o:
                assert re.fullmatch(r"\$\{SLUICE_[A-Z_]+\}", o[secret_key]), f"oauth2 {secret_key} as an ${{ENV}} reference"
    for m in ex["monitors"]:
        (kind, opts), = m.items()
        path = opts.get("path", "stdout" if kind == "access_log" else "stderr")
        assert path in ("stdout", "stderr"), "log paths that work anywhere"
    for addr in ex["listen"] + [r["listen"] for r in ex["routes"]]:
        assert addr.startswith(("127.", "[::1]")), f"non-loopback listener {addr}"


def test_schema_defaults_match_embedded_default(schema):
    default = yaml.safe_load((CONFIG_DIR / "default.yaml").read_text())
    props = schema["properties"]
    checked = 0
    for key, value in default.items():
        sub = props[key]
        if isinstance(value, dict):
            for k2, v2 in value.items():
                assert sub["properties"][k2].get("default") == v2, \
                    f"schema default of {key}.{k2} is {sub['properties'][k2].get('default')!r}, default.yaml has {v2!r}"
                checked += 1
        else:
            assert sub.get("default") == value, f"schema default of {key} {sub.get('default')!r} vs {value!r}"
            checked += 1
    assert checked >= 15


def test_every_schema_property_documents_its_default(schema):
    """Every optional key with a default says it in its description."""
    missing = []

    def walk(node, path):
        if isinstance(node, dict):
            for k, v in node.get("properties", {}).items():
                if isinstance(v, dict) and "default" in v:
                    if "Default" not in v.get("description", "") and "default" not in v.get("description", ""):
                        missing.append(f"{path}/{k}")
            for k, v in node.items():
                walk(v, f"{path}/{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}/{i}")

    walk(schema, "")
    assert not missing, f"defaults not stated in description: {missing}"


DOC = REPO / "docs" / "configuration.md"


def doc_text() -> str:
    return DOC.read_text()


def doc_section(title: str) -> str:
    """The body of the `##`/`###` section whose heading starts with `title`."""
    parts = re.split(r"(?m)^(#{2,3} .*)$", doc_text())
    for heading, body in zip(parts[1::2], parts[2::2]):
        if heading.lstrip("#").strip().startswith(title):
            return body
    raise AssertionError(f"docs/configuration.md has no section {title!r}")


def doc_yaml_blocks() -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", doc_text(), re.S)


def as_config(data, schema) -> dict:
    """A docs block as a whole config file: blocks that show one policy's sections (`retry:`,
    `validate:`, `credentials:`, `adapters:`) are placed in the default policy."""
    policy_keys = set(schema["$defs"]["policy"]["properties"])
    if isinstance(data, dict) and data and set(data) <= policy_keys:
        return {"policies": {"default": data}}
    return data


def quote_bare_refs(block: str) -> str:
    """Quote `${...}` where the docs left it bare (it would start a mapping inside `{ }`)."""
    return re.sub(r'(?<!")(\$\{[A-Za-z_][A-Za-z0-9_]*\})(?!")', r'"\1"', block)


def test_docs_examples_parse_and_validate(validator, schema):
    blocks = doc_yaml_blocks()
    assert len(blocks) >= 8
    problems = []
    for i, block in enumerate(blocks):
        try:
            data = yaml.safe_load(block)
        except yaml.YAMLError as e:
            problems.append(f"block {i + 1} is not valid YAML: {e}")
            continue
        problems += [f"block {i + 1}: {e}" for e in errors_of(validator, as_config(data, schema))]
    assert not problems, "docs/configuration.md examples:\n" + "\n".join(problems)


@pytest.mark.parametrize("text", [
    "retry: {}", "retry: none", 'retry: "off"', "validate: none", "credentials: none",
    "redirect: do_not_follow", "redirect: { follow: { max: 5 } }",
])
def test_docs_inline_forms_validate(validator, schema, text):
    """Forms the docs give in prose: `retry: {}` / `retry: none` etc., in a policy."""
    assert text.split(":")[0] in doc_text()
    errs = errors_of(validator, as_config(yaml.safe_load(text), schema))
    assert not errs, f"{text}: " + "\n".join(errs)


def test_schema_knows_every_documented_key(schema):
    known = schema_property_names(schema)
    doc_keys = set()
    for block in doc_yaml_blocks():
        doc_keys |= yaml_keys(yaml.safe_load(quote_bare_refs(block)))
    # the adapters table names every adapter (the redirect table's forms are added below)
    doc_keys |= set(re.findall(r"^\| `([a-z_0-9]+)` \|", doc_section("Adapters"), re.M))
    doc_keys |= {"redact_query", "follow", "modify", "max", "rewrite", "from", "to"}
    assert {"retry", "backoff", "budget", "validate", "credentials", "oauth2", "refresh_window", "curl"} <= doc_keys
    missing = doc_keys - known
    assert not missing, f"documented keys missing from the schema: {sorted(missing)}"


def test_schema_knows_every_documented_retry_error_kind(schema):
    kinds = set(re.findall(r"^\| `([a-z_]+)` \|", doc_section("Retries"), re.M))
    assert kinds, "the `errors` kind table in Retries"
    retry_object = next(o for o in schema["$defs"]["retry"]["oneOf"] if o.get("type") == "object")
    errors = retry_object["properties"]["errors"]
    assert set(errors["items"]["enum"]) == kinds
    assert set(errors["default"]) == kinds, "every kind is retried by default"


# ------------------------------------------------------------------------------------------
# Schema and implementation agree, file by file
# ------------------------------------------------------------------------------------------

BASE = 'listen: ["127.0.0.1:3128"]\n'

ACCEPTED = {
    "deflate-bare": "policies:\n  h.test:\n    adapters:\n      - deflate\n",
    "deflate-empty": "policies:\n  h.test:\n    adapters:\n      - deflate: {}\n",
    "deflate-int-size": "policies:\n  h.test:\n    adapters:\n      - deflate: { min_bytes: 1024, duplicate_header: replace }\n",
    "deflate-decimal": "policies:\n  h.test:\n    adapters:\n      - deflate: { min_bytes: 10KB, duplicate_header: skip }\n",
    "headers-remove-only": "policies:\n  default:\n    adapters:\n      - headers: { remove: [X-A, X-B] }\n",
    "api-key-query": 'policies:\n  h.test:\n    adapters:\n      - api_key: { query: k, value: "v" }\n',
    "follow-default-max": "policies:\n  h.test:\n    redirect: { follow: {} }\n",
    "modify-no-max": 'policies:\n  "*.h.test":\n    redirect: { modify: { rewrite: [{ from: "http://", to: "https://" }] } }\n',
    "empty-policy": "policies:\n  default: {}\n",
    "routes-https": "routes:\n  - listen: 127.0.0.1:8081\n    upstream: https://127.0.0.1:9443/api\n",
    "monitors-files": "monitors:\n  - access_log: { path: /tmp/sluice-e2e-access.log }\n  - debug: { path: stdout }\n",
    "redact-query": "redact_query: [token, sig]\n",
    "ipv6-listen": 'listen: ["127.0.0.1:3128", "[::1]:3129"]\n',
    "monitors-no-path": "monitors:\n  - access_log: {}\n  - debug: { curl: true }\n",
    "retry-empty": "policies:\n  default:\n    retry: {}\n",
    "retry-none": "policies:\n  default:\n    retry: { limit: 1 }\n  h.test:\n    retry: none\n",
    "retry-off": 'policies:\n  h.test:\n    retry: "off"\n',
    "retry-partial": "policies:\n  h.test:\n    retry: { limit: 0, backoff: { jitter: equal }, deadline: 5s, budget: {} }\n",
    "retry-full": ("policies:\n  h.test:\n    retry:\n      limit: 3\n      backoff: { base: 3, scale: 100ms, max_delay: 2m, jitter: full }\n"
                   "      methods: [GET, POST]\n      statuses: [429, 503]\n      errors: [refused, reset]\n"
                   "      retry_after: false\n      per_try_timeout: 1h\n      deadline: 90s\n"
                   "      budget: { ratio: 1.5, min_per_second: 0 }\n      buffer_limit: 64KB\n"),
    "validate-status-only": 'policies:\n  h.test:\n    validate: { status: ["200-399", 404] }\n',
    "validate-content-type-only": 'policies:\n  h.test:\n    validate: { content_type: ["*/*"] }\n',
    "validate-none": "policies:\n  h.test:\n    validate: none\n",
    "credentials": 'policies:\n  h.test:\n    credentials: { username: u, password: "p" }\n',
    "credentials-none": "policies:\n  h.test:\n    credentials: none\n",
    "oauth2-minimal": "policies:\n  h.test:\n    adapters:\n      - oauth2: { grant: client_credentials, token_url: \"http://127.0.0.1:9/t\", client_id: c }\n",
    "oauth2-refresh": ("policies:\n  h.test:\n    adapters:\n      - oauth2:\n          grant: refresh_token\n"
                       "          token_url: https://127.0.0.1:9/t?x=1\n          client_id: c\n          client_secret: s\n"
                       "          refresh_token: r\n          client_auth: body\n          refresh_before_expiry: 500ms\n"
                       "          refresh_window: { max: 1 }\n          refresh_on: [401, 403]\n"),
    "upgrades-list": "policies:\n  h.test:\n    upgrades: [websocket, h2c]\n",
    "upgrades-none": "policies:\n  h.test:\n    upgrades: []\n",
    "upgrades-map": "policies:\n  default:\n    upgrades: { allow: [websocket], idle_timeout: 90s }\n",
    "upgrades-idle-only": "policies:\n  default:\n    upgrades: { idle_timeout: 10m }\n",
    "upstream-engine-only": "policies:\n  h.test:\n    upstream: { engine: native }\n",
    "upstream-engine-curl-https": "policies:\n  h.test:\n    upstream: { scheme: https, http2: prior_knowledge, engine: curl }\n",
    "upstream-engine-native-http": "policies:\n  h.test:\n    upstream: { scheme: http, port: 8080, http2: \"off\", engine: native }\n",
    "upstream-engine-native-https": "policies:\n  h.test:\n    upstream:\n      scheme: https\n      engine: native\n",
    "rate-limit-one": "policies:\n  h.test:\n    rate_limit: { rate: 100/s }\n",
    "rate-limit-full": ("policies:\n  default:\n    rate_limit:\n      limits: [{ rate: 10/s, burst: 10 }, { rate: 5000/h }]\n"
                        "      on_limit: reject\n      max_wait: 500ms\n      key: header:X-Api-Key\n"),
    "rate-limit-learn-only": "policies:\n  h.test:\n    rate_limit: { learn: true }\n",
    "rate-limit-concurrent": ("policies:\n  h.test:\n    rate_limit: { max_concurrent: 4, learn: false, max_wait: 30s }\n"
                              "limits: { rate_limit_keys: 500 }\n"),
    "rate-limit-none": "policies:\n  default:\n    rate_limit: { rate: 6000/min, key: client }\n  h.test:\n    rate_limit: none\n",
    "rate-limit-scope-local": "policies:\n  h.test:\n    rate_limit: { rate: 5/s, scope: local }\n",
    # fleet (docs/fleet.md): `check` reads the settings only, it does not connect to Redis
    "fleet-tcp": ('fleet: { redis: "127.0.0.1:6379" }\n'
                  "policies:\n  default:\n    rate_limit: { rate: 10/s, scope: fleet }\n"),
    "fleet-ipv6": 'fleet: { redis: "[::1]:6380", timeout: 5s, heartbeat: 100ms }\n',
    "fleet-unix-every-key": ('fleet:\n  redis: "unix:/run/redis/redis-server.sock"\n  database: 15\n  username: sluice\n'
                             '  password: "p"\n  key_prefix: "team-a:"\n  timeout: 1ms\n  on_redis_down: deny\n'
                             "  heartbeat: 1m\n"
                             "policies:\n  default:\n    rate_limit: { rate: 10/s }\n"
                             "  h.test:\n    rate_limit: { rate: 1/s, scope: local }\n"),
    "fleet-allow": 'fleet: { redis: "10.0.0.5:6379", on_redis_down: allow }\n',
    "fleet-cache-static": ("fleet:\n  cache:\n    advertise: 10.0.0.1:3128\n    secret: fleet-secret-0123456789\n"
                           "    weight: 2\n    peers: [{ address: 10.0.0.1:3128, weight: 2 }, { address: \"[fd00::2]:3128\" }]\n"),
    "fleet-cache-redis": ('fleet: { redis: "10.0.0.5:6379", cache: { advertise: "[fd00::1]:3128", '
                          'secret: fleet-secret-0123456789, listen: "[fd00::1]:3128" } }\n'),
}

# name -> (text, line of the error)
REJECTED = {
    "upgrades-word": ("policies:\n  h.test:\n    upgrades: websocket\n", 3),
    "upgrades-bad-name": ('policies:\n  h.test:\n    upgrades: ["web socket"]\n', 3),
    "upgrades-unknown": ("policies:\n  h.test:\n    upgrades: { allowed: [websocket] }\n", 3),
    "upgrades-zero-idle": ("policies:\n  h.test:\n    upgrades: { idle_timeout: 0s }\n", 3),
    "upstream-engine-bad": ("policies:\n  h.test:\n    upstream: { engine: libcurl }\n", 3),
    "rate-limit-bad-rate": ("policies:\n  h.test:\n    rate_limit: { rate: 10/day }\n", 3),
    "rate-limit-no-rate": ("policies:\n  h.test:\n    rate_limit: { burst: 5 }\n", 3),
    "rate-limit-both": ("policies:\n  h.test:\n    rate_limit: { rate: 1/s, limits: [{ rate: 2/s }] }\n", 3),
    "rate-limit-bad-key": ("policies:\n  h.test:\n    rate_limit: { rate: 1/s, key: cookie }\n", 3),
    "rate-limit-learns-nothing": ("policies:\n  h.test:\n    rate_limit: { learn: false }\n", 3),
    "rate-limit-concurrent-zero": ("policies:\n  h.test:\n    rate_limit: { max_concurrent: 0 }\n", 3),
    "rate-limit-word": ("policies:\n  h.test:\n    rate_limit: fast\n", 3),
    "rate-limit-bad-scope": ("policies:\n  h.test:\n    rate_limit: { rate: 1/s, scope: global }\n", 3),
    "fleet-host-name": ('fleet: { redis: "redis.internal:6379" }\n', 1),
    "fleet-no-port": ('fleet: { redis: "127.0.0.1" }\n', 1),
    "fleet-relative-unix": ('fleet: { redis: "unix:run/redis.sock" }\n', 1),
    "fleet-no-redis": ("fleet: { database: 1 }\n", 1),
    "fleet-bad-on-redis-down": ('fleet:\n  redis: "127.0.0.1:6379"\n  on_redis_down: fail_open\n', 3),
    "fleet-zero-timeout": ('fleet:\n  redis: "127.0.0.1:6379"\n  timeout: 0ms\n', 3),
    "fleet-long-timeout": ('fleet:\n  redis: "127.0.0.1:6379"\n  timeout: 6s\n', 3),
    "fleet-short-heartbeat": ('fleet:\n  redis: "127.0.0.1:6379"\n  heartbeat: 50ms\n', 3),
    "fleet-database-16": ('fleet:\n  redis: "127.0.0.1:6379"\n  database: 16\n', 3),
    "fleet-prefix-brace": ('fleet:\n  redis: "127.0.0.1:6379"\n  key_prefix: "a{b}"\n', 3),
    "fleet-unknown-key": ('fleet:\n  redis: "127.0.0.1:6379"\n  tls: true\n', 3),
    "fleet-cache-no-peers": ("fleet:\n  cache:\n    advertise: 10.0.0.1:3128\n    secret: fleet-secret-0123456789\n", 3),
    "fleet-cache-host-name": ("fleet:\n  cache:\n    advertise: peer.internal:3128\n    secret: fleet-secret-0123456789\n"
                              "    peers: [{ address: 10.0.0.1:3128 }]\n", 3),
    "fleet-cache-zero-weight": ("fleet:\n  cache:\n    advertise: 10.0.0.1:3128\n    secret: fleet-secret-0123456789\n"
                                "    weight: 0\n    peers: [{ address: 10.0.0.1:3128 }]\n", 5),
    "upstream-engine-native-h2c": ("policies:\n  h.test:\n    upstream: { http2: prior_knowledge, engine: native }\n", 3),
    "policy-unknown-key": ("policies:\n  h.test:\n    adaptors: []\n", 3),
    "unknown-adapter": ("policies:\n  h.test:\n    adapters:\n      - bearr: x\n", 4),
    "adapter-two-keys": ("policies:\n  h.test:\n    adapters:\n      - { bearer: x, deflate: {} }\n", 4),
    "adapters-not-list": ("policies:\n  h.test:\n    adapters: { bearer: x }\n", 3),
    "headers-unknown-op": ("policies:\n  h.test:\n    adapters:\n      - headers: { append: { X-A: b } }\n", 4),
    "basic-no-password": ("policies:\n  h.test:\n    adapters:\n      - basic: { username: u }\n", 4),
    "api-key-no-value": ("policies:\n  h.test:\n    adapters:\n      - api_key: { header: X-K }\n", 4),
    "api-key-both": ('policies:\n  h.test:\n    adapters:\n      - api_key: { header: X-K, query: k, value: "v" }\n', 4),
    "api-key-unknown": ('policies:\n  h.test:\n    adapters:\n      - api_key: { cookie: k, value: "v" }\n', 4),
    "deflate-bad-dup": ("policies:\n  h.test:\n    adapters:\n      - deflate: { duplicate_header: merge }\n", 4),
    "deflate-bad-size": ("policies:\n  h.test:\n    adapters:\n      - deflate: { min_bytes: 12XB }\n", 4),
    "deflate-unknown": ("policies:\n  h.test:\n    adapters:\n      - deflate: { level: 9 }\n", 4),
    "redirect-bad-word": ("policies:\n  h.test:\n    redirect: sometimes\n", 3),
    "redirect-two-forms": ('policies:\n  h.test:\n    redirect: { follow: {}, modify: { rewrite: [{ from: a, to: b }] } }\n', 3),
    "follow-unknown": ("policies:\n  h.test:\n    redirect: { follow: { maximum: 5 } }\n", 3),
    "follow-max-text": ("policies:\n  h.test:\n    redirect: { follow: { max: many } }\n", 3),
    "rewrite-no-to": ('policies:\n  h.test:\n    redirect: { modify: { rewrite: [{ from: "http://" }] } }\n', 3),
    "monitor-unknown": ("monitors:\n  - acces_log: { path: stdout }\n", 2),
    "monitor-unknown-option": ("monitors:\n  - debug: { path: stderr, format: json }\n", 2),
    "route-ftp": ("routes:\n  - listen: 127.0.0.1:8081\n    upstream: ftp://127.0.0.1/x\n", 3),
    "route-no-upstream": ("routes:\n  - listen: 127.0.0.1:8081\n", 2),
    "route-unknown-key": ("routes:\n  - listen: 127.0.0.1:8081\n    upstream: http://127.0.0.1:9000\n    timeout: 5s\n", 4),
    "route-bad-listen": ("routes:\n  - listen: localhost:8081\n    upstream: http://127.0.0.1:9000\n", 2),
    "redact-query-map": ("redact_query: { token: true }\n", 1),
    "debug-curl-false": ("monitors:\n  - debug: { curl: false }\n", 2),
    "access-log-curl": ("monitors:\n  - access_log: { curl: true }\n", 2),
    "retry-bad-word": ("policies:\n  h.test:\n    retry: sometimes\n", 3),
    "retry-unknown-key": ("policies:\n  h.test:\n    retry: { limits: 3 }\n", 3),
    "retry-limit-negative": ("policies:\n  h.test:\n    retry: { limit: -1 }\n", 3),
    "retry-bad-jitter": ("policies:\n  h.test:\n    retry:\n      backoff: { jitter: random }\n", 4),
    "retry-backoff-unknown": ("policies:\n  h.test:\n    retry:\n      backoff: { factor: 2 }\n", 4),
    "retry-scale-no-unit": ("policies:\n  h.test:\n    retry:\n      backoff: { scale: 500 }\n", 4),
    "retry-bad-error-kind": ("policies:\n  h.test:\n    retry: { errors: [refused, certificate] }\n", 3),
    "retry-lowercase-method": ("policies:\n  h.test:\n    retry: { methods: [get] }\n", 3),
    "retry-bad-status": ("policies:\n  h.test:\n    retry: { statuses: [700] }\n", 3),
    "retry-after-word": ("policies:\n  h.test:\n    retry: { retry_after: sometimes }\n", 3),
    "retry-bad-deadline": ("policies:\n  h.test:\n    retry: { deadline: forever }\n", 3),
    "retry-budget-unknown": ("policies:\n  h.test:\n    retry:\n      budget: { per_second: 3 }\n", 4),
    "retry-bad-buffer-limit": ("policies:\n  h.test:\n    retry: { buffer_limit: lots }\n", 3),
    "validate-bad-status": ('policies:\n  h.test:\n    validate: { status: ["2xx"] }\n', 3),
    "validate-unknown": ("policies:\n  h.test:\n    validate: { statuses: [200] }\n", 3),
    "validate-word": ("policies:\n  h.test:\n    validate: strict\n", 3),
    "credentials-no-password": ("policies:\n  h.test:\n    credentials: { username: u }\n", 3),
    "credentials-unknown": ('policies:\n  h.test:\n    credentials: { user: u, password: "p" }\n', 3),
    "oauth2-no-token-url": ("policies:\n  h.test:\n    adapters:\n      - oauth2: { grant: client_credentials, client_id: c }\n", 4),
    "oauth2-refresh-no-token": ("policies:\n  h.test:\n    adapters:\n      - oauth2: { grant: refresh_token, token_url: \"https://a.test/t\", client_id: c }\n", 4),
    "oauth2-bad-grant": ("policies:\n  h.test:\n    adapters:\n      - oauth2: { grant: password, token_url: \"https://a.test/t\", client_id: c }\n", 4),
    "oauth2-ftp-url": ("policies:\n  h.test:\n    adapters:\n      - oauth2: { grant: client_credentials, token_url: \"ftp://a.test/t\", client_id: c }\n", 4),
    "oauth2-bad-client-auth": ("policies:\n  h.test:\n    adapters:\n      - oauth2:\n          grant: client_credentials\n          token_url: https://a.test/t\n          client_id: c\n          client_auth: header\n", 8),
    "oauth2-unknown": ("policies:\n  h.test:\n    adapters:\n      - oauth2:\n          grant: client_credentials\n          token_url: https://a.test/t\n          client_id: c\n          scopes: read\n", 8),
    "oauth2-window-unknown": ("policies:\n  h.test:\n    adapters:\n      - oauth2:\n          grant: client_credentials\n          token_url: https://a.test/t\n          client_id: c\n          refresh_window: { max: 5, every: 30s }\n", 8),
    "oauth2-refresh-on-2xx": ("policies:\n  h.test:\n    adapters:\n      - oauth2:\n          grant: client_credentials\n          token_url: https://a.test/t\n          client_id: c\n          refresh_on: [200]\n", 8),
}


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_accepted_by_schema_and_check(validator, tmp_path, sluice_bin, name):
    text = ACCEPTED[name] if ACCEPTED[name].startswith("listen") else BASE + ACCEPTED[name]
    errs = errors_of(validator, yaml.safe_load(text))
    assert not errs, f"schema rejects {name}:\n{text}\n" + "\n".join(errs)
    p = tmp_path / f"{name}.yaml"
    p.write_text(text)
    r = run_check(p)
    assert r.returncode == 0, f"sluice check rejects {name}:\n{text}\n{r.stderr}"


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_rejected_by_schema_and_check(validator, tmp_path, sluice_bin, name):
    snippet, line = REJECTED[name]
    text = BASE + snippet
    assert errors_of(validator, yaml.safe_load(text)), f"schema accepts {name}:\n{text}"
    p = tmp_path / f"{name}.yaml"
    p.write_text(text)
    r = run_check(p)
    assert r.returncode == 1, f"sluice check accepts {name} (exit {r.returncode}):\n{text}\n{r.stdout}"
    m = re.search(re.escape(str(p)) + r":(\d+):(\d+): error: ", r.stderr)
    assert m, f"no FILE:LINE:COL error for {name}:\n{r.stderr}"
    lines = [int(x) for x in re.findall(re.escape(str(p)) + r":(\d+):\d+: error: ", r.stderr)]
    assert line + 1 in lines, f"{name}: expected an error on line {line + 1}, got lines {lines}:\n{r.stderr}"
