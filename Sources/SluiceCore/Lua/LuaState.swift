import CLua
import Synchronization

/// One Lua state: one script compiled once, run by every policy of one worker that uses it
/// (`LuaStateCache` keys states by the script's name and content hash, and the memory cap). Each hook
/// call runs as a coroutine of the state, so that a later `sluice.http` can yield it.
///
/// The state is sandboxed (`LuaSandbox`), metered (`Sources/CLua/shim.h`: an allocator that
/// refuses past `limits.memory`, a count hook that stops a call at its instruction or
/// wall-clock budget) and frozen after the script's top level ran: globals cannot be written,
/// so per-request data lives in `ctx`. A call stopped by a limit poisons the state
/// (`isPoisoned`); the cache builds a fresh one on the next use.
///
/// Threading: confined to the worker thread that made it, like everything a request touches;
/// not `Sendable`. Lua calls back into Swift only on that thread, from inside `lua_resume`.
/// Fields touched on every call skip the runtime's exclusivity checks (`LuaCallSlot` says why).
public final class LuaState {
    public let script: LuaScript
    /// The state's heap cap (`limits.memory` of the policy that made it).
    public let memoryLimit: Int
    /// Set when a limit stopped a call: its heap may be at the cap and its script's own data
    /// (upvalues) half made, so the state takes no new exchange; the calls waiting in it
    /// (`sluice.http`) go on to their end, each under its own budgets, and an exchange that
    /// began in it runs its later hooks there (its `ctx` is there).
    @exclusivity(unchecked) public internal(set) var isPoisoned = false

    let L: OpaquePointer
    let meter: UnsafeMutablePointer<sluice_lua_meter>
    let clock: LuaClock
    let log: (LuaLogLine) -> Void

    /// A hook function (a registry reference) and whether it declares the `ctx` parameter and
    /// may use it (`LuaBytecode.mayUse`): a hook that does not is not given one, and no `ctx`
    /// table is made for it.
    struct Hook {
        var ref: Int32
        var takesContext: Bool
    }
    @exclusivity(unchecked) private(set) var onRequestHook: Hook?
    @exclusivity(unchecked) private(set) var onResponseHook: Hook?
    @exclusivity(unchecked) private(set) var onLogHook: Hook?
    public var hasOnRequest: Bool { onRequestHook != nil }
    public var hasOnResponse: Bool { onResponseHook != nil }
    public var hasOnLog: Bool { onLogHook != nil }
    /// The table's `every_try = true`: the script asks to run before every try, as the YAML
    /// key `every_try` does (a signer says so itself).
    public private(set) var declaresEveryTry = false
    /// The hooks the script's table defines.
    public var hooks: LuaHooks {
        var hooks: LuaHooks = []
        if hasOnRequest { hooks.insert(.onRequest) }
        if hasOnResponse { hooks.insert(.onResponse) }
        if hasOnLog { hooks.insert(.onLog) }
        return hooks
    }

    // Registry references made at load.
    private var environmentRef = LUA_NOREF
    private var readonlyRef = LUA_NOREF
    var requestMethodsRef = LUA_NOREF
    var responseMethodsRef = LUA_NOREF
    var headersMetaRef = LUA_NOREF

    /// Every call slot made, by index (a userdata names its slot by index); `idle` are the ones
    /// no call uses.
    @exclusivity(unchecked) var slots: [LuaCallSlot] = []
    @exclusivity(unchecked) private var idle: [LuaCallSlot] = []
    /// Indexes of retired slots (`retire`), for the next slots made.
    private var vacant: [Int32] = []
    private var retiredSinceCollection = 0
    /// The slot whose coroutine is running (for `sluice.log`'s request id).
    @exclusivity(unchecked) var current: LuaCallSlot?
    /// The script's `sluice.metric` counters (`LuaMetricAPI`).
    @exclusivity(unchecked) var counters = LuaCounters()
    /// Header names recently used by the script (`LuaMessageAPI`).
    @exclusivity(unchecked) var headerNames = LuaHeaderNames()
    /// `ctx.config` tables already built, by the `LuaConfig` they came from.
    private var configs: [ObjectIdentifier: ConfigEntry] = [:]
    /// The same tables by content: policies whose `config` is the same (each has its own
    /// `LuaConfig`) share one frozen table, so a hundred policies running one script with one
    /// `config` cost the state what one does. A table is released once no live config uses it.
    private var configTables: [[String: LuaValue]: Int32] = [:]
    /// The config `pushConfig` served last, held with its table: one policy's exchanges find
    /// it without a dictionary lookup or a weak load.
    @exclusivity(unchecked) private var lastConfig: (config: LuaConfig, ref: Int32)?
    /// `ctx` tables of ended exchanges, emptied, for the next ones.
    @exclusivity(unchecked) private var idleContexts: [Int32] = []
    private struct ConfigEntry {
        weak var config: LuaConfig?
        var ref: Int32
    }

    /// Builds the state and runs the script's top level, under `limits` (its instruction and
    /// wall-clock budgets bound the top level as they bound a call).
    public static func load(
        _ script: LuaScript, limits: LuaLimits = .default, clock: LuaClock = .system,
        log: @escaping (LuaLogLine) -> Void = { _ in }
    ) throws(LuaLoadError) -> LuaState {
        let state = LuaState(script: script, limits: limits, clock: clock, log: log)
        try state.prepare(limits: limits)
        state.reportMemory(force: true)
        return state
    }

    /// States alive in the process, every worker's (`sluice_lua_states`): one per script per
    /// worker once old ones are dropped after a reload (`LuaStateCache.retain`).
    public static var alive: Int { aliveCount.load(ordering: .relaxed) }
    private static let aliveCount = Atomic<Int>(0)

    /// Bytes the states' allocators hold, every worker's (`sluice_lua_memory_bytes`): what
    /// `limits.memory` caps, summed, each state's as reported after its load and after the
    /// last call that moved it by `memoryReportStep` or more. Read by any thread (the admin's).
    public static var memory: Int { memoryCount.load(ordering: .relaxed) }
    private static let memoryCount = Atomic<Int>(0)
    /// How far a state's count moves before a call reports it: a script that allocates on every
    /// call would otherwise add to the one shared counter on every call of every worker.
    static let memoryReportStep = 16 * 1024
    /// This state's share of `memoryCount` (its allocator's count when last reported). Owned by
    /// the state's thread; `deinit` takes it back.
    @exclusivity(unchecked) private(set) var reportedMemory = 0

    /// Brings `memoryCount` up to this state's allocator count: after the load (`force`) and
    /// after a call that moved it by `memoryReportStep` or more.
    private func reportMemory(force: Bool = false) {
        let change = Int(meter.pointee.used) - reportedMemory
        guard force ? change != 0 : abs(change) >= Self.memoryReportStep else { return }
        Self.memoryCount.add(change, ordering: .relaxed)
        reportedMemory += change
    }

    private init(script: LuaScript, limits: LuaLimits, clock: LuaClock, log: @escaping (LuaLogLine) -> Void) {
        Self.aliveCount.add(1, ordering: .relaxed)
        self.script = script
        self.memoryLimit = limits.memory
        self.clock = clock
        self.log = log
        meter = .allocate(capacity: 1)
        meter.initialize(to: sluice_lua_meter())
        meter.pointee.limit = limits.memory
        // Swift holds the state: the allocator never refuses while `grace` > 0 (shim.h).
        meter.pointee.grace = 1
        guard let L = sluice_lua_newstate(meter) else { fatalError("lua_newstate: out of memory") }
        self.L = L
        meter.pointee.owner = Unmanaged.passUnretained(self).toOpaque()
        if clock.monotonic != nil {
            meter.pointee.clock = { context in
                Unmanaged<LuaState>.fromOpaque(context!).takeUnretainedValue().clock.monotonic!()
            }
            meter.pointee.clock_context = meter.pointee.owner
        }
    }

    deinit {
        lua_close(L)
        meter.deallocate()
        Self.aliveCount.subtract(1, ordering: .relaxed)
        Self.memoryCount.subtract(reportedMemory, ordering: .relaxed)
    }

    /// The state for Swift callbacks: the owner recorded in the meter of `L` (any thread of it).
    static func of(_ L: OpaquePointer?) -> LuaState {
        Unmanaged<LuaState>.fromOpaque(sluice_lua_meter_of(L).pointee.owner).takeUnretainedValue()
    }

    /// Microseconds on the injected monotonic clock.
    var now: Int64 { sluice_lua_now_us(meter) }

    // MARK: Loading

    private func prepare(limits: LuaLimits) throws(LuaLoadError) {
        for (name, open) in [
            ("_G", luaopen_base), ("string", luaopen_string), ("table", luaopen_table), ("math", luaopen_math),
            ("utf8", luaopen_utf8),
        ] as [(String, Lua.Function)] {
            luaL_requiref(L, name, open, 1)
            if name == "string" { sluice_lua_meter_patterns(L) }
            sluice_lua_meter_loops(L, name)
            sluice_lua_pop(L, 1)
        }
        // The sandbox: trusted code, run on the main thread without a budget.
        let prelude = LuaSandbox.prelude
        guard loadChunk(prelude, name: "=sandbox") == LUA_OK else { fatalError("sandbox: \(Lua.string(L, -1) ?? "")") }
        lua_rawgeti(L, Lua.registry, lua_Integer(sluice_lua_ridx_globals()))
        LuaModule.push(L)
        guard sluice_lua_pcall(L, 2, 3) == LUA_OK else { fatalError("sandbox: \(Lua.string(L, -1) ?? "")") }
        readonlyRef = luaL_ref(L, Lua.registry)
        let freezeRef = luaL_ref(L, Lua.registry)
        environmentRef = luaL_ref(L, Lua.registry)
        LuaMessageAPI.makeMetatables(self)

        // The script, in the sandbox's environment, as a coroutine under the budgets.
        guard loadChunk(script.source, name: "=" + script.name) == LUA_OK else {
            throw LuaLoadError(script: script.name, message: Lua.string(L, -1) ?? "\(script.name): cannot load")
        }
        try refuseHookGlobalWrites()
        lua_rawgeti(L, Lua.registry, lua_Integer(environmentRef))
        _ = lua_setupvalue(L, -2, 1)
        let co = lua_newthread(L)!
        sluice_lua_insert(L, -2)
        lua_xmove(L, co, 1)
        var result = LuaCallResult()
        let status = run(co, arguments: 0, limits: limits, into: &result)
        defer { lua_settop(L, 0) }
        if let message = result.errorMessage { throw LuaLoadError(script: script.name, message: message) }
        guard status == LUA_OK, lua_gettop(co) >= 1, lua_type(co, 1) == LUA_TTABLE else {
            throw LuaLoadError(
                script: script.name,
                message: "\(script.name): the script must return a table of hooks (on_request, on_response, on_log)")
        }
        try readHooks(co)
        lua_rawgeti(L, Lua.registry, lua_Integer(freezeRef))
        _ = sluice_lua_pcall(L, 0, 0)
        luaL_unref(L, Lua.registry, freezeRef)
    }

    /// Refuses the compiled script on top of the stack when a function of it other than the
    /// top level assigns a global, or names a metric with a literal that is not a metric name
    /// (`LuaBytecode`): found at load, not by the first request.
    private func refuseHookGlobalWrites() throws(LuaLoadError) {
        let chunk = LuaBytecode(LuaBytecode.dump(L))
        assert(chunk != nil, "lua_dump no longer writes Lua 5.4.4's format")
        if let write = chunk?.hookGlobalWrites.first {
            throw LuaLoadError(script: script.name, message: "\(script.name):\(write.line): hook writes global '\(write.name)'")
        }
        if let bad = chunk?.metricNames.first(where: { !LuaMetricAPI.isValidName($0.name.utf8) }) {
            throw LuaLoadError(
                script: script.name,
                message: "\(script.name):\(bad.line): \(LuaMetricAPI.invalidNameMessage(bad.name))")
        }
    }

    private func loadChunk(_ source: String, name: String) -> Int32 {
        var source = source
        return source.withUTF8 { text in sluice_lua_load(L, text.baseAddress, text.count, name) }
    }

    /// Reads the hooks table at index 1 of `co`: each key a known hook name, each value a
    /// function; or `every_try`, a boolean.
    private func readHooks(_ co: OpaquePointer) throws(LuaLoadError) {
        lua_pushnil(co)
        while lua_next(co, 1) != 0 {
            let name = lua_type(co, -2) == LUA_TSTRING ? Lua.string(co, -2) ?? "" : "(\(Lua.typeName(co, -2)))"
            if name == "every_try" {
                guard lua_type(co, -1) == LUA_TBOOLEAN else {
                    throw LuaLoadError(
                        script: script.name,
                        message: "\(script.name): every_try is a \(Lua.typeName(co, -1)), not a boolean")
                }
                declaresEveryTry = lua_toboolean(co, -1) != 0
                sluice_lua_pop(co, 1)
                continue
            }
            guard lua_type(co, -1) == LUA_TFUNCTION else {
                throw LuaLoadError(
                    script: script.name, message: "\(script.name): hook '\(name)' is a \(Lua.typeName(co, -1)), not a function")
            }
            var info = lua_Debug()
            lua_pushvalue(co, -1)
            _ = lua_getinfo(co, ">u", &info)
            let declared = Int(info.nparams)
            let variadic = info.isvararg != 0
            // `ctx` is the last parameter: a hook that declares it but never touches it gets none.
            let hook = LuaBytecode(LuaBytecode.dump(co))
            func takesContext(_ position: Int) -> Bool {
                variadic || (declared > position && hook?.mayUse(register: position) != false)
            }
            lua_pushvalue(co, -1)
            let ref = luaL_ref(co, Lua.registry)
            switch name {
            case "on_request": onRequestHook = Hook(ref: ref, takesContext: takesContext(1))
            case "on_response": onResponseHook = Hook(ref: ref, takesContext: takesContext(1))
            case "on_log": onLogHook = Hook(ref: ref, takesContext: takesContext(0))
            default:
                throw LuaLoadError(
                    script: script.name,
                    message:
                        "\(script.name): unknown hook '\(name)' (the hooks are on_request, on_response, on_log; and every_try = true)"
                )
            }
            sluice_lua_pop(co, 1)
        }
    }

    // MARK: Calls

    /// Runs the function under the `arguments` values on `co`'s stack as a coroutine, under
    /// `limits`. Puts the outcome and costs in `result` (a fresh one: filled in place, not
    /// returned, since each copy of a result cost some 100 instructions) and returns
    /// `lua_resume`'s status; on success the function's results are left on `co`'s stack.
    func run(_ co: OpaquePointer, arguments: Int32, limits: LuaLimits, into result: inout LuaCallResult) -> Int32 {
        let m = meter
        let start = now
        m.pointee.stopped = Int32(SLUICE_LUA_RUNNING)
        m.pointee.refused = 0
        m.pointee.collections = 0
        m.pointee.periods = 0
        m.pointee.period_limit = Int64(
            max(1, (limits.instructions + Int(SLUICE_LUA_HOOK_PERIOD) - 1) / Int(SLUICE_LUA_HOOK_PERIOD)))
        m.pointee.deadline_us = start + limits.wallMicroseconds
        m.pointee.peak = m.pointee.used
        m.pointee.external = 0
        return resume(co, arguments: arguments, since: start, into: &result)
    }

    /// Resumes `co` with `arguments` values on its stack, under the budgets already in the
    /// meter (`run` sets them; `LuaWait` puts a waiting call's back). `start` is when the call
    /// began, for its duration. A yield is the call waiting (`LuaWait`) when `current` has a
    /// wait that took it; any other yield is an error.
    func resume(_ co: OpaquePointer, arguments: Int32, since start: Int64, into result: inout LuaCallResult) -> Int32 {
        let m = meter
        sluice_lua_arm(co)
        var results: Int32 = 0
        m.pointee.grace = 0
        m.pointee.running = co
        let status = lua_resume(co, L, arguments, &results)
        m.pointee.running = nil
        m.pointee.grace = 1

        result.instructions = Int(m.pointee.periods) * Int(SLUICE_LUA_HOOK_PERIOD)
        result.peakMemory = m.pointee.peak
        let end = now
        result.microseconds = end - start
        // A script may run for milliseconds: deadlines armed after it count from its end
        // (a test's clock is not the loop's).
        if clock.monotonic == nil { LoopClock.keep(end) }
        let stopped = Int(m.pointee.stopped)
        // A refusal still pending was not retried (a lauxlib buffer's, raised as a plain
        // error; shim.h, `sluice_lua_alloc`): the cap's stop too.
        if stopped != SLUICE_LUA_RUNNING || status == LUA_ERRMEM || m.pointee.refused != 0 {
            isPoisoned = true
            let kind: LuaLimitKind =
                switch stopped {
                case SLUICE_LUA_STOPPED_INSTRUCTIONS: .instructions
                case SLUICE_LUA_STOPPED_WALL: .wall
                default: .memory
                }
            var message = status != LUA_OK && status != LUA_YIELD ? errorText(co) : nil
            // Lua's own message for a refusal says nothing of the limit that stopped the call.
            if message == "not enough memory" { message = nil }
            if kind == .memory && message == nil {
                message = "\(script.name): memory limit reached"
            }
            result.outcome = .limit(kind, message ?? "\(script.name): \(kind.rawValue) limit reached")
        } else if status == LUA_YIELD {
            if current?.wait?.isSuspending != true {
                result.outcome = .error("\(script.name): the script yielded outside sluice.http")
            }
        } else if status != LUA_OK {
            result.outcome = .error(errorText(co))
        }
        return status
    }

    /// The error value on top of `co` as text, its first `LuaModule.maxLogMessage` bytes (it
    /// goes into the access log's line and the dashboard: `error(string.rep(...))` is not
    /// copied whole), the running configuration's secrets redacted before the cut; never
    /// calls a `__tostring`.
    private func errorText(_ co: OpaquePointer) -> String {
        if let text = Lua.text(co, -1) {
            return LuaStateCache.current.redactor.redactedPrefix(text, LuaModule.maxLogMessage)
        }
        return "\(script.name): (error object is a \(Lua.typeName(co, -1)) value)"
    }

    /// Idle slots a state keeps for its next calls; more, left by a burst of calls that waited
    /// at once, are retired as their calls end (`retire`), so that a burst's coroutines and
    /// messages do not stay in the heap, counted against `limits.memory`, for the state's life.
    static let idleSlotsKept = 16

    /// A slot for one call, its coroutine ready and empty.
    func acquireSlot() -> LuaCallSlot {
        let slot: LuaCallSlot
        if let reused = idle.popLast() {
            slot = reused
        } else if let index = vacant.popLast() {
            // A retired slot's index: a userdata of the old slot a script kept names it, but
            // its address is not the new slot's, so its methods answer nothing (its `req.path`
            // reads the slot at that index while that slot's call runs: the running call's
            // own request, as when an idle slot is reused).
            slot = LuaMessageAPI.makeSlot(self, index: index)
            slots[Int(index)] = slot
        } else {
            slot = LuaMessageAPI.makeSlot(self, index: Int32(slots.count))
            slots.append(slot)
        }
        if slot.thread == nil {
            slot.thread = lua_newthread(L)
            slot.threadRef = luaL_ref(L, Lua.registry)
        }
        return slot
    }

    /// Ends a call: a coroutine that failed is dropped (its stack and hook state are the
    /// error's); one that returned is emptied and kept for the next call.
    func releaseSlot(_ slot: LuaCallSlot, status: Int32) {
        if status == LUA_OK, let co = slot.thread {
            lua_settop(co, 0)
        } else {
            luaL_unref(L, Lua.registry, slot.threadRef)
            slot.thread = nil
            slot.threadRef = LUA_NOREF
        }
        slot.end()
        // Idle slots are kept up to as many as the calls still running (or `idleSlotsKept`): a
        // load that goes up and down reuses its slots rather than making and retiring them call
        // after call, and once a burst is over, 16 stay.
        idle.append(slot)
        let running = slots.count - vacant.count - idle.count
        while idle.count > max(Self.idleSlotsKept, running), let extra = idle.popLast() {
            retire(extra, running: running)
        }
        reportMemory()
    }

    /// Lets a slot's coroutine and messages go (their registry references); its index is
    /// taken by the next slot made. Every 64 retired, or once no call runs, a full collection
    /// (between calls) gives their memory back.
    private func retire(_ slot: LuaCallSlot, running: Int) {
        if slot.thread != nil {
            luaL_unref(L, Lua.registry, slot.threadRef)
            slot.thread = nil
            slot.threadRef = LUA_NOREF
        }
        luaL_unref(L, Lua.registry, slot.requestRef)
        luaL_unref(L, Lua.registry, slot.responseRef)
        vacant.append(slot.index)
        retiredSinceCollection += 1
        if retiredSinceCollection >= 4 * Self.idleSlotsKept || running == 0, meter.pointee.running == nil {
            retiredSinceCollection = 0
            sluice_lua_collect_between_calls(L)
            reportMemory(force: true)
        }
    }

    /// Pushes onto `co` the frozen `ctx.config` table made from `config`, building it on
    /// first use.
    func pushConfig(_ config: LuaConfig, onto co: OpaquePointer) {
        if let last = lastConfig, last.config === config {
            lua_rawgeti(co, Lua.registry, lua_Integer(last.ref))
            return
        }
        let key = ObjectIdentifier(config)
        let ref: Int32
        if let entry = configs[key], entry.config === config {
            ref = entry.ref
        } else {
            dropRetiredConfigs()
            if let shared = configTables[config.values] {
                ref = shared
            } else {
                lua_rawgeti(L, Lua.registry, lua_Integer(readonlyRef))
                Lua.push(L, value: .table(config.values))
                _ = sluice_lua_pcall(L, 1, 1)
                ref = luaL_ref(L, Lua.registry)
                configTables[config.values] = ref
            }
            configs[key] = ConfigEntry(config: config, ref: ref)
        }
        lastConfig = (config, ref)
        lua_rawgeti(co, Lua.registry, lua_Integer(ref))
    }

    /// Forgets the configs that are gone (a reload retired their policies), and releases each
    /// table no live config uses any more.
    private func dropRetiredConfigs() {
        var released: [Int32] = []
        for (id, entry) in configs where entry.config == nil {
            released.append(entry.ref)
            configs[id] = nil
        }
        guard !released.isEmpty else { return }
        let used = Set(configs.values.map(\.ref))
        for (values, ref) in configTables where released.contains(ref) && !used.contains(ref) {
            luaL_unref(L, Lua.registry, ref)
            configTables[values] = nil
        }
    }

    /// A `ctx` table for an exchange, `{ config = <frozen config>, vars = {} }`: one an ended
    /// exchange gave back (`recycleContext`) when there is one, else a new one. Written with
    /// raw sets only: a script may have given an old `ctx` a metatable.
    func makeContext(config: LuaConfig) -> Int32 {
        let ref: Int32
        if let recycled = idleContexts.popLast() {
            ref = recycled
            lua_rawgeti(L, Lua.registry, lua_Integer(ref))
        } else {
            lua_createtable(L, 0, 2)
            Lua.push(L, "vars")
            sluice_lua_newtable(L)
            lua_rawset(L, -3)
            lua_pushvalue(L, -1)
            ref = luaL_ref(L, Lua.registry)
        }
        Lua.push(L, "config")
        pushConfig(config, onto: L)
        lua_rawset(L, -3)
        sluice_lua_pop(L, 1)
        return ref
    }

    /// Takes back an ended exchange's `ctx`, emptied (its `vars` table too, and its
    /// metatable gone), for the next exchange: a `ctx` per exchange would cost two tables and
    /// their collection. A script that kept a reference to an old `ctx` sees the next
    /// exchange's data through it, as it would see anything else it kept across calls.
    func recycleContext(_ ref: Int32) {
        guard !isPoisoned, idleContexts.count < 64 else {
            unref(ref)
            return
        }
        lua_rawgeti(L, Lua.registry, lua_Integer(ref))
        let context = lua_gettop(L)
        lua_pushnil(L)
        _ = lua_setmetatable(L, context)
        var keptVars = false
        lua_pushnil(L)
        while lua_next(L, context) != 0 {
            if !keptVars, lua_type(L, -1) == LUA_TTABLE, let key = Lua.bytes(L, -2), Lua.equals(key, "vars") {
                Lua.clear(L, lua_gettop(L))
                // A metatable a script gave `vars` would show through to the next exchange.
                lua_pushnil(L)
                _ = lua_setmetatable(L, -2)
                keptVars = true
                sluice_lua_pop(L, 1)
            } else {
                sluice_lua_pop(L, 1)
                lua_pushvalue(L, -1)
                lua_pushnil(L)
                lua_rawset(L, context)
            }
        }
        if !keptVars {
            Lua.push(L, "vars")
            sluice_lua_newtable(L)
            lua_rawset(L, context)
        }
        sluice_lua_pop(L, 1)
        idleContexts.append(ref)
    }

    func unref(_ ref: Int32) {
        if ref != LUA_NOREF { luaL_unref(L, Lua.registry, ref) }
    }

    /// A per-exchange context (`ctx`) for calls under `limits`; `requestID` goes on the
    /// script's log lines.
    public func makeExchange(config: LuaConfig = .empty, limits: LuaLimits = .default, requestID: UInt64 = 0) -> LuaExchange {
        LuaExchange(state: self, config: config, limits: limits, requestID: requestID)
    }

    /// The state's heap now, in bytes.
    public var memoryInUse: Int { meter.pointee.used }

    /// The state's heap once `config`'s frozen table is built in it, as the first call with
    /// that config builds it: the configuration refuses a `config` that leaves no room under
    /// `limits.memory` (every call would fail).
    public func memoryInUse(with config: LuaConfig) -> Int {
        pushConfig(config, onto: L)
        sluice_lua_pop(L, 1)
        return memoryInUse
    }

    /// How many coroutines (call slots) the state has made: one while calls never overlap.
    public var slotCount: Int { slots.count }
}
