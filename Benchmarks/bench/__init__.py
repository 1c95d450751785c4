"""Sluice's benchmark harness: scenarios as data (../scenarios.toml), one JSON result file per run
(../results/), and BENCHMARKS.md's tables and chart generated from a result file.

    cd Benchmarks && python3 -m bench run headline --report
"""
