import CLua

#if canImport(Glibc)
    import Glibc
#endif

/// The `sluice` module's pure functions (the sandbox makes the table read-only):
///
/// - `sluice.sha256(s)`, `sluice.hmac_sha256(key, s)`: the 32-byte digest, raw (encode it with
///   `sluice.hex.encode` or `sluice.base64.encode`). SluiceCore's `Crypto`.
/// - `sluice.base64.encode(s)`, `.decode(s)` (standard alphabet; nil, reason for bad input).
/// - `sluice.hex.encode(s)` (lower case), `.decode(s)` (nil, reason for bad input).
/// - `sluice.json.encode(v)`, `.decode(s)`, `sluice.json.null` (`LuaJSON`).
/// - `sluice.now()`: seconds since the Unix epoch, with microseconds (the injected clock).
/// - `sluice.http{…}`: a sub-request the calling hook waits for (`LuaHTTP`).
/// - `sluice.shared.get/set/incr`: the process's shared table (`LuaShared`).
/// - `sluice.log.info(...)`, `.warn`, `.error`: one line to the state's log sink, with the
///   script's name, the calling line and the exchange's request id.
/// - `sluice.metric(name)`: a counter (`LuaMetricAPI`).
///
/// Threading: the state's thread (see `Lua` for the error discipline).
enum LuaModule {
    /// Pushes the module as a plain table (the sandbox freezes it).
    static func push(_ L: OpaquePointer) {
        lua_createtable(L, 0, 8)
        set(L, "sha256", sha256)
        set(L, "hmac_sha256", hmacSHA256)
        set(L, "now", now)
        set(L, "http", LuaHTTP.request)
        table(L, "base64", [("encode", base64Encode), ("decode", base64Decode)])
        table(L, "hex", [("encode", hexEncode), ("decode", hexDecode)])
        table(L, "json", [("encode", LuaJSON.encode), ("decode", LuaJSON.decode)])
        lua_getfield(L, -1, "json")
        lua_pushlightuserdata(L, nil)
        lua_setfield(L, -2, "null")
        sluice_lua_pop(L, 1)
        // A log call reads at most `maxLogMessage` bytes of its arguments: not charged by them.
        table(L, "log", [("info", logInfo), ("warn", logWarn), ("error", logError)], bulk: false)
        LuaMetricAPI.install(L)
        table(L, "shared", LuaShared.functions)
    }

    /// The module's functions read the wall clock, and are charged by their string arguments,
    /// before they run (`sluice_lua_trampoline_bulk`): a loop hashing a large string a few
    /// instructions a call cannot run past the wall-clock budget between two count hooks.
    private static func set(_ L: OpaquePointer, _ name: String, _ f: Lua.Function, bulk: Bool = true) {
        if bulk { sluice_lua_push_swift_bulk(L, f) } else { Lua.push(L, function: f) }
        lua_setfield(L, -2, name)
    }

    private static func table(
        _ L: OpaquePointer, _ name: String, _ functions: [(String, Lua.Function)], bulk: Bool = true
    ) {
        lua_createtable(L, 0, Int32(functions.count))
        for (key, f) in functions { set(L, key, f, bulk: bulk) }
        lua_setfield(L, -2, name)
    }

    private static let sha256: Lua.Function = { L in
        guard let data = Lua.text(L, 1) else { return Lua.badArgument(L, 1, "sha256", "string") }
        Lua.push(L, bytes: Crypto.sha256(data))
        return 1
    }

    private static let hmacSHA256: Lua.Function = { L in
        guard let key = Lua.text(L, 1) else { return Lua.badArgument(L, 1, "hmac_sha256", "string") }
        guard let data = Lua.text(L, 2) else { return Lua.badArgument(L, 2, "hmac_sha256", "string") }
        Lua.push(L, bytes: Crypto.HMACKey(Array(key)).mac(data))
        return 1
    }

    private static let now: Lua.Function = { L in
        let state = LuaState.of(L)
        let microseconds: Int64
        if let epoch = state.clock.epoch {
            microseconds = epoch()
        } else {
            var ts = timespec()
            clock_gettime(CLOCK_REALTIME, &ts)
            microseconds = Int64(ts.tv_sec) * 1_000_000 + Int64(ts.tv_nsec / 1000)
        }
        lua_pushnumber(L, Double(microseconds) / 1_000_000)
        return 1
    }

    private static let base64Encode: Lua.Function = { L in
        guard let data = Lua.text(L, 1) else { return Lua.badArgument(L, 1, "encode", "string") }
        Lua.push(L, Base64.encode(Array(data)))
        return 1
    }

    private static let base64Decode: Lua.Function = { L in
        guard let text = Lua.bytes(L, 1) else { return Lua.badArgument(L, 1, "decode", "string") }
        guard let bytes = Base64.decode(Lua.makeString(text)) else {
            lua_pushnil(L)
            Lua.push(L, "invalid base64")
            return 2
        }
        Lua.push(L, bytes: bytes)
        return 1
    }

    private static let hexEncode: Lua.Function = { L in
        guard let data = Lua.text(L, 1) else { return Lua.badArgument(L, 1, "encode", "string") }
        Lua.push(L, Hex.lowercase(data))
        return 1
    }

    private static let hexDecode: Lua.Function = { L in
        guard let text = Lua.bytes(L, 1) else { return Lua.badArgument(L, 1, "decode", "string") }
        func digit(_ c: UInt8) -> UInt8? {
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): c - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): c - UInt8(ascii: "A") + 10
            default: nil
            }
        }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(text.count / 2)
        var i = 0
        while i + 1 < text.count, let high = digit(text[i]), let low = digit(text[i + 1]) {
            bytes.append(high << 4 | low)
            i += 2
        }
        guard i == text.count else {
            lua_pushnil(L)
            Lua.push(L, "invalid hex")
            return 2
        }
        Lua.push(L, bytes: bytes)
        return 1
    }

    private static let logInfo: Lua.Function = { L in log(L, .info) }
    private static let logWarn: Lua.Function = { L in log(L, .warn) }
    private static let logError: Lua.Function = { L in log(L, .error) }

    /// The longest message a `sluice.log` line carries, in bytes (the rest is cut).
    static let maxLogMessage = 8 * 1024

    /// Joins the arguments with spaces (strings and numbers as they are, other values by type:
    /// no `__tostring` runs) and hands the line to the state's sink.
    private static func log(_ L: OpaquePointer?, _ level: LuaLogLine.Level) -> Int32 {
        let state = LuaState.of(L)
        let redactor = LuaStateCache.current.redactor
        // A log line, not a dump: what passes `maxLogMessage` bytes is cut (and the arguments
        // after it are not read) — after the secrets are redacted, so that the cut never
        // leaves part of one: the text is read as far as the longest secret reaches past it.
        let reach = maxLogMessage + 1 + redactor.longestSecretBytes
        var message: [UInt8] = []
        let top = lua_gettop(L)
        var i: Int32 = 1
        while i <= top && message.count < reach {
            if i > 1 { message.append(0x20) }
            switch lua_type(L, i) {
            case LUA_TSTRING, LUA_TNUMBER:
                // Only what the line still has room for is copied.
                if let text = Lua.text(L, i) { message += text.prefix(max(0, reach - message.count)) }
            case LUA_TBOOLEAN: message += (lua_toboolean(L, i) != 0 ? "true" : "false").utf8
            default: message += Lua.typeName(L, i).utf8
            }
            i += 1
        }
        let text = message.withUnsafeBytes { redactor.redactedPrefix($0, maxLogMessage) }
        var info = lua_Debug()
        var line = 0
        if lua_getstack(L, 1, &info) != 0, lua_getinfo(L, "Sl", &info) != 0 { line = Int(max(0, info.currentline)) }
        state.log(
            LuaLogLine(
                level: level, script: state.script.name, line: line, requestID: state.current?.requestID ?? 0,
                message: text))
        return 0
    }
}
