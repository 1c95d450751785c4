/// The sandbox every state runs its script in, written in Lua because it wraps Lua functions
/// (a wrapper that raises must be Lua or C, never Swift: see Sources/CLua/shim.h).
///
/// The script's `_ENV` is an empty table whose metatable reads through to the exposed
/// globals: `base` without `dofile`, `loadfile`, `print`, `warn`, `collectgarbage`, `require`;
/// `string` (without `dump`), `table`, `math`, `utf8`, and `sluice`. No `io`, `os`, `package`,
/// `debug`, `coroutine`. Every library table the script can reach is a read-only proxy, so no
/// call can change what another call (of this policy or another sharing the state) sees:
///
/// - While the script's top level runs, global writes land in the globals table; `freeze`
///   then swaps the metatable for one whose `__newindex` raises "script writes global 'x'".
/// - `load` compiles text only (mode "t" forced) and runs the chunk in the frozen globals
///   unless given an environment of its own.
/// - `rawset`, `setmetatable` and `getmetatable` refuse or hide every read-only table;
///   `setmetatable` refuses a `__gc` metamethod (a finalizer would run Lua code outside any
///   call's budget); the string metatable is hidden (`getmetatable("")` is false).
///
/// The chunk takes the state's global table (where the libraries were opened) and the raw
/// `sluice` module; it returns the script's environment, `freeze()`, and `readonly(t)`, which
/// makes a deep read-only copy of a table (`ctx.config`).
enum LuaSandbox {
    static let prelude = """
        local G, sluice_module = ...
        local setmetatable, getmetatable, rawget, rawset, rawlen = G.setmetatable, G.getmetatable, G.rawget, G.rawset, G.rawlen
        local next, error, type, tostring, load = G.next, G.error, G.type, G.tostring, G.load
        local string = G.string
        local readonly_tables = setmetatable({}, { __mode = "k" })

        local function readonly(t, what)
          local proxy = {}
          setmetatable(proxy, {
            __index = t,
            __newindex = function(_, k) error(what .. " is read-only (writing '" .. tostring(k) .. "')", 2) end,
            __len = function() return rawlen(t) end,
            __pairs = function() return function(_, k) return next(t, k) end, proxy, nil end,
            __metatable = false,
          })
          readonly_tables[proxy] = true
          return proxy
        end

        local function deep_readonly(t, what)
          for k, v in next, t do
            if type(v) == "table" then t[k] = deep_readonly(v, what) end
          end
          return readonly(t, what)
        end

        string.dump = nil
        local string_metatable = getmetatable("")
        string_metatable.__metatable = false

        local B = {}
        for _, name in next, {
          "assert", "error", "ipairs", "next", "pairs", "pcall", "rawequal", "rawget", "rawlen",
          "select", "tonumber", "tostring", "type", "xpcall", "_VERSION",
        } do B[name] = G[name] end
        B.string = readonly(string, "string")
        B.table = readonly(G.table, "table")
        B.math = readonly(G.math, "math")
        B.utf8 = readonly(G.utf8, "utf8")
        B.sluice = deep_readonly(sluice_module, "sluice")

        local E = {}
        readonly_tables[E] = true
        B._G = E
        B.rawset = function(t, k, v)
          if readonly_tables[t] then error("rawset on a read-only table", 2) end
          return rawset(t, k, v)
        end
        B.getmetatable = function(v)
          if readonly_tables[v] then return false end
          return getmetatable(v)
        end
        B.setmetatable = function(t, mt)
          if readonly_tables[t] then error("cannot change the metatable of a read-only table", 2) end
          if type(mt) == "table" and rawget(mt, "__gc") ~= nil then error("__gc metamethods are not allowed", 2) end
          return setmetatable(t, mt)
        end
        B.load = function(chunk, name, _, env)
          if env == nil then env = E end
          return load(chunk, name, "t", env)
        end

        setmetatable(E, { __index = B, __newindex = B })
        local frozen = {
          __index = B,
          __newindex = function(_, k) error("script writes global '" .. tostring(k) .. "'", 2) end,
          __metatable = false,
        }
        local function freeze() setmetatable(E, frozen) end
        return E, freeze, function(t) return deep_readonly(t, "ctx.config") end
        """
}
