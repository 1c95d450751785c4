"""BENCHMARKS.md's tables and the chart, generated from one result file. The tables replace the
block between `<!-- bench:begin NAME -->` and `<!-- bench:end NAME -->` (NAME: the scenario), so
the prose around them stays as written; the chart is a PNG beside the result file."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from . import stats

BODY_NAMES = {"1k": "1 KiB", "64k": "64 KiB", "put64k": "64 KiB PUT"}


def load(path: Path) -> dict:
    return json.loads(Path(path).read_text())


# ---------------------------------------------------------------------------------------------
# Looking figures up

def cells(result: dict) -> dict[tuple[str, str, int], dict]:
    """(target, body, connections) -> the median round of that cell."""
    return {(c["target"], c["body"], c["connections"]): c["median"]
            for c in result.get("throughput", []) if c["median"]}


def loads(result: dict) -> list[tuple[str, int]]:
    """(body, connections) of every throughput cell, in the scenario's order."""
    return [(load["body"], c) for load in result["scenario"]["loads"] for c in load["connections"]]


def references(result: dict) -> list[str]:
    """The targets ratios are taken to ("ratio to direct", "ratio to haproxy"), those of the
    scenario's `references` that were measured."""
    ok = measured_targets(result)
    return [t for t in result["scenario"].get("references", ["direct", "haproxy"]) if t in ok]


def measured_targets(result: dict) -> list[str]:
    return [t for t in result["scenario"]["targets"] if result.get("targets", {}).get(t, {}).get("status") == "ok"]


def throughput_ratio(result: dict, target: str, reference: str, body: str, connections: int) -> float | None:
    """Median req/s of a target over the reference's, in the same cell of the same run."""
    table = cells(result)
    a, b = table.get((target, body, connections)), table.get((reference, body, connections))
    return stats.ratio(a and a["rps"], b and b["rps"])


def has_redis(result: dict) -> bool:
    """Whether a target of the run had a redis-server of its own (a fleet target)."""
    return any("redis_round_trips" in m for m in cells(result).values())


def redis_summary(result: dict, target: str, body: str, connections: int) -> dict | None:
    """A fleet target's Redis figures in one cell (its median round): round trips (EVALSHA + EVAL)
    per request, Redis's CPU per request, and Sluice + Redis, with the difference to the first
    reference's CPU per request (Sluice alone, or with its own Redis). None without Redis."""
    m = cells(result).get((target, body, connections))
    if not m or "redis_round_trips" not in m:
        return None
    total = None if m.get("cpu_us") is None else m["cpu_us"] + (m.get("redis_cpu_us") or 0)
    out = {"round_trips": m["redis_round_trips"], "redis_cpu_us": m.get("redis_cpu_us"), "cpu_us": m.get("cpu_us"),
           "total_cpu_us": total, "calls": m.get("redis_calls"), "reference": None, "added_cpu_us": None}
    refs = references(result)
    ref = cells(result).get((refs[0], body, connections)) if refs and refs[0] != target else None
    if ref and ref.get("cpu_us") is not None and total is not None:
        ref_total = ref["cpu_us"] + (ref.get("redis_cpu_us") or 0)
        out.update(reference=refs[0], reference_cpu_us=ref_total, added_cpu_us=total - ref_total,
                   added_pct=(total - ref_total) / ref_total * 100 if ref_total else None)
    return out


def f_trips(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def redis_notes(result: dict) -> list[str]:
    """One sentence per fleet target at the summary's CPU cell: Redis round trips per request and
    the CPU the fleet adds (Sluice + its Redis against the first reference)."""
    body, c = cpu_cell(result)
    notes = []
    for t in measured_targets(result):
        r = redis_summary(result, t, body, c)
        if r is None:
            continue
        text = (f"{t} ({cell_name(body, c)}): Redis round trips per request: {f_trips(r['round_trips'])} "
                f"(EVALSHA + EVAL calls / requests of the median run")
        calls = r["calls"] or {}
        if calls.get("eval"):
            text += f"; {calls['evalsha']:,} EVALSHA, {calls['eval']:,} EVAL"
        if calls.get("failed"):
            text += f"; {calls['failed']:,} failed calls"
        text += (f"); CPU per request {f_cpu(r['cpu_us'])} Sluice + {f_cpu(r['redis_cpu_us'])} Redis = "
                 f"{f_cpu(r['total_cpu_us'])}")
        if r["added_cpu_us"] is not None:
            pct = f" ({r['added_pct']:+.0f} %)" if r.get("added_pct") is not None else ""
            text += f", {r['added_cpu_us']:+.1f} µs{pct} over {r['reference']}'s {f_cpu(r['reference_cpu_us'])}"
        notes.append(text + ".")
    return notes


# ---------------------------------------------------------------------------------------------
# Formatting

def f_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def f_us(value: float | None) -> str:
    """Microseconds as "123 µs" or "1.23 ms"."""
    if value is None:
        return "n/a"
    if value < 1000:
        return f"{value:.0f} µs"
    return f"{value / 1000:.2f} ms" if value < 100000 else f"{value / 1000:.0f} ms"


def f_cpu(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f} µs"


def f_mib(kib: float | None, sign: bool = False) -> str:
    if kib is None:
        return "n/a"
    return f"{kib / 1024:+.1f} MiB" if sign else f"{kib / 1024:.1f} MiB"


def f_int(value: int | None) -> str:
    return "n/a" if value is None else f"{value:,}"


def f_errors(errors: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in errors.items()) or "0"


def f_sha(value: str | None) -> str:
    if value is None:
        return "n/a"
    return "ok" if value == "ok" else ("**MISMATCH**" if value.startswith("MISMATCH") else "n/a")


def cell_name(body: str, connections: int) -> str:
    return f"{BODY_NAMES.get(body, body)} c{connections}"


def table(header: list[str], rows: list[list[str]], align: list[str] | None = None) -> str:
    """A markdown table; align holds "l" or "r" per column (numbers right)."""
    align = align or ["l"] + ["r"] * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |",
             "| " + " | ".join("---:" if a == "r" else ":---:" if a == "c" else "---" for a in align) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The sections

def _runtime(sluice: dict) -> str:
    """How the binary links the Swift runtime, when the result file says."""
    return {"static": " (Swift runtime linked statically, as the .deb and the image ship it)",
            "dynamic": " (Swift runtime loaded from the toolchain's shared libraries)"}.get(sluice.get("swift_runtime"), "")


def header_section(result: dict, source: str, chart: str | None) -> str:
    sc, m, v = result["scenario"], result["machine"], result["versions"]
    sluice = v["sluice"]
    tools = [f"{name} {_version_number(v.get(name))}" for name in
             ("haproxy", "nginx", "squid", "trafficserver", "tinyproxy", "redis", "wrk", "curl", "valgrind")
             if v.get(name)]
    missing = [f"{t} ({info['reason']})" for t, info in result.get("targets", {}).items() if info["status"] != "ok"]
    dirty = " with uncommitted changes in Sources/" if result["commit"]["uncommitted_changes_in_sources"] else ""
    lines = [
        f"### {sc.get('description', sc['name'])}",
        "",
        f"Generated by `python3 -m bench report` from [{source}]({source}) "
        f"(scenario `{sc['name']}`, {result['started_utc'].replace('T', ' ').replace('Z', ' UTC')}, "
        f"{result['wall_seconds']} s); do not edit by hand.",
        "",
        f"- **machine**: {m['cores']} × {m['cpu_model']}, Linux {m['kernel']}, {m['memory_mib'] / 1024:.0f} GiB, "
        f"{m['os']}; other load just before the run: {result.get('other_load_before_pct', 0)} %",
        f"- **sluice**: commit {result['commit']['id']}{dirty}, `sluice --version` {sluice['version']}, "
        f"binary built {sluice['built_utc']}{_runtime(sluice)}; " + ", ".join(tools),
        f"- **method**: wrk {sc['duration']} s per run, {sc['rounds']} round(s) per cell, the median round "
        f"shown; targets interleaved (round 1 of every target, then round 2 …); all on 127.0.0.1, where "
        f"wrk, the origin nginx and the proxy share the cores, so compare ratios within a run",
    ]
    if result.get("baseline"):
        b = result["baseline"]
        lines.append(f"- **baseline** (the `@base` targets: the same configurations on another binary, "
                     f"interleaved with the others): `{b['binary']}`, `sluice --version` {b['version']}, "
                     f"built {b['built_utc']}{_runtime(b)}, sha256 {(b['sha256'] or '?')[:12]}")
    if missing:
        lines.append("- **not measured**: " + "; ".join(missing))
    if result.get("notes"):
        lines.append("- **notes**: " + "; ".join(result["notes"]))
    if chart:
        lines += ["", f"![{sc['name']} run]({chart})"]
    return "\n".join(lines)


def _version_number(text: str | None) -> str:
    match = re.search(r"\d+\.\d+(\.\d+)?", text or "")
    return match.group(0) if match else "?"


def cpu_cell(result: dict) -> tuple[str, int]:
    """The cell whose CPU per request the summary shows: the first with cpu_connections, else the first."""
    cells_ = loads(result)
    return next(((b, c) for b, c in cells_ if c == result["scenario"]["cpu_connections"]), cells_[0])


def summary_section(result: dict) -> str | None:
    """One row per proxy: ratios to the first reference in every cell, to the second at
    cpu_connections, CPU per request, and the memory and instruction figures."""
    refs = references(result)
    if not refs or "throughput" not in result:
        return None
    sc, table_cells = result["scenario"], cells(result)
    main = refs[0]
    cpu_body, cpu_c = cpu_cell(result)
    header = ["target"] + [cell_name(b, c) for b, c in loads(result)]
    header += [f"ratio to {r} ({cell_name(cpu_body, cpu_c)})" for r in refs[1:]]
    header.append(f"CPU/req {cell_name(cpu_body, cpu_c)}")
    redis = has_redis(result)
    if redis:
        header += ["Redis CPU/req", "Redis round trips/req"]
    big, idle = result.get("big_download", {}), result.get("idle_clients", {})
    sys_, cg = result.get("syscalls", {}), result.get("callgrind", {})
    if big:
        header += ["1 GiB", "sha256", "peak RSS growth streaming"]
    header.append("idle RSS")
    if idle:
        header.append(f"+{sc['idle_clients']['clients']} idle clients")
    if sys_:
        header.append("syscalls/req")
    if cg:
        header.append("instructions/req")
    rows = []
    for t in measured_targets(result):
        if t == main:
            continue
        row = [t] + [f_ratio(throughput_ratio(result, t, main, b, c)) for b, c in loads(result)]
        row += [f_ratio(throughput_ratio(result, t, r, cpu_body, cpu_c)) for r in refs[1:]]
        row.append(f_cpu((table_cells.get((t, cpu_body, cpu_c)) or {}).get("cpu_us")))
        if redis:
            r = redis_summary(result, t, cpu_body, cpu_c)
            row += [f_cpu(r["redis_cpu_us"]), f_trips(r["round_trips"])] if r else ["–", "–"]
        if big:
            b = big.get(t, {})
            row += [f_ratio(stats.ratio(b.get("mb_s"), big.get(main, {}).get("mb_s"))), f_sha(b.get("sha256")),
                    f_mib(b.get("peak_growth_kib"))]
        row.append(f_mib(result["targets"][t].get("rss_idle_kib")))
        if idle:
            row.append(f_mib(idle.get(t, {}).get("growth_kib"), sign=True))
        if sys_:
            row.append(str(sys_.get(t, {}).get("per_request", "n/a")))
        if cg:
            row.append(f_int(cg.get(t, {}).get("per_request")) if t in cg else "–")
        rows.append(row)
    notes = [f"Ratios: median req/s (or MB/s) over {main}'s in the same cell of the same run."]
    notes.append(f"CPU/req: utime+stime of the proxy's processes over the median run / requests completed.")
    if redis:
        notes.append("Redis CPU/req: the same for the target's own redis-server (not in CPU/req); Redis round "
                     "trips/req: the EVALSHA and EVAL calls in Redis's `INFO commandstats` during the run / "
                     "requests completed (the fleet heartbeats, every 2 s, included).")
        notes += redis_notes(result)
    if idle:
        notes.append(f"Idle RSS: right after start and one request; +N idle clients: RSS growth with that many "
                     f"kept-alive connections, each after one 1 KiB response.")
    return "#### Summary\n\n" + table(header, rows) + "\n\n" + " ".join(notes)


def throughput_sections(result: dict) -> list[str]:
    """The detail of every cell: req/s, latency, ratios, CPU, other load, errors and every round."""
    if "throughput" not in result:
        return []
    sc, refs, table_cells = result["scenario"], references(result), cells(result)
    origin = sc["origin"]
    raw = {(c["target"], c["body"], c["connections"]): c["rounds"] for c in result["throughput"]}
    sections = []
    for body in dict.fromkeys(b for b, _ in loads(result)):
        header = ["target", "connections", "req/s", "p50", "p99"] + [f"ratio to {r}" for r in refs]
        header += ["proxy CPU/req"] + (["origin CPU/req"] if origin != "plain" else [])
        redis = has_redis(result)
        header += ["Redis CPU/req", "Redis round trips/req"] if redis else []
        header += (["upstream connections"] if origin == "tls" else []) + ["other load", "errors", "req/s of each round"]
        rows = []
        for b, c in loads(result):
            if b != body:
                continue
            for t in measured_targets(result):
                m = table_cells.get((t, b, c))
                if not m:
                    rows.append([t, str(c)] + ["n/a"] * (len(header) - 2))
                    continue
                row = [t, str(c), str(m["rps"]), f_us(m["p50_us"]), f_us(m["p99_us"])]
                row += [f_ratio(throughput_ratio(result, t, r, b, c)) for r in refs]
                row.append(f_cpu(m["cpu_us"]))
                if origin != "plain":
                    row.append(f_cpu(m["origin_cpu_us"]))
                if redis:
                    row += ([f_cpu(m.get("redis_cpu_us")), f_trips(m.get("redis_round_trips"))]
                            if "redis_round_trips" in m else ["–", "–"])
                if origin == "tls":
                    row.append(str(m.get("upstream_connections", "n/a")))
                row += [f"{m['other_load_pct']} %", f_errors(m["errors"]),
                        " / ".join(str(r["rps"]) for r in raw[(t, b, c)])]
                rows.append(row)
        align = ["l"] + ["r"] * (len(header) - 3) + ["l", "l"]
        what = BODY_NAMES.get(body, body) + ("" if body.startswith("put") else " GET")
        sections.append(f"#### {what} (wrk)\n\n" + table(header, rows, align))
    if origin == "caching":
        sections.append(cache_section(result))
    return sections


def cache_section(result: dict) -> str:
    counts = result.get("origin_requests", {})
    text = ("Origin requests: the requests for each target's own object that reached the origin during the "
            "whole run (checks, warm-up and rounds): " + ", ".join(f"{t} {f_int(n)}" for t, n in counts.items()))
    if "squid_hits" in result:
        text += f"; Squid's access log shows {f_int(result['squid_hits'])} TCP_HIT/TCP_MEM_HIT lines"
    return text + "."


def big_section(result: dict) -> str | None:
    big = result.get("big_download")
    if not big:
        return None
    main = next(iter(references(result)), None)
    rows = [[t, str(b["mb_s"]), " / ".join(str(v) for v in b.get("mb_s_rounds", [b["mb_s"]])),
             f_ratio(stats.ratio(b["mb_s"], big.get(main, {}).get("mb_s"))), f_sha(b["sha256"]),
             f_mib(b.get("peak_growth_kib")) if t != "direct" else "–", f"{b['other_load_pct']} %", b["note"] or ""]
            for t, b in big.items()]
    return ("#### 1 GiB download (curl)\n\n"
            + table(["target", "MB/s", "MB/s of each round", f"ratio to {main}", "sha256", "peak RSS growth",
                     "other load", "note"], rows, ["l", "r", "r", "r", "c", "r", "r", "l"])
            + f"\n\nMB/s (10^6 bytes) into /dev/null, the median of the rounds (interleaved: round 1 of every "
              f"target, then round 2 ...); a proxy's median above 1.05x direct's fails the sanity check (the note "
              f"says so); sha256 of one more download, hashed as it arrives; the proxy's RSS sampled every "
              f"{result['scenario']['big_download']['rss_sample_ms']} ms during all of them, maximum minus the RSS "
              f"right before the first.")


def resources_section(result: dict) -> str | None:
    """Per proxy: RSS idle, after the load runs, after the 1 GiB downloads; idle clients; syscalls."""
    proxies = [t for t in measured_targets(result) if t != "direct"]
    if not proxies:
        return None
    idle, sys_, big = result.get("idle_clients", {}), result.get("syscalls", {}), result.get("big_download", {})
    hold = result["scenario"]["idle_clients"]["hold"] if idle else 0
    header = ["proxy", "RSS idle", "RSS after the load runs"] + (["RSS after 1 GiB"] if big else [])
    if idle:
        n = result["scenario"]["idle_clients"]["clients"]
        header += [f"RSS with {n} idle clients", "growth", "per client", "clients answered"]
        if hold:
            header += [f"peak while held {hold} s", "RSS after they left", "descriptors before / with / after"]
    if sys_:
        header += ["syscalls/req", "top syscalls per request"]
    rows = []
    for t in proxies:
        info = result["targets"][t]
        row = [t, f_mib(info.get("rss_idle_kib")), f_mib(info.get("rss_after_load_kib"))]
        if big:
            row.append(f_mib(big.get(t, {}).get("rss_after_kib")))
        if idle:
            i = idle.get(t)
            if i:
                row += [f_mib(i["rss_held_kib"]), f_mib(i["growth_kib"], sign=True),
                        f"{i['growth_kib'] / max(i['answered'], 1):.1f} KiB", f"{i['answered']} of {i['clients']}"]
                if hold:
                    row += [f_mib(i["rss_peak_kib"]), f_mib(i.get("rss_released_kib")),
                            f"{i['fds_before']} / {i['fds_held']} / {i.get('fds_released', 'n/a')}"]
            else:
                row += ["n/a"] * (7 if hold else 4)
        if sys_:
            s = sys_.get(t, {})
            row += [str(s.get("per_request", s.get("note", "n/a"))),
                    ", ".join(f"{name} {per:.2f}" for name, per in s.get("top", []))]
        rows.append(row)
    title = "Memory and system calls" if sys_ else "Memory"
    return f"#### {title}\n\n" + table(header, rows, ["l"] + ["r"] * (len(header) - 1))


def instruction_delta(result: dict, target: str, reference: str) -> tuple[int, float] | None:
    """The target's instructions per request minus the reference's (callgrind, same run), and
    that difference as a percentage of the reference's; None unless both have a figure."""
    cg = result.get("callgrind", {})
    a, b = cg.get(target, {}).get("per_request"), cg.get(reference, {}).get("per_request")
    if a is None or not b:
        return None
    return a - b, (a - b) / b * 100


def f_delta(delta: tuple[int, float] | None) -> str:
    return "n/a" if delta is None else f"{delta[0]:+,} ({delta[1]:+.1f} %)"


def callgrind_section(result: dict) -> str | None:
    """Every Sluice target's instructions per request; when a reference was profiled too (a
    scenario comparing Sluice configurations, such as sluice-pipeline in `signing` or `lua`), each
    one's difference to the first such reference."""
    cg = result.get("callgrind")
    if not cg:
        return None
    p = result["scenario"]["callgrind"]
    compare = next((r for r in references(result) if cg.get(r, {}).get("per_request") is not None), None)
    header = ["target", f"Ir, {p['n1']} requests", f"Ir, {p['n2']} requests", "instructions per request"]
    header += [f"difference to {compare}"] if compare else []
    header.append("costliest functions (self, per request)")
    rows = []
    for t, r in cg.items():
        row = [t, f_int(r.get("ir_n1")), f_int(r.get("ir_n2")),
               f_int(r.get("per_request")) if "per_request" in r else r.get("note", "n/a")]
        if compare:
            row.append("–" if t == compare else f_delta(instruction_delta(result, t, compare)))
        row.append(", ".join(f"{name.split('(')[0][:60]} {ir:,}" for ir, name in r.get("top", [])[:3]))
        rows.append(row)
    fleet = [f"{t} {' / '.join(f_int(n) for n in r['redis_round_trips_per_run'])}" for t, r in cg.items()
             if r.get("redis_round_trips_per_run")]
    fleet_note = (f" Redis round trips (EVALSHA + EVAL) during the {p['n1']}- and {p['n2']}-request runs, the "
                  f"heartbeats of both Sluice processes on it included: " + ", ".join(fleet) + "." if fleet else "")
    peers = [t for t in cg if t.startswith("nginx")]
    peer_note = (f" {', '.join(peers)}: nginx with one process (`master_process off`, `worker_processes 1`), the "
                 "same requests." if peers else "")
    return ("#### Instructions per request (callgrind)\n\n"
            + table(header, rows, ["l"] + ["r"] * (len(header) - 2) + ["l"])
            + f"\n\nSluice with `workers: 1` under `valgrind --tool=callgrind` (debug info stripped), {p['n1']} and "
              f"then {p['n2']} sequential {p.get('body', '1k').replace('k', ' KiB')} GETs on one kept-alive connection; "
              f"(Ir({p['n2']}) − Ir({p['n1']})) / "
              f"{p['n2'] - p['n1']}, so start-up and shutdown cancel out.{peer_note}{fleet_note}")


def baseline_section(result: dict) -> str | None:
    """Each Sluice target against its `@base` twin (run --baseline), cell by cell: req/s and CPU
    per request of the binary under test over the baseline's, and the instructions per request
    of both."""
    if not result.get("baseline"):
        return None
    table_ = cells(result)
    ok = measured_targets(result)
    twins = [t for t in ok if not t.endswith("@base") and f"{t}@base" in ok]
    if not twins:
        return None
    cg = result.get("callgrind", {})
    header, rows = ["target", "cell", "req/s (base → this)", "ratio", "CPU/req (base → this)", "ratio"], []
    for t in twins:
        for body, connections in loads(result):
            a, b = table_.get((t, body, connections)), table_.get((f"{t}@base", body, connections))
            if not a or not b:
                continue
            rows.append([t, cell_name(body, connections), f"{b['rps']:,.0f} → {a['rps']:,.0f}",
                         f_ratio(stats.ratio(a["rps"], b["rps"])), f"{f_cpu(b.get('cpu_us'))} → {f_cpu(a.get('cpu_us'))}",
                         f_ratio(stats.ratio(a.get("cpu_us"), b.get("cpu_us")))])
        before, after = cg.get(f"{t}@base", {}).get("per_request"), cg.get(t, {}).get("per_request")
        if before and after:
            rows.append([t, "instructions per request", f"{before:,} → {after:,}", f_ratio(after / before), "", ""])
    return ("#### Against the baseline\n\n" + table(header, rows, ["l", "l", "r", "r", "r", "r"])
            + "\n\nRatios: this binary's figure over the baseline's in the same cell of the same run.")


def fleetcache_section(result: dict) -> str | None:
    """The fleetcache measure (bench/fleetcache.py): the peer hop's cost and the origin's load."""
    f = result.get("fleetcache")
    if not f or "shared" not in f:
        return f and f"#### The fleet's shared cache\n\n{f.get('note', 'n/a')}"
    p = result["scenario"]["fleetcache"]
    parts = ["#### The fleet's shared cache"]
    hop = f.get("hop", {})
    if hop.get("median") and all(hop["median"].values()):
        owner, asker = hop["median"]["owner"], hop["median"]["non_owner"]
        rows = [[what, f"{m['rps']:,}", f_us(m["p50_us"]), f_us(m["p99_us"]), f_cpu(m.get("cpu_us_a")),
                 f_cpu(m.get("cpu_us_b")), f_cpu((m.get("cpu_us_a") or 0) + (m.get("cpu_us_b") or 0)),
                 f"{m['other_load_pct']} %"]
                for what, m in (("through the owner (B)", owner), ("through a non-owner (A, asking B)", asker))]
        parts.append(f"A memory hit of one 1 KiB object owned by B, wrk at {p['connections']} connections "
                     f"(median of {result['scenario']['rounds']} interleaved rounds):\n\n"
                     + table(["path", "req/s", "p50", "p99", "CPU/req A", "CPU/req B", "CPU/req A + B", "other load"],
                             rows, ["l"] + ["r"] * 7)
                     + f"\n\nThe hop: {f_ratio(stats.ratio(asker['rps'], owner['rps']))} of the owner's req/s.")
    else:
        parts.append(hop.get("note", "The hop's cost: n/a"))
    rows = [[what, f_int(r["requests"]), f_int(r["distinct_urls"]), f_int(r["origin_requests"]),
             f"{r['origin_requests'] / r['distinct_urls']:.2f}",
             ", ".join(f"{k}: {v:,}" for k, v in r["statuses"].items()), f"{r['seconds']} s"]
            for what, r in (("one cache across the fleet", f["shared"]), ("each instance its own", f["local"]))]
    parts.append(f"{p['requests']:,} GETs of {p['urls']:,} URLs with a Zipf popularity (exponent {p['zipf']}), "
                 f"each through one of three instances at random, from {p['clients']} client threads:\n\n"
                 + table(["caches", "requests", "distinct URLs", "origin requests", "per distinct URL", "answers",
                          "took"], rows, ["l"] + ["r"] * 6))
    return "\n\n".join(parts)


def soak_section(result: dict) -> str | None:
    s = result.get("soak")
    if not s:
        return None
    p = result["scenario"]["soak"]
    if "rss_growth_kib" not in s:
        return f"#### Soak\n\n{s.get('note', 'n/a')}"
    row = [f_int(s["requests"]), f_errors(s["errors"]), f_us(s["p99_us"]), f_mib(s["rss_start_kib"]),
           f_mib(s["rss_end_kib"]), f"{s['rss_growth_kib']:+d} KiB",
           f"{f_mib(s['rss_min_kib'])} / {f_mib(s['rss_max_kib'])}",
           f"{s['fds_start']} / {s['fds_end']} / {s['fds_max']}", f"{s['other_load_pct']} %",
           "pass" if s["passed"] else "**FAIL**"]
    return (f"#### Soak: {p['duration']} s at {p['rate']} req/s ({p['connections']} kept-alive connections, "
            f"1 KiB GET)\n\n"
            + table(["requests", "errors", "p99", "RSS after warm-up", "RSS at the end", "growth",
                     "min / max RSS", "descriptors after warm-up / end / max", "other load",
                     "RSS ≤ +2 MiB, descriptors +0"], rows=[row], align=["r", "l"] + ["r"] * 8)
            + f"\n\nGrowth: the median of the last three samples minus the median of the first three after "
              f"the {p['warmup']} s warm-up; a sample every {p['sample']} s.")


def reload_soak_section(result: dict) -> str | None:
    s = result.get("reload_soak")
    if not s:
        return None
    p = result["scenario"]["reload_soak"]
    if "rss_growth_kib" not in s:
        return f"#### Reloads under load\n\n{s.get('note', 'n/a')}"
    load = f"at {p['rate']} req/s" if p["rate"] else "as fast as they go"
    row = [f"{s['reloads_applied']} / {s['reloads_sent']}", f_int(s["requests"]), f_errors(s["errors"]),
           f_us(s["p99_us"]), f_mib(s["rss_start_kib"]), f_mib(s["rss_end_kib"]), f"{s['rss_growth_kib']:+d} KiB",
           f_mib(s["rss_max_kib"]), f"{s['fds_start']} / {s['fds_end']} / {s['fds_max']}",
           "pass" if s["passed"] else "**FAIL**"]
    return (f"#### Reloads under load: {p['duration']} s, a reload every {p['interval']} s ({s['target']}, "
            f"{p['connections']} kept-alive connections {load}, 1 KiB GET)\n\n"
            + table(["reloads applied / sent", "requests", "errors", "p99", "RSS before", "RSS after", "growth",
                     "max RSS", "descriptors before / after / max", "RSS ≤ +10 %, descriptors +0"],
                    rows=[row], align=["r", "r", "l"] + ["r"] * 7)
            + f"\n\nBefore: after {p['warmup']} s of the same load and {p['settle']} s of rest; after: "
              f"{p['settle']} s after the load; a sample every {p['sample']} s in between.")


def markdown(result: dict, source: str, chart: str | None) -> str:
    """Every table the result file has data for, under a header naming the machine, versions and
    method; `source` and `chart` are the links to the result file and the chart."""
    parts = [header_section(result, source, chart), summary_section(result), *throughput_sections(result),
             big_section(result), resources_section(result), callgrind_section(result), baseline_section(result),
             fleetcache_section(result), soak_section(result),
             reload_soak_section(result)]
    return "\n\n".join(p for p in parts if p)


# ---------------------------------------------------------------------------------------------
# Writing

def replace_block(text: str, name: str, content: str) -> str:
    """text with the block between `<!-- bench:begin NAME -->` and `<!-- bench:end NAME -->`
    replaced by content (the markers stay)."""
    begin, end = f"<!-- bench:begin {name} -->", f"<!-- bench:end {name} -->"
    if begin not in text or end not in text:
        raise SystemExit(f"no '{begin}' ... '{end}' block to replace; add the two markers where the tables go")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{content}\n{end}{tail}"


def chart(result: dict, png: Path) -> None:
    """One PNG, two panels: each proxy's median req/s over the first reference's, cell by cell (and
    1 GiB MB/s), and its CPU µs per request in each cell."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    refs, table_cells = references(result), cells(result)
    main = refs[0] if refs else None
    proxies = [t for t in measured_targets(result) if t != main]
    names = [cell_name(b, c) for b, c in loads(result)]
    big = result.get("big_download", {})
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    width = 0.8 / max(len(proxies), 1)
    for i, t in enumerate(proxies):
        ratios = [throughput_ratio(result, t, main, b, c) or 0 for b, c in loads(result)]
        if big and main in big:
            ratios.append(stats.ratio(big.get(t, {}).get("mb_s"), big[main]["mb_s"]) or 0)
        left.bar([x + i * width for x in range(len(ratios))], ratios, width, label=t)
        cpu = [(table_cells.get((t, b, c)) or {}).get("cpu_us") or 0 for b, c in loads(result)]
        bars = right.bar([x + i * width for x in range(len(cpu))], cpu, width, label=t)
        redis = [(table_cells.get((t, b, c)) or {}).get("redis_cpu_us") or 0 for b, c in loads(result)]
        if any(redis):   # a fleet target's Redis, hatched on top of its proxy's CPU
            right.bar([x + i * width for x in range(len(redis))], redis, width, bottom=cpu, hatch="//",
                      color=bars.patches[0].get_facecolor(), alpha=0.5)
    left.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    left.set_xticks([x + width * (len(proxies) - 1) / 2 for x in range(len(names) + (1 if big else 0))],
                    names + (["1 GiB download"] if big else []))
    left.set_ylabel(f"throughput / {main}'s" if main else "throughput")
    right.set_xticks([x + width * (len(proxies) - 1) / 2 for x in range(len(names))], names)
    right.set_ylabel("proxy CPU µs per request" + (" (hatched: its Redis)" if has_redis(result) else ""))
    left.legend(fontsize="small")
    sc = result["scenario"]
    fig.suptitle(f"{sc['name']}: commit {result['commit']['id']}, {result['started_utc'][:10]}, "
                 f"median of {sc['rounds']} rounds of {sc['duration']} s, {result['machine']['cores']} cores")
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)


def link(path: Path, markdown_path: Path) -> str:
    """path as a link from the markdown file."""
    return os.path.relpath(Path(path).resolve(), Path(markdown_path).resolve().parent)


def publish(result_path: Path, markdown_path: Path) -> None:
    """Writes the chart beside the result file and the tables into the markdown file's block."""
    result = load(result_path)
    png = Path(result_path).with_suffix(".png")
    if result.get("throughput"):     # a run without wrk cells (fleetcache, soak) has no chart
        chart(result, png)
    text = replace_block(markdown_path.read_text(), result["scenario"]["name"],
                         markdown(result, link(result_path, markdown_path),
                                  link(png, markdown_path) if png.exists() else None))
    markdown_path.write_text(text)
    print(f"updated {markdown_path} (block {result['scenario']['name']})" + (f" and wrote {png}" if png.exists() else ""))
