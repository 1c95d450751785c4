/// A worker's Lua states, one per (script, memory cap) — a script is its name and its content:
/// the 100 policies of a config that run the same script share one state and its memory. The
/// same text in two files is two states, since a state's errors and log lines name its file. A state poisoned by a limit is
/// replaced on its next lookup; exchanges that still hold the old one finish with it.
///
/// Threading: one per worker, used on that worker's thread only. The fields every request
/// reads and writes (the last state, the last call, the open exchanges) skip the runtime's
/// exclusivity checks, as `LuaCallSlot`'s do: no access to them is left open across a call
/// out (about 80 instructions each, six to eight a request).
public final class LuaStateCache {
    private struct Key: Hashable {
        var contentHash: String
        var name: String
        var memory: Int
    }
    private var states: [Key: LuaState] = [:]
    /// The scripts the worker's configuration runs (`LuaScript.identity`), once a
    /// configuration took effect (`retain(only:)`); nil before: every state is kept.
    private var live: Set<String>?
    /// The last state looked up, by its key: a worker's requests mostly name one script, and
    /// hashing its content hash (64 characters) costs more than comparing it with the same
    /// string.
    @exclusivity(unchecked) private var last: (key: Key, state: LuaState)?
    private let clock: LuaClock
    private let log: (LuaLogLine) -> Void
    /// The last call a `LuaAdapter` ran with this cache (`takeLastCall`).
    @exclusivity(unchecked) public var lastCall: LuaCallRecord?
    /// That call's exchange (its `ctx`), for the stage that takes the call to keep open.
    @exclusivity(unchecked) public var lastExchange: LuaExchange?
    /// The exchanges in flight whose hooks share one `ctx`, by request id
    /// (`LuaStateCache+Open.swift`): kept from the first hook to the exchange's end.
    @exclusivity(unchecked) var open: [UInt64: [LuaExchange]] = [:]
    /// The exchange of the last `on_request` that made no `ctx`, for the next
    /// (`requestExchange`).
    @exclusivity(unchecked) var spare: LuaExchange?
    /// An emptied edit buffer for the next request whose scripts run on its lines
    /// (`LuaRequestView.lineEdits`): taken before the scripts, given back once the edits are
    /// made, so a worker's requests share one allocation.
    @exclusivity(unchecked) public var spareLineEdits = LuaLineEdits()

    /// What redacts the worker's scripts' errors and `sluice.log` lines: its configuration's
    /// secrets (a `${NAME}` of a `config`, a bearer token a script read from the request). Set
    /// by the worker when its pipeline takes effect; empty for a cache of no worker's.
    public var redactor = Redactor()

    /// `log` receives every line the worker's scripts log (`sluice.log.*`).
    public init(clock: LuaClock = .system, log: @escaping (LuaLogLine) -> Void = { _ in }) {
        self.clock = clock
        self.log = log
    }

    /// The state for `script` under `limits` (its memory cap keys the state; the rest of the
    /// limits only bound the script's top level when the state is built). Throws when the
    /// script does not load.
    public func state(for script: LuaScript, limits: LuaLimits = .default) throws(LuaLoadError) -> LuaState {
        let key = Key(contentHash: script.contentHash, name: script.name, memory: limits.memory)
        if let last, last.key == key, !last.state.isPoisoned { return last.state }
        if let state = states[key], !state.isPoisoned {
            last = (key, state)
            return state
        }
        states[key] = nil
        let state = try LuaState.load(script, limits: limits, clock: clock, log: log)
        if let live, !live.contains(script.identity) {
            // A script a reload retired, for an exchange that began before it and kept no
            // `ctx` open: a state for this call only, not kept (nothing would drop it).
            return state
        }
        states[key] = state
        last = (key, state)
        return state
    }

    /// How many states the cache holds.
    public var count: Int { states.count }

    /// Drops the states no live policy uses (after a reload): `keep` is the scripts that remain
    /// (`LuaScript.identity`).
    public func retain(only keep: Set<String>) {
        live = keep
        states = states.filter { keep.contains($0.value.script.identity) }
        last = nil
        spare = nil
    }
}
