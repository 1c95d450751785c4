import CLua
import CoreMetrics

/// `sluice.metric(name)`: a Prometheus counter the script names, served as
/// `sluice_lua_metric_total{script, name}` (docs/metrics.md); `m:inc()` adds 1, `m:inc(n)`
/// adds a non-negative integer `n`.
///
/// Names are `[a-z_][a-z0-9_]*`. A literal name in the script (`sluice.metric("hits")`) is
/// checked when the script loads (`LuaBytecode.metricNames`), as is any counter the top level
/// makes; a name computed at run time is checked by the call, which fails. A script (by name,
/// across the process) has at most `maxNamesPerScript` names: the next new one fails, so a
/// script cannot grow the exposition without bound.
///
/// The counter is a full userdata holding the index of its handle in the state's
/// `LuaCounters`; its metatable (`sluice.metric` in the registry) is hidden from the script.
///
/// Threading: the state's thread (see `Lua` for the error discipline).
enum LuaMetricAPI {
    /// At most `64` distinct names per script.
    static let maxNamesPerScript = 64

    private static let metatableName = "sluice.metric"

    /// Sets `metric` on the module table on top of `L`, and makes the counters' metatable.
    static func install(_ L: OpaquePointer) {
        Lua.push(L, function: metric)
        lua_setfield(L, -2, "metric")
        _ = luaL_newmetatable(L, metatableName)
        lua_createtable(L, 0, 1)
        Lua.push(L, function: increment)
        lua_setfield(L, -2, "inc")
        lua_setfield(L, -2, "__index")
        lua_pushboolean(L, 0)
        lua_setfield(L, -2, "__metatable")
        sluice_lua_pop(L, 1)
    }

    /// The longest metric name: names are kept for the process's life and written on every
    /// scrape.
    static let maxNameLength = 128

    /// Whether `name` is `[a-z_][a-z0-9_]*` of at most `maxNameLength` bytes.
    static func isValidName(_ name: some Collection<UInt8>) -> Bool {
        guard name.count <= maxNameLength, let first = name.first,
            first == UInt8(ascii: "_") || (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(first)
        else { return false }
        return name.allSatisfy {
            $0 == UInt8(ascii: "_") || (UInt8(ascii: "a")...UInt8(ascii: "z")).contains($0)
                || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0)
        }
    }

    static func invalidNameMessage(_ name: String) -> String {
        "metric name '\(name)' is not [a-z_][a-z0-9_]* of at most \(maxNameLength) characters"
    }

    private static let metric: Lua.Function = { L in
        guard let bytes = Lua.bytes(L, 1) else { return Lua.badArgument(L, 1, "metric", "string") }
        guard isValidName(bytes) else { return Lua.fail(L, invalidNameMessage(Lua.printable(bytes))) }
        let state = LuaState.of(L)
        let name = Lua.makeString(bytes)
        guard let index = state.counters.index(script: state.script.name, name: name) else {
            return Lua.fail(L, "\(state.script.name) has \(maxNamesPerScript) metric names already; '\(name)' is one too many")
        }
        // Eight bytes, as a message's handle (`LuaMessageAPI.Handle`): a counter passed where a
        // `req` is expected is read whole, and refused by its slot index of -1.
        let payload = sluice_lua_newuserdata(L, 2 * MemoryLayout<Int32>.size, 0)!
        payload.storeBytes(of: -1, as: Int32.self)
        payload.storeBytes(of: index, toByteOffset: MemoryLayout<Int32>.size, as: Int32.self)
        luaL_setmetatable(L, metatableName)
        return 1
    }

    private static let increment: Lua.Function = { L in
        guard let counter = luaL_testudata(L, 1, metatableName) else {
            return Lua.badArgument(L, 1, "inc", "sluice.metric")
        }
        var by = 1
        if lua_type(L, 2) > LUA_TNIL {
            // At most 2^32 a call: the counter is a 64-bit integer, and a few calls of
            // `math.maxinteger` would wrap it negative (Prometheus would read a reset).
            guard sluice_lua_isinteger(L, 2) != 0, let n = Lua.integer(L, 2), n >= 0, n <= 1 << 32 else {
                return Lua.fail(L, "bad argument #1 to 'inc' (an integer from 0 to 4294967296 expected)")
            }
            by = n
        }
        LuaState.of(L).counters.handles[Int(counter.load(fromByteOffset: MemoryLayout<Int32>.size, as: Int32.self))].increment(
            by: Int64(by))
        return 0
    }
}

/// A state's counters (`sluice.metric`): the handles made so far, and their indices by name.
///
/// Threading: the state's thread.
struct LuaCounters {
    private(set) var handles: [CoreMetrics.Counter] = []
    private var indices: [String: Int32] = [:]

    /// The index of `name`'s handle, made on its first use; nil when the script has its
    /// `LuaMetricAPI.maxNamesPerScript` names already.
    mutating func index(script: String, name: String) -> Int32? {
        if let index = indices[name] { return index }
        guard let handle = SluiceMetrics.shared.luaCounter(script: script, name: name) else { return nil }
        let index = Int32(handles.count)
        handles.append(handle)
        indices[name] = index
        return index
    }
}
