import CLua
import Testing

@testable import SluiceCore

/// Sluice's own pattern matcher (Sources/CLua/match.h, written from the manual) against
/// liblua's: one bare state holds both — liblua's `string` library and the metered functions
/// as `metered.find`, `metered.match`, `metered.gmatch`, `metered.gsub` — and a Lua chunk runs
/// each case through both and lists every difference in results or error messages. The state
/// belongs to the test that makes it.
@Suite struct LuaPatternTests {
    /// Runs `cases` (a Lua expression: a list of cases) through `LuaPatternTests.comparer`;
    /// returns the differences, one a line ("" when none), and how many calls were compared.
    private static func differences(_ cases: String) -> (String, Int) {
        let meter = UnsafeMutablePointer<sluice_lua_meter>.allocate(capacity: 1)
        meter.initialize(to: sluice_lua_meter())
        meter.pointee.limit = 1 << 30
        meter.pointee.period_limit = Int64.max / 2
        meter.pointee.deadline_us = Int64.max
        defer { meter.deallocate() }
        guard let L = sluice_lua_newstate(meter) else { return ("no state", 0) }
        defer { lua_close(L) }
        luaL_openlibs(L)
        sluice_lua_newtable(L)
        sluice_lua_meter_patterns(L)
        lua_setglobal(L, "metered")
        let chunk = comparer + "\nreturn compare(" + cases + ")"
        guard sluice_lua_load(L, chunk, chunk.utf8.count, "=compare") == LUA_OK, sluice_lua_pcall(L, 0, 2) == LUA_OK else {
            return ("chunk failed: " + (Lua.string(L, -1) ?? "?"), 0)
        }
        return (Lua.string(L, -2) ?? "?", Int(sluice_lua_tointeger(L, -1, nil)))
    }

    /// `compare(cases)`: each case is `{ subject, pattern, init }` (run through find, plain
    /// find, match, gmatch and gsub with string, table and function replacements) or
    /// `{ subject, pattern, init, gsub = repl, n = max }` (that gsub only).
    private static let comparer = #"""
        local function show(ok, ...)
          local out = { tostring(ok) }
          for i = 1, select('#', ...) do
            local v = select(i, ...)
            if not ok and type(v) == 'string' then v = v:gsub("to '[^']*'", "to '?'") end
            out[#out + 1] = (math.type(v) or type(v)) .. ':' .. tostring(v)
          end
          return table.concat(out, ',')
        end
        local function iterate(gmatch, s, p, init)
          local ok, it = pcall(gmatch, s, p, init)
          if not ok then return show(false, it) end
          local out = {}
          for _ = 1, 100 do
            local r = table.pack(pcall(it))
            out[#out + 1] = show(table.unpack(r, 1, r.n))
            if not r[1] or r[2] == nil then break end
          end
          return table.concat(out, ';')
        end
        local table_repl = { a = 'A', b = false, ['1'] = 1.5, x = {}, ab = 'AB' }
        local function function_repl(...)
          local first = ...
          if first == 'b' then return nil end
          if first == 'x' then return {} end
          if first == 'a' then return false end
          local out = {}
          for i = 1, select('#', ...) do out[i] = tostring((select(i, ...))) end
          return '<' .. table.concat(out, '|') .. '>'
        end
        local replacements = { '[%0]', '%1-%%', '%2', 'x%', '%z', 7, table_repl, function_repl }
        function compare(cases)
          local diffs, calls = {}, 0
          local function check(what, a, b)
            calls = calls + 1
            if a ~= b then diffs[#diffs + 1] = what .. '\n  lua:     ' .. a .. '\n  metered: ' .. b end
          end
          for _, c in ipairs(cases) do
            local s, p, init = c[1], c[2], c[3]
            local label = string.format('%q %q %s', s, p, tostring(init))
            if c.gsub ~= nil then
              check('gsub ' .. label .. ' ' .. tostring(c.gsub),
                show(pcall(string.gsub, s, p, c.gsub, c.n)), show(pcall(metered.gsub, s, p, c.gsub, c.n)))
            else
              check('find ' .. label, show(pcall(string.find, s, p, init)), show(pcall(metered.find, s, p, init)))
              check('plain find ' .. label,
                show(pcall(string.find, s, p, init, true)), show(pcall(metered.find, s, p, init, true)))
              check('match ' .. label, show(pcall(string.match, s, p, init)), show(pcall(metered.match, s, p, init)))
              check('gmatch ' .. label, iterate(string.gmatch, s, p, init), iterate(metered.gmatch, s, p, init))
              for _, r in ipairs(replacements) do
                check('gsub ' .. label .. ' ' .. tostring(r),
                  show(pcall(string.gsub, s, p, r)), show(pcall(metered.gsub, s, p, r)))
              end
            end
          end
          return table.concat(diffs, '\n'), calls
        end
        """#

    @Test func everyFeatureMatchesAsLuasOwnDoes() {
        let cases = #"""
            {
              -- plain text, init, empty patterns and subjects
              { 'hello world', 'o w' }, { 'hello world', 'o', 6 }, { 'hello', 'l', -2 }, { 'hello', 'l', -100 },
              { 'hello', 'l', 0 }, { 'hello', 'h', 6 }, { 'hello', '', 6 }, { 'hello', '', 7 }, { 'hello', 'x', 100 },
              { '', '' }, { '', 'a' }, { '', '.*' }, { 'abc', '' }, { 'a.b', '.' }, { 'a+b', 'a+b' }, { 'a\0b', '\0' },
              { 'a\0b', '%z' }, { 'a\0b\0', '[\0]+' }, { 'x.y', '%.' }, { 'a%b', '%%' },
              -- single-character classes and their complements
              { 'Ab1 \t\n!_~\127', '%a+' }, { 'Ab1 \t\n!', '%A+' }, { 'a\1\31b', '%c+' }, { 'x1234y', '%d+' },
              { 'x1234y', '%D+' }, { ' a!b ', '%g+' }, { 'aBcD', '%l+' }, { 'aBcD', '%L+' }, { 'a,.;b', '%p+' },
              { 'a \t\r\nb', '%s+' }, { 'a \t\r\nb', '%S+' }, { 'abCD', '%u+' }, { 'a_b1', '%w+' }, { 'a_b1', '%W' },
              { '0x1fG', '%x+' }, { '0x1fG', '%X+' }, { '\200\255abc', '.+' }, { '\200\255abc', '%a' },
              -- sets
              { 'hello]', '[]]' }, { 'a-b', '[a-]+' }, { 'a-b', '[-a]+' }, { 'az09', '[a-z]+' }, { 'AZ', '[^A-Z]' },
              { 'a]b', '[^]]+' }, { 'a%b', '[%%]' }, { 'a1 b', '[%d%s]+' }, { 'a.b', '[%.]' }, { 'abc', '[^%a]' },
              { 'x^y', '[x^]+' }, { 'a', '[a' }, { 'a', '[a%' }, { 'a', '[]' }, { 'a', '[^]' }, { 'z', '[%a-z]' },
              { '\200', '[\128-\255]' }, { 'abc', '[c-a]' },
              -- quantifiers
              { 'aaab', 'a*' }, { 'aaab', 'a-b' }, { 'aaab', 'a+' }, { 'b', 'a+' }, { 'ab', 'a?b' }, { 'b', 'a?b' },
              { 'aaa', 'a?a?a?a' }, { '  trim  ', '^%s*(.-)%s*$' }, { 'x = 1, y = 2', '(%w+)%s*=%s*(%w+)' },
              { 'aaa', '.-' }, { 'aaa', '.-$' }, { 'a*b', 'a%*b' }, { 'ab', '*a' }, { 'a-b', '-' }, { 'a', 'a**' },
              -- anchors
              { 'abc', '^a' }, { 'abc', '^b' }, { 'abc', 'c$' }, { 'abc', 'b$' }, { 'a$b', '$b' }, { 'a$b', 'a$b' },
              { 'a^b', 'a^b' }, { '^ab', '^^' }, { 'abc', '^' }, { 'abc', '$' }, { 'abab', '^ab', 2 },
              -- captures
              { 'hello world', '(o)(.)' }, { 'abc', '()b()' }, { 'abc', '()' }, { 'abc', '(a)(b)(c)' },
              { 'abc', '((a)(b))' }, { 'abc', '(a' }, { 'abc', 'a)' }, { 'abc', '(()a)' }, { 'a', '(.)%1' },
              { 'aa', '(.)%1' }, { 'abab', '(ab)%1' }, { 'abc', '%1' }, { 'abc', '(a%1)' }, { 'abc', '(a)%2' },
              { 'abc', '(a)%0' }, { 'abc', '()%1' }, { 'say "hi" or \'no\'', '(["\'])(.-)%1' },
              { 'x', '(((((((((((((((((((((((((((((((((x)))))))))))))))))))))))))))))))))' },
              { 'x', '((((((((((((((((((((((((((((((((x))))))))))))))))))))))))))))))))' },
              -- %b and %f
              { 'f(a(b)c)', '%b()' }, { 'f(a(b)c', '%b()' }, { '[[x]]', '%b[]' }, { '"a"b"', '%b""' }, { 'x', '%b' },
              { 'x', '%bx' }, { 'THE (quick) fox', '%f[%a]%a+', 5 }, { 'THE (quick) fox', '%f[%A]' },
              { 'hello', '%f[%l]' }, { 'hello', '%f[%z]' }, { 'hello', '%fx' }, { 'hello', '%f' }, { 'ab', '%f[^a]' },
              -- nesting deep enough to be "pattern too complex", and just short of it
              { string.rep('a', 300), string.rep('a?', 300) }, { string.rep('a', 150), string.rep('a?', 150) },
              { 'x', string.rep('(', 250) .. 'x' .. string.rep(')', 250) },
              -- malformed and misc errors
              { 'abc', '%' }, { 'abc', 'a%' }, { 'abc', '(()' }, { 'abc', '%g' }, { 'a.b.c', '%.(%a)' },
              -- backtracking that ends in failure and success
              { 'a,b,,c', '([^,]*),' }, { 'key=val;k2=v2', '(%w+)=(%w+)' }, { 'aaa', '(a*(.)%w(%s*))' },
              { 'one two  three', '%s*()' }, { 'abc', '.-(c)' }, { 'abc', '(.-)(.*)' },
              -- gsub's count, anchors, empty matches and replacement kinds
              { 'hello world', 'o', nil, gsub = '0', n = 1 }, { 'hello world', 'o', nil, gsub = '0', n = 0 },
              { 'hello world', 'o', nil, gsub = '0', n = -1 }, { 'hello world', '', nil, gsub = '-' },
              { 'abc', '%w*', nil, gsub = '-' }, { 'abc', '^a', nil, gsub = 'X' }, { 'aaa', '^a', nil, gsub = 'X' },
              { 'abc', 'b*', nil, gsub = '[%0]' }, { 'abc', '()', nil, gsub = '%1' }, { 'abc', '.', nil, gsub = true },
              { 'abc', '.', nil, gsub = 'x', n = 1.5 }, { 'abc', '(b)', nil, gsub = '%9' },
              { 'hello', 'l+', nil, gsub = { ll = 'LL' } }, { 'hello', '(h)(e)', nil, gsub = { h = 2 } },
              { 'abc', '.', nil, gsub = function(c) return c:upper() end },
              { 'abc', '()(.)', nil, gsub = function(p, c) return p end },
              { 'abc', '.', nil, gsub = function() return true end },
            }
            """#
        let (diffs, calls) = Self.differences(cases)
        #expect(diffs == "")
        #expect(calls > 1000)
    }

    /// Random short subjects and patterns from a small alphabet (a fixed seed, a bounded count):
    /// both implementations give the same results, or the same error.
    @Test func randomPatternsMatchAsLuasOwnDo() {
        let cases = #"""
            (function()
              local seed = 20261128
              local function random(n)
                seed = (seed * 1103515245 + 12345) % 2147483648
                return seed // 65536 % n + 1
              end
              local letters = { 'a', 'b', 'c', '(', ')', ' ', '-', '1', '.' }
              local atoms = { 'a', 'b', '.', '%a', '%d', '%s', '[ab]', '[^a]', '[a-c]', '(', ')', '()', '%1', '%2',
                '%b()', '%f[a]', '%f[%s]', '*', '+', '-', '?', '^', '$', 'c', '%(', '%', '[', ' ' }
              local cases = {}
              for i = 1, 1500 do
                local s = {}
                for j = 1, random(12) - 1 do s[j] = letters[random(#letters)] end
                local p = {}
                for j = 1, random(6) do p[j] = atoms[random(#atoms)] end
                cases[i] = { table.concat(s), table.concat(p), random(5) - 2 }
              end
              return cases
            end)()
            """#
        let (diffs, calls) = Self.differences(cases)
        #expect(diffs == "")
        #expect(calls > 10000)
    }
}
