"""The pure arithmetic and the parsers of the tools' output."""

from bench import stats


def rounds(*rps):
    return [{"round": i + 1, "rps": v} for i, v in enumerate(rps)]


def test_median_round_is_the_middle_round_whole():
    assert stats.median_round(rounds(300, 100, 200)) == {"round": 3, "rps": 200}


def test_median_round_of_an_even_count_is_the_lower_middle():
    assert stats.median_round(rounds(400, 100, 300, 200))["rps"] == 200


def test_median_round_skips_rounds_without_a_figure_and_may_be_none():
    assert stats.median_round([{"rps": None}, {"rps": 5}]) == {"rps": 5}
    assert stats.median_round([]) is None


def test_ratio():
    assert stats.ratio(42000, 84000) == 0.5
    assert stats.ratio(None, 1) is None
    assert stats.ratio(1, 0) is None


def test_cpu_per_request():
    # 250 ticks at 100 Hz = 2.5 s of CPU over 100,000 requests = 25 µs each.
    assert stats.cpu_us_per_request(250, 100, 100000) == 25.0
    assert stats.cpu_us_per_request(250, 100, 0) is None


def test_other_load_takes_the_smaller_estimate():
    # Others claim 50 ticks but the machine was busy 120 of which 100 were ours: 20 of 200.
    assert stats.other_load_pct(others=50, busy=120, ours=100, total=200) == 10
    assert stats.other_load_pct(others=10, busy=120, ours=0, total=200) == 5
    assert stats.other_load_pct(others=10, busy=50, ours=80, total=200) == 0


def test_parse_wrk():
    out = "Running 4s test\nBENCH_RESULT requests=200000 duration_us=4000000 bytes=1 p50_us=900 p99_us=3100 " \
          "err_connect=0 err_read=2 err_write=0 err_status=0 err_timeout=0\n"
    result = stats.parse_wrk(out)
    assert result["rps"] == 50000 and result["p99_us"] == 3100
    assert stats.wrk_errors(result) == {"read": 2}
    assert stats.parse_wrk("unable to connect") is None


def test_parse_strace_summary():
    text = """% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 60.00    0.600000          10     60000           readv
 40.00    0.400000          10     58000           writev
  0.00    0.000001           1        12         3 epoll_wait
------ ----------- ----------- --------- --------- ----------------
100.00    1.000001           8    118012         3 total
"""
    total, rows = stats.parse_strace_summary(text)
    assert total == 118012
    assert rows == [("readv", 60000), ("writev", 58000), ("epoll_wait", 12)]


def test_parse_callgrind_total():
    assert stats.parse_callgrind_total("events: Ir\nsummary: 5\ntotals: 251876490\n") == 251876490
    assert stats.parse_callgrind_total("events: Ir\nsummary: 85250666\n") == 85250666
    assert stats.parse_callgrind_total("") is None


def test_growth_first_last():
    assert stats.growth_first_last([10, 30, 20, 50, 40, 60]) == (20, 50)
    assert stats.growth_first_last([1, 2, 3]) is None


COMMANDSTATS = """# Commandstats\r
cmdstat_evalsha:calls=1003,usec=40120,usec_per_call=40.00,rejected_calls=0,failed_calls=1\r
cmdstat_script|load:calls=6,usec=300,usec_per_call=50.00,rejected_calls=0,failed_calls=0\r
cmdstat_info:calls=2,usec=80,usec_per_call=40.00,rejected_calls=0,failed_calls=0\r
"""


def test_commandstats_and_the_calls_between_two_readings():
    after = stats.parse_commandstats(COMMANDSTATS)
    assert after["evalsha"] == {"calls": 1003, "usec": 40120, "rejected_calls": 0, "failed_calls": 1}
    assert after["script|load"]["calls"] == 6
    before = {"evalsha": {"calls": 3, "failed_calls": 0}, "script|load": {"calls": 6}, "info": {"calls": 1}}
    assert stats.redis_calls(before, after) == {"evalsha": 1000, "eval": 0, "script_load": 0, "round_trips": 1000,
                                                "failed": 1}
    # The commands the scripts call inside Redis are no round trips; EVAL after NOSCRIPT is one.
    after["time"], after["eval"] = {"calls": 1000}, {"calls": 2}
    assert stats.redis_calls(before, after)["round_trips"] == 1002
    assert stats.redis_calls({}, {}) == {"evalsha": 0, "eval": 0, "script_load": 0, "round_trips": 0, "failed": 0}


def test_a_proxy_faster_than_direct_fails_the_sanity_check():
    from bench.measures import flag_faster_than_direct

    rows = {"direct": {"mb_s": 1000, "note": None}, "sluice": {"mb_s": 1060, "note": None},
            "haproxy": {"mb_s": 1040, "note": None}}
    messages = flag_faster_than_direct(rows)
    assert len(messages) == 1 and "sluice" in messages[0] and "1.06x" in messages[0]
    assert rows["sluice"]["sanity_check_failed"] and "not trusted" in rows["sluice"]["note"]
    assert "sanity_check_failed" not in rows["haproxy"]
    assert flag_faster_than_direct({"sluice": {"mb_s": 5000, "note": None}}) == []   # no direct: nothing to say
