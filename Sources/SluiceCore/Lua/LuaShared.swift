import CLua
import Synchronization

/// `sluice.shared` (docs/scripting.md): a key-value table every script of this Sluice shares,
/// across workers — counters per API key, a value one request leaves for the next:
///
/// - `sluice.shared.get(key)`: the value (a string or a number), or nil.
/// - `sluice.shared.set(key, value, ttl)`: keeps `value` (a string or a number; nil removes the
///   key) for `ttl` seconds (nil: until Sluice stops). Returns true, or nil and a reason.
/// - `sluice.shared.incr(key, by, ttl)`: adds `by` (default 1) to the number under `key` (0
///   when absent or expired) and returns the sum; `ttl` applies when the key is made (a
///   counter's window). A key holding a string answers `nil, message`.
///
/// Bounded: `maxEntries` keys and `maxBytes` of keys and strings; a `set` or `incr` that would
/// pass either first drops expired keys, then fails (`nil, "sluice.shared is full"`). With a
/// fleet (`LuaHost.shared`), a hook that can wait keeps the table in the fleet's Redis instead.
///
/// Threading: `Sendable`; one `Mutex` around the table, held for one operation, never across
/// a Lua call. The functions run on their state's thread.
public final class LuaSharedMemory: Sendable {
    public enum Value: Sendable, Equatable {
        case string(String)
        case integer(Int)
        case number(Double)
    }

    fileprivate struct Entry {
        var value: Value
        /// Monotonic microseconds; nil: never.
        var expiry: Int64?
        var bytes: Int
    }

    fileprivate struct Table {
        var entries: [String: Entry] = [:]
        var bytes = 0
        /// No entry expires before this (it may be earlier than the earliest expiry left): a
        /// full table is swept for expired keys only once one may have expired, not on every
        /// write under the lock every worker's scripts wait on.
        var nextExpiry = Int64.max
    }

    /// `100000` keys.
    public static let maxEntries = 100_000
    /// `64 MiB` of keys and string values.
    public static let maxBytes = 64 << 20

    /// The process's table: every worker's scripts use it.
    public static let process = LuaSharedMemory()

    private let table = Mutex(Table())
    private let maxEntries: Int
    private let maxBytes: Int

    public init(maxEntries: Int = LuaSharedMemory.maxEntries, maxBytes: Int = LuaSharedMemory.maxBytes) {
        self.maxEntries = maxEntries
        self.maxBytes = maxBytes
    }

    public func get(_ key: String, now: Int64) -> Value? {
        table.withLock { t in
            guard let entry = t.entries[key] else { return nil }
            if let expiry = entry.expiry, expiry <= now {
                t.remove(key)
                return nil
            }
            return entry.value
        }
    }

    /// Keeps `value` (nil removes) for `ttl` microseconds (nil: no expiry); false when full.
    public func set(_ key: String, _ value: Value?, ttl: Int64?, now: Int64) -> Bool {
        table.withLock { t in
            guard let value else {
                t.remove(key)
                return true
            }
            return t.replace(
                key, Entry(value: value, expiry: ttl.map { now + $0 }, bytes: Self.size(key, value)),
                now: now, maxEntries: maxEntries, maxBytes: maxBytes)
        }
    }

    /// Why an operation failed (the script reads `nil, message`).
    public enum Failure: Error, Sendable, Equatable {
        case notANumber
        case full
        /// The fleet's Redis did not answer (or not sensibly).
        case unavailable(String)

        var message: String {
            switch self {
            case .notANumber: "sluice.shared: the key holds a string, not a number"
            case .full: "sluice.shared is full"
            case .unavailable(let why): "sluice.shared: " + why
            }
        }
    }

    /// Runs `operation`: the value read or made (nil for `set`, and for `get` of no key).
    public func perform(_ operation: LuaSharedOperation, now: Int64) -> Result<Value?, Failure> {
        switch operation {
        case .get(let key): return .success(get(key, now: now))
        case .set(let key, let value, let ttl): return set(key, value, ttl: ttl, now: now) ? .success(nil) : .failure(.full)
        case .incr(let key, let by, let ttl): return incr(key, by: by, ttl: ttl, now: now).map { $0 }
        }
    }

    /// Adds `by` to the number under `key`; `ttl` applies to a key this call makes.
    public func incr(_ key: String, by: Value, ttl: Int64?, now: Int64) -> Result<Value, Failure> {
        table.withLock { t in
            var current: Value = .integer(0)
            var expiry = ttl.map { now + $0 }
            if let entry = t.entries[key], entry.expiry.map({ $0 > now }) ?? true {
                current = entry.value
                expiry = entry.expiry
            }
            let sum: Value
            switch (current, by) {
            case (.integer(let a), .integer(let b)):
                let (s, overflow) = a.addingReportingOverflow(b)
                sum = overflow ? .number(Double(a) + Double(b)) : .integer(s)
            case (.integer(let a), .number(let b)): sum = .number(Double(a) + b)
            case (.number(let a), .integer(let b)): sum = .number(a + Double(b))
            case (.number(let a), .number(let b)): sum = .number(a + b)
            default: return .failure(.notANumber)
            }
            guard
                t.replace(
                    key, Entry(value: sum, expiry: expiry, bytes: Self.size(key, sum)), now: now,
                    maxEntries: maxEntries, maxBytes: maxBytes)
            else { return .failure(.full) }
            return .success(sum)
        }
    }

    /// How many keys are kept now (expired ones included until they are dropped).
    public var count: Int { table.withLock { $0.entries.count } }

    private static func size(_ key: String, _ value: Value) -> Int {
        if case .string(let s) = value { return key.utf8.count + s.utf8.count }
        return key.utf8.count + 8
    }
}

extension LuaSharedMemory.Table {
    fileprivate mutating func remove(_ key: String) {
        if let old = entries.removeValue(forKey: key) { bytes -= old.bytes }
    }

    /// Puts `entry` under `key` in place of what was there; false, the old entry kept, when the
    /// table has no room for it even once the expired keys are gone.
    fileprivate mutating func replace(
        _ key: String, _ entry: LuaSharedMemory.Entry, now: Int64, maxEntries: Int, maxBytes: Int
    ) -> Bool {
        func fits() -> Bool {
            // Read again each time: the sweep may have dropped the key itself.
            let old = entries[key]
            return entries.count - (old == nil ? 0 : 1) < maxEntries && bytes - (old?.bytes ?? 0) + entry.bytes <= maxBytes
        }
        if !fits() {
            guard now >= nextExpiry else { return false }
            sweep(now)
            guard fits() else { return false }
        }
        remove(key)
        entries[key] = entry
        bytes += entry.bytes
        if let expiry = entry.expiry, expiry < nextExpiry { nextExpiry = expiry }
        return true
    }

    /// Drops the expired keys, and learns when the next one expires.
    private mutating func sweep(_ now: Int64) {
        var next = Int64.max
        for (k, e) in entries {
            guard let expiry = e.expiry else { continue }
            if expiry <= now { remove(k) } else if expiry < next { next = expiry }
        }
        nextExpiry = next
    }
}

/// One `sluice.shared` operation; TTLs in microseconds.
public enum LuaSharedOperation: Sendable, Equatable {
    case get(String)
    case set(String, LuaSharedMemory.Value?, ttl: Int64?)
    case incr(String, by: LuaSharedMemory.Value, ttl: Int64?)
}

/// `sluice.shared` kept outside the process (the fleet's Redis): `completion` runs once, on
/// the worker's thread, within the store's timeout.
public protocol LuaSharedStore: AnyObject {
    func perform(
        _ operation: LuaSharedOperation, completion: @escaping (Result<LuaSharedMemory.Value?, LuaSharedMemory.Failure>) -> Void)
}

/// The Lua side of `sluice.shared` (see `LuaSharedMemory`): the process's table, or the
/// worker's `LuaHost.shared` store when the call can wait for it (`LuaWait`).
///
/// Threading: the state's thread (see `Lua` for the error discipline).
enum LuaShared {
    static let functions: [(String, Lua.Function)] = [("get", get), ("set", set), ("incr", incr)]

    private static let get: Lua.Function = { L in
        guard let key = Lua.bytes(L, 1) else { return Lua.badArgument(L, 1, "get", "string") }
        return perform(L, .get(stored(key)))
    }

    private static let set: Lua.Function = { L in
        guard let key = Lua.bytes(L, 1) else { return Lua.badArgument(L, 1, "set", "string") }
        let value: LuaSharedMemory.Value?
        if lua_type(L, 2) <= LUA_TNIL {  // nil or absent
            value = nil
        } else {
            guard let v = Self.value(L, 2) else { return Lua.badArgument(L, 2, "set", "string, number or nil") }
            value = v
        }
        guard let ttl = Self.ttl(L, 3) else { return Lua.badArgument(L, 3, "set", "seconds > 0 or nil") }
        return perform(L, .set(stored(key), value, ttl: ttl))
    }

    private static let incr: Lua.Function = { L in
        guard let key = Lua.bytes(L, 1) else { return Lua.badArgument(L, 1, "incr", "string") }
        var by = LuaSharedMemory.Value.integer(1)
        if lua_type(L, 2) > LUA_TNIL {  // neither nil nor absent
            guard lua_type(L, 2) == LUA_TNUMBER, let v = Self.value(L, 2) else {
                return Lua.badArgument(L, 2, "incr", "number")
            }
            by = v
        }
        guard let ttl = Self.ttl(L, 3) else { return Lua.badArgument(L, 3, "incr", "seconds > 0 or nil") }
        return perform(L, .incr(stored(key), by: by, ttl: ttl))
    }

    /// Runs `operation` on the fleet's store, waiting, when the call may wait and there is
    /// one; else on the process's table at once.
    private static func perform(_ L: OpaquePointer?, _ operation: LuaSharedOperation) -> Int32 {
        let state = LuaState.of(L)
        guard let wait = state.current?.wait, let store = wait.host.shared else {
            return push(operation, LuaSharedMemory.process.perform(operation, now: state.now), onto: L)
        }
        guard wait.phase == .running, lua_isyieldable(L) != 0 else {
            return Lua.fail(
                L,
                "sluice.shared cannot wait here for the fleet's Redis: it was called through a C function "
                    + "(a metamethod such as __tostring, a table.sort comparator, a string.gsub callback)")
        }
        return wait.suspend { deliver in
            store.perform(operation) { result in deliver { co in push(operation, result, onto: co) } }
            return Unstoppable()
        }
    }

    /// A Redis command cannot be called back: a call that ended first ignores its answer.
    private final class Unstoppable: LuaOperation {
        func cancel() {}
    }

    /// Pushes what the script gets: the value (`true` for `set`), or `nil, message`.
    private static func push(
        _ operation: LuaSharedOperation, _ result: Result<LuaSharedMemory.Value?, LuaSharedMemory.Failure>,
        onto L: OpaquePointer?
    ) -> Int32 {
        switch result {
        case .failure(let failure):
            lua_pushnil(L)
            Lua.push(L, failure.message)
            return 2
        case .success(let value):
            if case .set = operation {
                lua_pushboolean(L, 1)
                return 1
            }
            switch value {
            case nil: lua_pushnil(L)
            case .string(let s)?: pushStored(s, onto: L)
            case .integer(let i)?: lua_pushinteger(L, lua_Integer(i))
            case .number(let d)?: lua_pushnumber(L, d)
            }
            return 1
        }
    }

    private static func value(_ L: OpaquePointer?, _ index: Int32) -> LuaSharedMemory.Value? {
        switch lua_type(L, index) {
        case LUA_TSTRING: return Lua.bytes(L, index).map { .string(stored($0)) }
        case LUA_TNUMBER:
            if sluice_lua_isinteger(L, index) != 0 { return .integer(Int(sluice_lua_tointeger(L, index, nil))) }
            return .number(sluice_lua_tonumber(L, index, nil))
        default: return nil
        }
    }

    /// A Lua string (a key or a value) as the table keeps it: each byte one Unicode scalar
    /// (ISO-8859-1), ASCII as it is. Any bytes — a raw digest, text that is not UTF-8 — then come
    /// back as they were, two keys differ when their bytes do, and what the fleet's Redis holds
    /// is valid UTF-8. (Text in UTF-8 is kept byte by byte too: `é` is two scalars.)
    static func stored(_ bytes: UnsafeRawBufferPointer) -> String {
        guard bytes.contains(where: { $0 >= 0x80 }) else { return Lua.makeString(bytes) }
        var scalars = String.UnicodeScalarView()
        for b in bytes { scalars.append(Unicode.Scalar(b)) }
        return String(scalars)
    }

    /// Pushes a string `stored` made as the bytes it was made from. A scalar past U+00FF (a
    /// value another writer put in the fleet's Redis) goes as its UTF-8.
    private static func pushStored(_ s: String, onto L: OpaquePointer?) {
        if s.utf8.allSatisfy({ $0 < 0x80 }) { return Lua.push(L, s) }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(s.utf8.count)
        for scalar in s.unicodeScalars {
            if scalar.value <= 0xFF { bytes.append(UInt8(scalar.value)) } else { bytes += String(scalar).utf8 }
        }
        Lua.push(L, bytes: bytes)
    }

    /// The TTL argument in microseconds: `.some(nil)` when absent, nil when invalid.
    private static func ttl(_ L: OpaquePointer?, _ index: Int32) -> Int64?? {
        guard lua_type(L, index) > LUA_TNIL else { return .some(nil) }  // nil or absent
        var isNumber: Int32 = 0
        let seconds = sluice_lua_tonumber(L, index, &isNumber)
        guard isNumber != 0, seconds > 0, seconds < 1e9 else { return nil }
        return .some(Int64(seconds * 1_000_000))
    }
}
