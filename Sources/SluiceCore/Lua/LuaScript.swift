/// A script as the engine compiles it: its name (for messages: `sign.lua:42: …`), its source
/// text, and the SHA-256 of that text, which keys the per-worker cache of states
/// (`LuaStateCache`): policies whose scripts have the same content share one state.
///
/// Threading: an immutable value; any thread.
public struct LuaScript: Sendable, Hashable {
    public let name: String
    public let source: String
    /// Lower-case hex SHA-256 of `source`.
    public let contentHash: String

    public init(name: String, source: String) {
        self.name = name
        self.source = source
        self.contentHash = Hex.lowercase(Crypto.sha256(Array(source.utf8)))
    }

    /// What a worker keeps one state for (`LuaStateCache`): the content and the name its
    /// errors and log lines carry.
    public var identity: String { contentHash + " " + name }
}

/// Which hooks a script's table defines (`LuaState.hooks`), as the configuration found them
/// when it loaded the script: the pipeline skips, for every request, the response stage when
/// no script of the policy defines `on_response` (`HostPolicy.runsResponseScripts`), and each
/// script without `on_log` at the exchange's end (`runScriptsAtEnd`).
///
/// Threading: a value; any thread.
public struct LuaHooks: OptionSet, Sendable, Hashable {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }

    public static let onRequest = LuaHooks(rawValue: 1)
    public static let onResponse = LuaHooks(rawValue: 2)
    public static let onLog = LuaHooks(rawValue: 4)
    /// Every hook: what a script not yet loaded may define.
    public static let all: LuaHooks = [.onRequest, .onResponse, .onLog]
}

/// The limits on one script (`lua.limits` in YAML). Instructions, wall clock, sub-requests and
/// body bytes are per call (one hook run for one exchange); memory is per state (every call
/// on the state shares its heap). A call stopped by a limit is an error, and its state is
/// rebuilt before its next use (`LuaState.isPoisoned`).
///
/// The defaults bound a script with no `limits` at all: a million VM instructions are 2 to
/// 10 ms of CPU (PUC Lua 5.4 runs 100 to 500 million a second, table work to plain loops),
/// and a C function called from Lua (a `string.rep`, a JSON decode) is bounded by the memory
/// cap; the wall clock is the backstop for time the instruction count cannot see.
///
/// Threading: a value; any thread.
public struct LuaLimits: Sendable, Hashable {
    /// VM instructions per call, checked every 1,000 (the count hook's period).
    public var instructions: Int
    /// Bytes of the state's heap (code, tables, strings of every call in flight).
    public var memory: Int
    /// Wall-clock time per call, checked with the instruction budget.
    public var wall: Duration {
        didSet { wallMicroseconds = Self.microseconds(wall) }
    }
    /// `sluice.http` calls per call (enforced with `sluice.http`).
    public var subrequests: Int
    /// The largest body a script may read or set (`req:set_body`, `req:respond`, `res:set_body`).
    public var body: Int

    /// `1_000_000` instructions per call: a few milliseconds of CPU.
    public static let defaultInstructions = 1_000_000
    /// `8 MiB` per state: room for a decoded 1 MiB JSON body, and a bound on 100 policies'
    /// worth of shared state per worker.
    public static let defaultMemory = 8 << 20
    /// `1 s` per call: the "a `while true do end` gets 502 within a second"; in practice
    /// the instruction budget stops CPU loops long before.
    public static let defaultWall = Duration.seconds(1)
    /// `4` sub-requests per call.
    public static let defaultSubrequests = 4
    /// `1 MiB` of body per read or write.
    public static let defaultBody = 1 << 20

    public static let `default` = LuaLimits()

    public init(
        instructions: Int = defaultInstructions, memory: Int = defaultMemory, wall: Duration = defaultWall,
        subrequests: Int = defaultSubrequests, body: Int = defaultBody
    ) {
        self.instructions = instructions
        self.memory = memory
        self.wall = wall
        self.wallMicroseconds = Self.microseconds(wall)
        self.subrequests = subrequests
        self.body = body
    }

    /// `wall` in microseconds, converted once (each call reads it).
    private(set) var wallMicroseconds: Int64

    private static func microseconds(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        return seconds * 1_000_000 + attoseconds / 1_000_000_000_000
    }
}

/// Which limit stopped a call. (`limits.subrequests` stops nothing: the call past it is a
/// script error the script may catch, as a call to a host not in `allow_hosts` is.)
public enum LuaLimitKind: String, Sendable, Equatable {
    case instructions, memory, wall, body
}

/// A value crossing between Swift and Lua: the YAML `config` on its way in (`ctx.config`), and
/// `ctx.vars` on its way out (the access log's `lua` field). Tables with keys other than 1…n
/// are `table`; sequences are `array` (an empty Lua table reads as an empty `table`).
public indirect enum LuaValue: Sendable, Hashable {
    case bool(Bool)
    case integer(Int)
    case number(Double)
    case string(String)
    case array([LuaValue])
    case table([String: LuaValue])
}

/// A script's `config` (`ctx.config`), frozen: one Lua table per state is built from it on first
/// use and kept for as long as this object lives, so a policy pays the conversion once, not per
/// exchange.
///
/// Threading: immutable; shared by the workers of a policy snapshot.
public final class LuaConfig: Sendable {
    public let values: [String: LuaValue]
    public init(_ values: [String: LuaValue] = [:]) { self.values = values }
    public static let empty = LuaConfig()
}

/// The clocks a state reads, injected so tests fix them.
public struct LuaClock {
    /// Microseconds on a monotonic clock (the wall-clock budget, `LuaCallResult.microseconds`);
    /// nil: CLOCK_MONOTONIC, read in C by the count hook.
    let monotonic: (() -> Int64)?
    /// Microseconds since the Unix epoch (`sluice.now()`); nil: CLOCK_REALTIME.
    let epoch: (() -> Int64)?

    public init(monotonic: (() -> Int64)? = nil, epoch: (() -> Int64)? = nil) {
        self.monotonic = monotonic
        self.epoch = epoch
    }

    public static var system: LuaClock { LuaClock() }
}

/// A line a script logged with `sluice.log.info/warn/error`, located where the script called.
public struct LuaLogLine: Sendable, Equatable {
    public enum Level: String, Sendable { case info, warn, error }
    public var level: Level
    public var script: String
    /// The line of the call to `sluice.log.*`, 0 if unknown.
    public var line: Int
    /// The exchange's request id (`LuaState.makeExchange(requestID:…)`).
    public var requestID: UInt64
    public var message: String
}

/// Why a script could not be loaded: a syntax error, a runtime error or limit at the top level,
/// a result that is not a table of hooks, an unknown hook name.
public struct LuaLoadError: Error, Sendable, Equatable, CustomStringConvertible {
    public var script: String
    /// Located where Lua can: `sign.lua:3: '=' expected near 'x'`.
    public var message: String
    public var description: String { message }
}
