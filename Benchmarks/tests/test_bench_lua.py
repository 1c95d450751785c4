"""The `lua` scenario's targets: each configuration is what it says (the pipeline's work plus one
Lua edit), the peers accept theirs (`haproxy -c`, `nginx -t`, where installed), and every Lua
target really sets X-Seen from X-Client on its way to an origin that echoes what it got."""

import json
import os
import shutil
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from bench import runner, servers
from bench.servers import Lab, sluice_yaml


@pytest.fixture
def lab(tmp_path):
    return Lab(tmp=tmp_path, base_port=31080, sluice_bin=Path("/nonexistent/sluice"), nofile=4096, is_root=False)


def test_the_scenario():
    scenario = runner.load_scenario("lua", [])
    assert scenario["targets"] == ["direct", "sluice-pipeline", "sluice-lua", "haproxy-pipeline", "haproxy-lua",
                                   "nginx-pipeline", "nginx-lua"]
    assert scenario["references"] == ["direct", "sluice-pipeline", "haproxy-lua", "nginx-lua"]
    assert scenario["measures"] == ["throughput", "callgrind"]
    assert scenario["loads"] == [{"body": "1k", "connections": [64]}]
    assert scenario["headers"] == {"X-Client": "bench"}
    assert scenario["callgrind"] == {"n1": 200, "n2": 2200, "targets": ["sluice-pipeline", "sluice-lua",
                                                                        "nginx-pipeline", "nginx-lua"]}
    # Every other scenario sends no extra header.
    assert runner.load_scenario("headline", [])["headers"] == {}


def test_sluice_lua_is_the_pipeline_plus_a_lua_stage(lab, tmp_path):
    yaml = pytest.importorskip("yaml")
    d = tmp_path / "d"
    pipeline = yaml.safe_load(sluice_yaml(lab, "sluice-pipeline", 1, "auto", d))
    lua = yaml.safe_load(sluice_yaml(lab, "sluice-lua", 1, "auto", d))
    stage = lua["policies"]["default"]["adapters"].pop()
    assert stage == {"lua": {"file": f"{tmp_path}/sluice-lua/edit.lua", "on_error": "fail_closed"}}
    assert lua == pipeline
    assert servers.LUA_EDIT == ('return { on_request = function(req, ctx) '
                                'req.headers:set("X-Seen", req.headers:get("X-Client") or "none") end }\n')


def test_haproxy_lua_is_haproxy_pipeline_plus_the_edit(lab, tmp_path):
    cfg = servers.haproxy_cfg(lab, "haproxy-lua")
    script = servers.lua_script(lab, "haproxy-lua")
    assert f"    lua-load-per-thread {script}\n" in cfg
    # The edit runs after the pipeline's header edits, on the same frontend.
    assert cfg.index("http-request lua.edit") > cfg.index("http-request set-header X-Api-Key")
    plain = servers.haproxy_cfg(lab, "haproxy-pipeline")
    stripped = (cfg.replace(f"    lua-load-per-thread {script}\n", "").replace("    http-request lua.edit\n", "")
                .replace(", and the Lua edit", ""))
    assert stripped == plain.replace(f":{lab.port('haproxy-pipeline')} ", f":{lab.port('haproxy-lua')} ")
    assert 'core.register_action("edit", { "http-req" }' in servers.HAPROXY_LUA_EDIT
    if shutil.which("haproxy"):
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(servers.HAPROXY_LUA_EDIT)
        (tmp_path / "h.cfg").write_text(cfg)
        check = subprocess.run(["haproxy", "-c", "-f", str(tmp_path / "h.cfg")], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr


def test_nginx_pipeline_does_the_work_of_sluice_pipeline(lab, tmp_path):
    pipeline = servers.PIPELINE.format(d=tmp_path)
    body = servers.nginx_proxy_body(lab, "nginx-pipeline")
    assert "X-Forwarded-By: sluice" in pipeline and "proxy_set_header X-Forwarded-By sluice;" in body
    assert "remove: [X-Debug]" in pipeline and 'proxy_set_header X-Debug "";' in body
    assert 'proxy_set_header Authorization "Bearer bench-token-0123456789";' in body
    assert "proxy_set_header X-Api-Key bench-key-0123456789;" in body
    assert f"access_log {tmp_path}/nginx-pipeline/access.log bench buffer=64k flush=1s;" in body
    assert "log_format bench escape=json" in body
    # The plain nginx target stays its best case: no log, no edits.
    plain = servers.nginx_proxy_body(lab, "nginx")
    assert "access_log" not in plain and "X-Forwarded-By" not in plain and "lua" not in plain


def test_nginx_lua_is_nginx_pipeline_plus_the_edit(lab, tmp_path):
    body = servers.nginx_proxy_body(lab, "nginx-lua")
    plain = servers.nginx_proxy_body(lab, "nginx-pipeline")
    assert body.replace(servers.NGINX_LUA_EDIT, "").replace("nginx-lua", "nginx-pipeline") == \
        plain.replace(str(lab.port("nginx-pipeline")), str(lab.port("nginx-lua")))
    assert 'ngx.req.get_headers()["x-client"]' in body and 'ngx.req.set_header("X-Seen", v or "none")' in body
    assert servers.nginx_lua_main() == ("load_module /usr/share/nginx/modules/ndk_http_module.so;\n"
                                        "load_module /usr/share/nginx/modules/ngx_http_lua_module.so;\n")


@pytest.mark.parametrize("name", ["nginx", "nginx-cache", "nginx-pipeline", "nginx-lua"])
def test_nginx_accepts_the_configuration(lab, tmp_path, name):
    if shutil.which("nginx") is None:
        pytest.skip("nginx is not installed")
    main = ""
    if name == "nginx-lua":
        if not all(Path(m).exists() for m in servers.NGINX_LUA_MODULES):
            pytest.skip("libnginx-mod-http-lua is not installed")
        main = servers.nginx_lua_main()
    d = lab.dir(name)
    (d / "nginx.conf").write_text(servers._nginx_conf(lab, d, "auto", servers.nginx_proxy_body(lab, name), main))
    check = subprocess.run(["nginx", "-t", "-e", f"{d}/error.log", "-p", str(d), "-c", f"{d}/nginx.conf"],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize("name", ["nginx-pipeline", "nginx-lua"])
def test_nginx_under_callgrind_is_the_target_in_one_process(lab, tmp_path, name):
    """The callgrind measure's nginx: the target's own configuration, but one process without a
    master (valgrind follows the process that serves), on the callgrind port, its files (the
    access log) in a directory of its own; nginx accepts it where installed."""
    port = lab.port("callgrind")
    conf = servers.nginx_callgrind_conf(lab, name, port)
    d = tmp_path / f"callgrind-{name}"
    assert "master_process off;" in conf and "master_process on;" not in conf
    assert "worker_processes 1;" in conf
    assert f"listen 127.0.0.1:{port} backlog=4096;" in conf and f":{lab.port(name)} " not in conf
    assert f"access_log {d}/access.log bench" in conf and f"{tmp_path}/{name}/" not in conf
    # Otherwise the target's configuration, line for line.
    target = servers._nginx_conf(lab, lab.dir(name), "1", servers.nginx_proxy_body(lab, name),
                                 servers.nginx_lua_main() if name == "nginx-lua" else "")
    assert conf == (target.replace("master_process on;", "master_process off;")
                    .replace(f":{lab.port(name)} ", f":{port} ").replace(str(lab.dir(name)), str(d)))
    assert ("ngx.req.set_header" in conf) == (name == "nginx-lua")
    if shutil.which("nginx") is None:
        pytest.skip("nginx is not installed")
    if name == "nginx-lua" and not all(Path(m).exists() for m in servers.NGINX_LUA_MODULES):
        pytest.skip("libnginx-mod-http-lua is not installed")
    (d / "nginx.conf").write_text(conf)
    check = subprocess.run(["nginx", "-t", "-e", f"{d}/error.log", "-p", str(d), "-c", f"{d}/nginx.conf"],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


# ---------------------------------------------------------------------------------------------
# The edit, end to end

class Echo(BaseHTTPRequestHandler):
    """An origin that answers every GET with the request's header fields as a JSON object."""

    protocol_version = "HTTP/1.1"

    def do_GET(self):
        body = json.dumps([[k, v] for k, v in self.headers.items()]).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _free_base(names: list[str]) -> int:
    """A base port (between the e2e suite's ports and the default base) whose origin and targets
    are all free."""
    for base in range(30100, 30900, 40):
        if not any(servers.port_open(base + servers.PORT_OFFSETS[n]) for n in ["direct", *names]):
            return base
    pytest.skip("no free base port")


def _sluice_bin() -> Path | None:
    path = os.environ.get("SLUICE_BIN")
    return Path(path).resolve() if path and Path(path).is_file() else None


@pytest.mark.parametrize("name", ["haproxy-lua", "nginx-lua", "sluice-lua"])
def test_the_lua_edit_reaches_the_origin(tmp_path, name):
    """Through the target, a request with `X-Client: bench` reaches the origin with `X-Seen: bench`
    and the pipeline's edits; one without X-Client with `X-Seen: none`. sluice-lua needs
    SLUICE_BIN and a binary with the `lua` kind."""
    base = _free_base([name])
    sluice = _sluice_bin()
    if name == "sluice-lua" and sluice is None:
        pytest.skip("SLUICE_BIN is not set")
    lab = Lab(tmp=tmp_path, base_port=base, sluice_bin=sluice or Path("/nonexistent/sluice"),
              nofile=4096, is_root=os.geteuid() == 0)
    (tmp_path / "logs").mkdir()
    origin = ThreadingHTTPServer(("127.0.0.1", lab.origin_port), Echo)
    threading.Thread(target=origin.serve_forever, daemon=True).start()
    try:
        try:
            servers.STARTERS[name](lab, name)
        except servers.Unavailable as e:
            pytest.skip(f"{name}: {e}")
        seen = _through(lab, name, {"X-Client": "bench", "X-Debug": "1"})
        assert seen.get("x-seen") == ["bench"], seen
        assert seen.get("x-forwarded-by") == ["sluice"] and "x-debug" not in seen
        assert seen.get("authorization") == ["Bearer bench-token-0123456789"]
        assert seen.get("x-api-key") == ["bench-key-0123456789"]
        assert _through(lab, name, {}).get("x-seen") == ["none"]
        log = tmp_path / name / "access.log"
        deadline = time.monotonic() + 5       # nginx flushes its buffered log every second
        while time.monotonic() < deadline and log.read_text().count('"status":200') < 2:
            time.sleep(0.2)
        assert log.read_text().count('"status":200') >= 2, log.read_text()
    finally:
        lab.stop_all()
        origin.shutdown()
        origin.server_close()


def _through(lab: Lab, target: str, headers: dict[str, str]) -> dict[str, list[str]]:
    """The header fields the origin got for one GET through the target (names in lower case)."""
    args = [a for k, v in headers.items() for a in ("-H", f"{k}: {v}")]
    done = subprocess.run(["curl", "-s", "--max-time", "5", "-x", f"http://127.0.0.1:{lab.port(target)}", *args,
                           f"http://{lab.origin_host}/echo"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    fields: dict[str, list[str]] = {}
    for k, v in json.loads(done.stdout):
        fields.setdefault(k.lower(), []).append(v)
    return fields
