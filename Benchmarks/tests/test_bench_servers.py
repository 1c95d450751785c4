"""The ports of the targets and the Sluice configurations the harness writes."""

from pathlib import Path

import pytest

from bench import servers
from bench.servers import (CACHE, FLEET_TARGETS, PORT_OFFSETS, RATE_LIMIT, RELOADED_HEADER, SLUICE_TARGETS, STARTERS,
                           Lab, sluice_yaml)


@pytest.fixture
def lab(tmp_path):
    return Lab(tmp=tmp_path, base_port=31080, sluice_bin=Path("/nonexistent/sluice"), nofile=4096, is_root=False)


def test_every_target_has_a_port_of_its_own():
    assert len(set(PORT_OFFSETS.values())) == len(PORT_OFFSETS)
    assert set(STARTERS) | {"direct", "callgrind", "admin", "redis", "fleet-a", "fleet-b", "fleet-c"} == set(PORT_OFFSETS)


def test_sluice_targets():
    assert {"sluice", "sluice-pipeline", "sluice-curl", "sluice-metrics", "sluice-ratelimit", "sluice-fleet",
            "sluice-cache", "sluice-disk", "sluice-h2", "sluice-http1", "sluice-http1-curl", "sluice-sigv4",
            "sluice-reload", "sluice-lua"} == SLUICE_TARGETS
    assert servers.LUA_TARGETS == {"sluice-lua"}
    assert FLEET_TARGETS == {"sluice-fleet", "sluice-reload"}


@pytest.mark.parametrize("name", sorted(SLUICE_TARGETS))
def test_every_sluice_configuration_is_yaml(lab, tmp_path, name):
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load(sluice_yaml(lab, name, lab.port(name), "auto", tmp_path / name))
    assert config["listen"] == [f"127.0.0.1:{31080 + PORT_OFFSETS[name]}"]
    assert config["access"] == {"allow_clients": ["127.0.0.0/8"]}


def test_the_disk_target_keeps_its_store_in_its_own_directory(lab, tmp_path):
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load(sluice_yaml(lab, "sluice-disk", 1, "2", tmp_path / "d"))
    # 256 KiB of memory: bodies over 32 KiB (the 64 KiB object) are on disk only.
    assert config["cache_store"] == {"memory": "256KiB", "disk": {"path": f"{tmp_path}/d/cache", "size": "256MiB"}}


def test_ratelimit_is_the_pipeline_plus_a_limit_in_its_default_policy(lab, tmp_path):
    d = tmp_path / "d"
    pipeline = sluice_yaml(lab, "sluice-pipeline", 1, "auto", d)
    limited = sluice_yaml(lab, "sluice-ratelimit", 1, "auto", d)
    assert limited.count(RATE_LIMIT) == 1 and "  default:\n" + RATE_LIMIT in limited
    assert limited.replace(RATE_LIMIT, "").replace("(sluice-ratelimit)", "(sluice-pipeline)") == pipeline
    yaml = pytest.importorskip("yaml")
    a, b = yaml.safe_load(pipeline), yaml.safe_load(limited)
    limit = b["policies"]["default"].pop("rate_limit")
    assert limit == {"rate": "1000000/s", "burst": 100000}   # the most a rate may be: 1000000/s
    assert a == b


def test_fleet_is_the_ratelimit_plus_a_fleet_section(lab, tmp_path):
    d = tmp_path / "d"
    limited = sluice_yaml(lab, "sluice-ratelimit", 1, "auto", d)
    fleet = sluice_yaml(lab, "sluice-fleet", 1, "auto", d)
    section = 'fleet: { redis: "127.0.0.1:31099" }\n'      # base_port + the "redis" offset
    assert servers.fleet_section(lab, "sluice-fleet") == section and fleet.count(section) == 1
    assert fleet.replace(section, "").replace("(sluice-fleet)", "(sluice-ratelimit)") == limited
    yaml = pytest.importorskip("yaml")
    a, b = yaml.safe_load(limited), yaml.safe_load(fleet)
    assert b.pop("fleet") == {"redis": "127.0.0.1:31099"}
    assert a == b


def test_a_baseline_twin_runs_the_same_configuration_on_its_own_ports(tmp_path):
    lab = Lab(tmp=tmp_path, base_port=31080, sluice_bin=Path("/new"), baseline_bin=Path("/old"), nofile=4096,
              is_root=False)
    assert servers.kind("sluice-fleet@base") == "sluice-fleet" and servers.kind("sluice-fleet") == "sluice-fleet"
    assert lab.binary("sluice-fleet") == Path("/new") and lab.binary("sluice-fleet@base") == Path("/old")
    shift = servers.BASELINE_SHIFT
    assert lab.port("sluice-fleet@base") == lab.port("sluice-fleet") + shift
    # Every port of a run with twins stays below the kernel's ephemeral ports.
    assert 31080 + max(PORT_OFFSETS.values()) + shift < 32768
    d, twin = tmp_path / "a", tmp_path / "b"
    one = sluice_yaml(lab, "sluice-fleet", lab.port("sluice-fleet"), "auto", d)
    other = sluice_yaml(lab, "sluice-fleet@base", lab.port("sluice-fleet@base"), "auto", d)
    # The same configuration but for its listener and its own redis-server.
    assert f'redis: "127.0.0.1:{31099 + shift}"' in other and 'redis: "127.0.0.1:31099"' in one
    assert other.replace(str(31080 + PORT_OFFSETS["sluice-fleet"] + shift), str(31080 + PORT_OFFSETS["sluice-fleet"])) \
        .replace(str(31099 + shift), "31099").replace("(sluice-fleet@base)", "(sluice-fleet)") == one
    metrics = sluice_yaml(lab, "sluice-metrics@base", 1, "auto", twin)
    assert f"admin: {{ listen: 127.0.0.1:{31090 + shift} }}" in metrics
    with pytest.raises(ValueError):
        Lab(tmp=tmp_path, base_port=31080, sluice_bin=Path("/new"), nofile=4096, is_root=False).binary("sluice@base")


def test_with_baseline_twins_only_sluice_targets():
    from bench import runner
    assert runner.with_baseline(["direct", "sluice-pipeline", "haproxy", "sluice-cache"]) == [
        "direct", "sluice-pipeline", "sluice-pipeline@base", "haproxy", "sluice-cache", "sluice-cache@base"]


def test_reload_is_the_fleet_plus_the_memory_cache(lab, tmp_path):
    d = tmp_path / "d"
    fleet = sluice_yaml(lab, "sluice-fleet", 1, "auto", d)
    reload = sluice_yaml(lab, "sluice-reload", 1, "auto", d)
    assert reload.count(CACHE) == 1 and reload.count(RELOADED_HEADER) == 1
    assert reload.replace(CACHE, "").replace("(sluice-reload)", "(sluice-fleet)") == fleet
    yaml = pytest.importorskip("yaml")
    changed = yaml.safe_load(reload.replace(RELOADED_HEADER, RELOADED_HEADER + "-7"))
    assert changed["policies"]["default"]["adapters"][0]["headers"]["set"] == {"X-Forwarded-By": "sluice-7"}
    assert changed["cache_store"] == {"memory": "64MiB"}


def test_a_fleet_configuration_keeps_what_every_sluice_gets_appended(tmp_path):
    lab = Lab(tmp=tmp_path, base_port=31080, sluice_bin=Path("/x"), nofile=4096, is_root=False,
              sluice_yaml="timeouts: { client_idle: 30m }\n")
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load(sluice_yaml(lab, "sluice-fleet", 1, "auto", tmp_path))
    assert config["fleet"] == {"redis": "127.0.0.1:31099"} and config["timeouts"] == {"client_idle": "30m"}


def test_sluice_without_a_binary_is_unavailable(lab):
    with pytest.raises(servers.Unavailable):
        servers.start_sluice(lab, "sluice-ratelimit")
    with pytest.raises(servers.Unavailable):
        servers.start_sluice(lab, "sluice-fleet")
    assert lab.procs == [] and lab.redis == {}          # no Redis is started for a missing binary


def test_fleet_without_redis_is_unavailable(lab, tmp_path, monkeypatch):
    binary = tmp_path / "sluice"
    binary.write_text("")
    lab.sluice_bin = binary
    monkeypatch.setattr(servers.shutil, "which", lambda name: None)
    with pytest.raises(servers.Unavailable, match="redis-server is not installed"):
        servers.start_sluice(lab, "sluice-fleet")
    assert lab.procs == []


def test_haproxy_pipeline_does_the_work_of_sluice_pipeline(lab, tmp_path):
    """The same three header edits as PIPELINE's adapters and a JSON log line per request; the
    configuration is one haproxy accepts (`haproxy -c`, when haproxy is installed)."""
    pipeline = servers.PIPELINE.format(d=tmp_path)
    cfg = servers.haproxy_cfg(lab, "haproxy-pipeline")
    assert "X-Forwarded-By: sluice" in pipeline and "http-request set-header X-Forwarded-By sluice" in cfg
    assert "remove: [X-Debug]" in pipeline and "http-request del-header X-Debug" in cfg
    assert "bearer: bench-token-0123456789" in pipeline
    assert 'http-request set-header Authorization "Bearer bench-token-0123456789"' in cfg
    assert "value: bench-key-0123456789" in pipeline and "set-header X-Api-Key bench-key-0123456789" in cfg
    assert "log stdout" in cfg and "log-format '{" in cfg
    assert "http-request" not in servers.haproxy_cfg(lab, "haproxy").split("set-dst-port url_port")[1]
    import shutil
    import subprocess
    if shutil.which("haproxy"):
        (tmp_path / "h.cfg").write_text(cfg)
        check = subprocess.run(["haproxy", "-c", "-f", str(tmp_path / "h.cfg")], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
