"""Command line: `python3 -m bench run|report|list` (run from Benchmarks/)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from . import report, runner


def main() -> None:
    parser = argparse.ArgumentParser(prog="python3 -m bench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a scenario and write its result file to Benchmarks/results/")
    run.add_argument("scenario", nargs="?", default="headline")
    run.add_argument("--sluice", default=os.environ.get("SLUICE_BIN", ".build-static/release/sluice"),
                     help="the Sluice binary (default: $SLUICE_BIN or .build-static/release/sluice, the Swift "
                          "runtime linked statically as the .deb and the image ship it: `make static`; "
                          "relative to the repo)")
    run.add_argument("--baseline", metavar="BIN",
                     help="another Sluice binary (the build to compare with): every Sluice target also runs "
                          "on it as <target>@base, in the same interleaved rounds")
    run.add_argument("--targets", help="comma-separated targets instead of the scenario's")
    run.add_argument("--duration", type=int, help="seconds per wrk run")
    run.add_argument("--rounds", type=int, help="wrk runs per cell")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override a key of the scenario (TOML value; TABLE.KEY for a table's key)")
    run.add_argument("--keep-logs", action="store_true", help="keep the temp dir (configs, logs, profiles)")
    run.add_argument("--report", action="store_true", help="then update BENCHMARKS.md and the chart from it")

    rep = sub.add_parser("report", help="BENCHMARKS.md's tables and the chart from a result file")
    rep.add_argument("result", type=Path)
    rep.add_argument("--markdown", type=Path, default=runner.REPO / "BENCHMARKS.md",
                     help="the file whose <!-- bench:begin NAME --> block is replaced (default: BENCHMARKS.md)")
    rep.add_argument("--stdout", action="store_true", help="print the tables instead of updating the file")

    sub.add_parser("list", help="the scenarios")
    args = parser.parse_args()

    if args.command == "list":
        for name, description in runner.scenario_names().items():
            print(f"{name:10} {description}")
    elif args.command == "run":
        overrides = list(args.set)
        if args.targets:
            overrides.append(f"targets={[t.strip() for t in args.targets.split(',')]!r}".replace("'", '"'))
        if args.duration:
            overrides.append(f"duration={args.duration}")
        if args.rounds:
            overrides.append(f"rounds={args.rounds}")
        scenario = runner.load_scenario(args.scenario, overrides)
        sluice = Path(args.sluice)
        resolve = lambda p: p if p.is_absolute() else runner.REPO / p
        path = runner.run(scenario, resolve(sluice), args.keep_logs,
                          resolve(Path(args.baseline)) if args.baseline else None)
        if args.report:
            report.publish(path, runner.REPO / "BENCHMARKS.md")
    else:
        if args.stdout:
            png = args.result.with_suffix(".png")
            print(report.markdown(report.load(args.result), report.link(args.result, args.markdown),
                                  report.link(png, args.markdown) if png.exists() else None))
        else:
            report.publish(args.result, args.markdown)


if __name__ == "__main__":
    main()
