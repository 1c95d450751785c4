"""Hostile `lua` scripts (docs/security.md, "Scripting"): each one tries a way out of the
sandbox or a way to hold a worker — `load` of bytecode or into an environment of its own, the
string metatable, `string.rep` and table bombs, deep Lua and C recursion, coroutine tricks,
pattern-matching bombs that run inside one C call, header injection — and each must end in
a clean error: 502 (fail_closed) within a second, nothing sent upstream, the script's message
in the access log, and the next request on the same (single) worker served."""

import time

import pytest

from support import HOST, session_via
from test_lua import access_log, get, lua_policy

# (name, body of on_request(req, ctx), a fragment of the logged error, the outcome)
HOSTILE = [
    # Sandbox escapes through `load`.
    ("load_binary_chunk",
     'assert(load("\\27Lua\\84\\0\\25\\147\\r\\n\\26\\n", "x", "b"))', "attempt to load a binary chunk", "error"),
    # A chunk loaded without an environment gets the sandbox's, not the state's globals: base's
    # `dofile` and `loadfile` are there (and found) unless the sandbox took them away, and the
    # string metatable (whose `__index` is the library table) unless the sandbox hid it.
    ("load_default_env_reaches_nothing",
     'local found = load("return dofile or loadfile or io or os or debug or package or require", "x", "t")() '
     'assert(found ~= nil, "contained")', "contained", "error"),
    ("load_default_env_hides_the_string_metatable",
     'local mt = load("return getmetatable(\'\')", "x", "t")() assert(type(mt) == "table", "contained")',
     "contained", "error"),
    ("string_metatable_index",
     'local mt = getmetatable("") local s = mt.__index s.rep = nil', "attempt to index a boolean value", "error"),
    # Memory.
    ("string_rep_bomb", 'local s = string.rep("x", 1 << 30)', "memory limit reached", "limit"),
    ("string_doubling_bomb", 'local s = "x" for i = 1, 40 do s = s .. s end', "memory limit reached", "limit"),
    ("table_bomb", 'local t = {} for i = 1, 1e8 do t[i] = {i} end', "limit reached", "limit"),
    # Recursion.
    # Lua's stack grows on the heap: the memory cap ends it before Lua's own stack limit.
    ("deep_lua_recursion", 'local function f(n) return 1 + f(n + 1) end f(1)', "memory limit reached", "limit"),
    ("deep_c_recursion_through_gsub",
     'local function f(s) return (s:gsub(".", f)) end f("ab")', "stack overflow", "error"),
    ("metamethod_recursion",
     'local t = setmetatable({}, {}) getmetatable(t).__index = function(t, k) return t[k] end local x = t.y',
     "C stack overflow", "error"),
    # xpcall's handler runs where the error is raised: for a stop, inside the count hook.
    ("xpcall_handler_loop", 'xpcall(function() while true do end end, function() while true do end end)',
     "instruction limit reached", "limit"),
    # Coroutines are not in the sandbox; nothing yields but sluice.http.
    ("coroutine_wrap", 'coroutine.wrap(function() end)()', "attempt to index a nil value (global 'coroutine')", "error"),
    ("coroutine_yield_absent", 'pcall(coroutine.yield)', "attempt to index a nil value (global 'coroutine')", "error"),
    # Pattern bombs: each runs inside one C call, metered step by step (Sources/CLua/match.h).
    ("lazy_pattern_bomb", 'string.rep("a", 300000):find(".-.-.-.-b")', "instruction limit reached", "limit"),
    ("trim_bomb", 'local s = string.rep(" ", 300000) .. "x" s:match("^(.-)%s*$y")', "instruction limit reached",
     "limit"),
    ("gsub_bomb", 'string.rep("a", 300000):gsub("a-a-a-b", "")', "instruction limit reached", "limit"),
    ("gmatch_bomb", 'for w in string.rep("a", 300000):gmatch("a*b") do end', "instruction limit reached", "limit"),
    ("plain_find_bomb",
     'local hay = string.rep("a", 1000000) hay:find(string.rep("a", 400000) .. "b", 1, true)',
     "instruction limit reached", "limit"),
    ("balance_bomb", 'string.rep("(", 300000):find("%b()")', "instruction limit reached", "limit"),
    ("format_width", 'string.format("%0999d", 1)', "invalid conversion", "error"),
    # Loops in C over a range the script picks, needing no memory (Sources/CLua/loops.h).
    ("empty_string_rep_loop", 'local s = string.rep("", math.maxinteger) error("rep made " .. #s .. " bytes")',
     "rep made 0 bytes", "error"),
    ("table_move_loop", 'table.move({}, 1, math.maxinteger, 1)', "instruction limit reached", "limit"),
    ("table_insert_len_loop",
     'local t = setmetatable({}, {__len = function() return math.maxinteger - 1 end}) table.insert(t, 1, "x")',
     "instruction limit reached", "limit"),
    ("table_sort_c_metamethods",
     'local t = setmetatable({}, {__index = rawlen, __newindex = rawequal, __len = function() return (1 << 31) - 2 end}) '
     'table.sort(t)', "a table with a metatable is not sorted", "error"),
    # Work on a large string inside one call, a few VM instructions a call: charged by bytes.
    ("sha256_loop_on_a_large_string",
     'local s = string.rep("a", 2 * 1024 * 1024) for i = 1, 1e9 do sluice.sha256(s) end',
     "instruction limit reached", "limit"),
    ("upper_loop_on_a_large_string",
     'local s = string.rep("a", 1024 * 1024) for i = 1, 1e9 do local u = s:upper() end',
     "instruction limit reached", "limit"),
    # Header injection.
    ("header_value_crlf", 'req.headers:set("X-A", "v\\r\\nX-Injected: 1")', "X-A", "error"),
    ("header_value_nul", 'req.headers:add("X-A", "v\\0w")', "X-A", "error"),
    ("header_name_not_a_token", 'req.headers:set("X Bad", "v")', "X Bad", "error"),
    ("header_name_crlf", 'req.headers:set("X-A\\r\\nX-B", "v")', "X-A", "error"),
    # Host follows the URL: an edit of it would be ignored, so it fails the call.
    ("host_set", 'req.headers:set("host", "evil.test")', "Host follows the request's URL", "error"),
    ("host_remove", 'assert(req.headers:get("Host") == nil) req.headers:remove("HOST")', "Host follows", "error"),
]


@pytest.mark.parametrize("name,body,fragment,outcome", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_script_ends_in_a_clean_error(sluice_factory, recorder, tmp_path, name, body, fragment, outcome):
    source = "return { on_request = function(req, ctx)\n" + body + "\nend }"
    proxy = sluice_factory(lua_policy({"source": source}, tmp_path, workers=1))
    t0 = time.monotonic()
    r = get(proxy, recorder, f"/{name}")
    assert r.status_code == 502, r.text
    assert time.monotonic() - t0 < 1.0
    assert "source.lua:" not in r.text, r.text  # never the script's message
    assert not recorder.requests()
    line = access_log(tmp_path).wait_for(lambda e: e.get("status") == 502)[0]
    assert fragment in line["lua"]["error"], line
    assert line["lua"]["outcome"] == outcome, line
    # The same worker (there is one) serves on: the script's host, and a plain one.
    with session_via(proxy.url) as s:
        assert s.get(f"http://localhost:{recorder.port}/next", timeout=5).status_code == 200
    assert get(proxy, recorder, "/again").status_code == 502
