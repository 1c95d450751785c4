import CLua
import HTTPTypes

#if canImport(Glibc)
    import Glibc
#endif

/// The Swift side of the Lua C API, for the functions Lua calls into Swift (`LuaState`'s
/// callbacks, the `sluice` module, the JSON codec). Every one of them runs inside the CLua
/// trampoline, so none may raise a Lua error: they push an error message and return
/// `Lua.failure` instead, and use only API calls that cannot raise (raw gets and sets, pushes;
/// the allocator does not refuse while Swift runs). See Sources/CLua/shim.h.
///
/// Threading: called on the thread of the state whose stack they touch.
enum Lua {
    typealias Function = @convention(c) (OpaquePointer?) -> Int32

    /// What a Swift function returns to have the trampoline raise the message it pushed.
    static let failure: Int32 = -1
    static let registry = sluice_lua_registryindex()

    static func upvalue(_ i: Int32) -> Int32 { sluice_lua_upvalueindex(i) }

    /// Pushes `message` and returns `failure` (the trampoline adds the caller's location).
    static func fail(_ L: OpaquePointer?, _ message: String) -> Int32 {
        push(L, message)
        return failure
    }

    /// Counts `bytes` Swift keeps for the running call (a header edit, a field of a
    /// `req:respond`) against the call's memory cap, with the state's own memory: the
    /// trampoline stops the call once both pass it (`sluice_lua_meter.external`).
    static func holdForCall(_ L: OpaquePointer?, _ bytes: Int) {
        sluice_lua_meter_of(L).pointee.external += bytes
    }

    /// Whether `bytes` more, kept by Swift for the running call, stay within its memory cap:
    /// for a function that builds something large before it returns (`json.encode`).
    static func fitsCall(_ L: OpaquePointer?, _ bytes: Int) -> Bool {
        let m = sluice_lua_meter_of(L).pointee
        return m.used + m.external + bytes <= m.limit
    }

    /// Marks the running call stopped by its memory cap and returns `failure` with the
    /// message the allocator's stop gives.
    static func failMemory(_ L: OpaquePointer?) -> Int32 {
        sluice_lua_meter_of(L).pointee.stopped = Int32(SLUICE_LUA_STOPPED_MEMORY)
        return fail(L, "memory limit reached")
    }

    static func push(_ L: OpaquePointer?, _ text: String) {
        var text = text
        _ = text.withUTF8 { lua_pushlstring(L, $0.baseAddress, $0.count) }
    }

    static func push(_ L: OpaquePointer?, bytes: some Collection<UInt8>) {
        if let done = bytes.withContiguousStorageIfAvailable({ lua_pushlstring(L, $0.baseAddress, $0.count) }) {
            _ = done
        } else {
            let copy = Array(bytes)
            copy.withUnsafeBufferPointer { _ = lua_pushlstring(L, $0.baseAddress, $0.count) }
        }
    }

    /// Pushes `f` (a Swift function) with the `extra` values on top of the stack as its
    /// upvalues 2….
    static func push(_ L: OpaquePointer?, function f: Function, upvalues extra: Int32 = 0) {
        sluice_lua_push_swift(L, f, extra)
    }

    /// The bytes of the string at `index` (a number is not a string here), valid while the
    /// value stays on the stack.
    static func bytes(_ L: OpaquePointer?, _ index: Int32) -> UnsafeRawBufferPointer? {
        guard lua_type(L, index) == LUA_TSTRING else { return nil }
        var length = 0
        guard let p = sluice_lua_tolstring(L, index, &length) else { return nil }
        return UnsafeRawBufferPointer(start: p, count: length)
    }

    /// The string at `index`, or a number's decimal form (converted in place, as Lua does for
    /// arguments); nil for any other type.
    static func text(_ L: OpaquePointer?, _ index: Int32) -> UnsafeRawBufferPointer? {
        let type = lua_type(L, index)
        guard type == LUA_TSTRING || type == LUA_TNUMBER else { return nil }
        var length = 0
        guard let p = sluice_lua_tolstring(L, index, &length) else { return nil }
        return UnsafeRawBufferPointer(start: p, count: length)
    }

    /// A `String` of UTF-8 `bytes` (invalid sequences repaired), through the typed-buffer path
    /// (a raw buffer goes through the unspecialized generic decoder).
    @inline(__always)
    static func makeString(_ bytes: UnsafeRawBufferPointer) -> String {
        String(decoding: bytes.assumingMemoryBound(to: UInt8.self), as: UTF8.self)
    }

    static func string(_ L: OpaquePointer?, _ index: Int32) -> String? {
        text(L, index).map { Lua.makeString($0) }
    }

    /// The first `limit` bytes of `bytes` as text, with `…` when there were more: the bytes past
    /// the limit are not copied.
    static func prefix(_ bytes: UnsafeRawBufferPointer, _ limit: Int) -> String {
        guard bytes.count > limit else { return makeString(bytes) }
        return makeString(UnsafeRawBufferPointer(rebasing: bytes[0..<limit])) + "…"
    }

    static func integer(_ L: OpaquePointer?, _ index: Int32) -> Int? {
        var isNumber: Int32 = 0
        let value = sluice_lua_tointeger(L, index, &isNumber)
        return isNumber != 0 ? Int(value) : nil
    }

    static func typeName(_ L: OpaquePointer?, _ index: Int32) -> String {
        String(cString: lua_typename(L, lua_type(L, index)))
    }

    /// "argument #2 to 'set' (string expected, got table)", Lua's own wording.
    static func badArgument(_ L: OpaquePointer?, _ n: Int32, _ function: StaticString, _ expected: String) -> Int32 {
        fail(L, "bad argument #\(n) to '\(function)' (\(expected) expected, got \(typeName(L, n)))")
    }

    /// A value's text for a message: printable ASCII kept, anything else as `\xNN`, so an error
    /// or a log line quoting a script's bad header cannot itself carry a line break.
    static func printable(_ bytes: UnsafeRawBufferPointer, limit: Int = 64) -> String {
        var out = ""
        for b in bytes.prefix(limit) {
            if b >= 0x20 && b < 0x7F && b != UInt8(ascii: "\\") {
                out.unicodeScalars.append(Unicode.Scalar(b))
            } else {
                out += "\\x" + Hex.lowercase([b])
            }
        }
        if bytes.count > limit { out += "…" }
        return out
    }

    static func equals(_ bytes: UnsafeRawBufferPointer, _ literal: StaticString) -> Bool {
        bytes.count == literal.utf8CodeUnitCount
            && (bytes.count == 0 || memcmp(bytes.baseAddress!, literal.utf8Start, bytes.count) == 0)
    }

    /// Sets every key of the table at `index` to nil (raw).
    static func clear(_ L: OpaquePointer?, _ index: Int32) {
        lua_pushnil(L)
        while lua_next(L, index) != 0 {
            sluice_lua_pop(L, 1)
            lua_pushvalue(L, -1)
            lua_pushnil(L)
            lua_rawset(L, index)
        }
    }

    /// Pushes `value` as plain Lua tables (not read-only: the caller freezes them).
    static func push(_ L: OpaquePointer?, value: LuaValue) {
        switch value {
        case .bool(let b): lua_pushboolean(L, b ? 1 : 0)
        case .integer(let i): lua_pushinteger(L, lua_Integer(i))
        case .number(let d): lua_pushnumber(L, d)
        case .string(let s): push(L, s)
        case .array(let items):
            lua_createtable(L, Int32(clamping: items.count), 0)
            for (i, item) in items.enumerated() {
                push(L, value: item)
                lua_rawseti(L, -2, lua_Integer(i + 1))
            }
        case .table(let fields):
            lua_createtable(L, 0, Int32(clamping: fields.count))
            for (key, item) in fields {
                push(L, key)
                push(L, value: item)
                lua_rawset(L, -3)
            }
        }
    }

    /// The value at `index` as a `LuaValue`: strings, numbers, booleans, and tables of them
    /// (sequences as arrays), `depth` levels deep; nil for anything else (functions, userdata,
    /// nil), which a table then leaves out. Raw reads only: no metamethod runs.
    ///
    /// At most `budget` bytes are made (each value and each key counts 16, a string value or
    /// key its length more): a script's table may hold one long string many times,
    /// as a value or as the key of many tables, or share a table at every level, and is small
    /// in the state's memory but not as copies. What goes past the budget is left out
    /// (`budget` is then negative).
    static func value(_ L: OpaquePointer?, _ index: Int32, depth: Int = 16, budget: inout Int) -> LuaValue? {
        budget -= 16
        guard budget >= 0 else { return nil }
        let index = lua_absindex(L, index)
        switch lua_type(L, index) {
        case LUA_TBOOLEAN: return .bool(lua_toboolean(L, index) != 0)
        case LUA_TNUMBER:
            if sluice_lua_isinteger(L, index) != 0 { return .integer(integer(L, index) ?? 0) }
            var isNumber: Int32 = 0
            return .number(sluice_lua_tonumber(L, index, &isNumber))
        case LUA_TSTRING:
            budget -= Int(lua_rawlen(L, index))
            guard budget >= 0 else { return nil }
            return string(L, index).map { .string($0) }
        case LUA_TTABLE:
            guard depth > 0 else { return nil }
            let length = Int(lua_rawlen(L, index))
            // A sequence (keys exactly 1...length) becomes an array, anything else a table of
            // its string keys and its integer keys within 1...length. Which, is learned first
            // without converting anything (each key scanned counts against the budget, and is
            // given back unless the budget ran out: a key is charged by the pass that copies
            // it, or walks past it): every value is converted once, however deep the nesting.
            var isSequence = length > 0
            if isSequence {
                var count = 0
                lua_pushnil(L)
                while lua_next(L, index) != 0 {
                    sluice_lua_pop(L, 1)
                    count += 1
                    budget -= 16
                    let inRange =
                        lua_type(L, -1) == LUA_TNUMBER && sluice_lua_isinteger(L, -1) != 0
                        && (integer(L, -1).map { $0 >= 1 && $0 <= length } ?? false)
                    if !inRange || count > length || budget < 0 {
                        isSequence = false
                        sluice_lua_pop(L, 1)
                        break
                    }
                }
                isSequence = isSequence && count == length
                if budget >= 0 { budget += 16 * count }
            }
            if isSequence {
                var array: [LuaValue] = []
                array.reserveCapacity(length)
                for i in 1...length {
                    lua_rawgeti(L, index, lua_Integer(i))
                    if let item = value(L, -1, depth: depth - 1, budget: &budget) { array.append(item) }
                    sluice_lua_pop(L, 1)
                    if budget < 0 { break }
                }
                return .array(array)
            }
            var table: [String: LuaValue] = [:]
            lua_pushnil(L)
            while lua_next(L, index) != 0 {
                // Every key is charged, one left out as well (walking past many of them, in a
                // table named many times, is work); a string key's bytes before they are
                // copied, as a string value's.
                budget -= 16
                guard budget >= 0 else {
                    sluice_lua_pop(L, 2)
                    break
                }
                if lua_type(L, -2) == LUA_TNUMBER, sluice_lua_isinteger(L, -2) != 0, let i = integer(L, -2), i >= 1, i <= length {
                    if let item = value(L, -1, depth: depth - 1, budget: &budget) { table[String(i)] = item }
                } else if lua_type(L, -2) == LUA_TSTRING {
                    budget -= Int(lua_rawlen(L, -2))
                    if budget >= 0, let key = string(L, -2), let item = value(L, -1, depth: depth - 1, budget: &budget) {
                        table[key] = item
                    }
                }
                sluice_lua_pop(L, 1)
            }
            return .table(table)
        default: return nil
        }
    }
}

/// The header names a state's scripts used last, by their bytes: making an `HTTPField.Name`
/// (a `String`, a token check, lower-casing) costs more than the rest of a `get` or `set`.
///
/// Threading: its state's thread.
struct LuaHeaderNames {
    private var keys: [[UInt8]] = []
    private var names: [HTTPField.Name] = []
    private var next = 0
    static let capacity = 16
    /// The longest name kept: a script may name a long one once (a `remove` of a name no
    /// field has costs nothing else), and the cache lives as long as the state.
    static let longestKept = 64

    func name(for bytes: UnsafeRawBufferPointer) -> HTTPField.Name? {
        for i in keys.indices {
            let found = keys[i].withUnsafeBytes { key in
                key.count == bytes.count && (key.count == 0 || memcmp(key.baseAddress!, bytes.baseAddress!, key.count) == 0)
            }
            if found { return names[i] }
        }
        return nil
    }

    /// Keeps `bytes` (copied, when not longer than `longestKept`) as naming `name`.
    mutating func insert(_ bytes: UnsafeRawBufferPointer, _ name: HTTPField.Name) {
        guard bytes.count <= Self.longestKept else { return }
        let key = Array(bytes)
        if keys.count < Self.capacity {
            keys.append(key)
            names.append(name)
        } else {
            keys[next] = key
            names[next] = name
            next = (next + 1) % Self.capacity
        }
    }
}
