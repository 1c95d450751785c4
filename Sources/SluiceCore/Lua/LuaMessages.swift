import HTTPTypes

/// The request as a script sees it (`req` in `on_request`): what the pipeline copies in before
/// the hook and copies back when the hook succeeds. A failed call leaves the caller's view as
/// it was, so `fail_open` goes on with the request the script never touched.
public struct LuaRequestView: Sendable, Equatable {
    public var method: String
    /// The path as sent (percent-encoded), starting with `/`.
    public var path: String
    /// The query without its `?`; nil when the URL has none.
    public var query: String?
    public var headers: HTTPFields
    /// The buffered body (up to `limits.body`); nil when the pipeline did not buffer it, and
    /// then `req:body()` returns nil.
    public var body: [UInt8]?

    public init(method: String, path: String, query: String? = nil, headers: HTTPFields = [:], body: [UInt8]? = nil) {
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
    }
}

/// The response as a script sees it (`res` in `on_response`, and what `req:respond` answers).
public struct LuaResponseView: Sendable, Equatable {
    public var status: Int
    public var headers: HTTPFields
    /// The buffered body; nil when not buffered (`res:body()` returns nil).
    public var body: [UInt8]?

    public init(status: Int, headers: HTTPFields = [:], body: [UInt8]? = nil) {
        self.status = status
        self.headers = headers
        self.body = body
    }
}

/// What one hook call did, for the pipeline (its edits, its answer) and for the access log and
/// metrics (outcome, cost).
public struct LuaCallResult: Sendable, Equatable {
    public enum Outcome: Sendable, Equatable {
        case ok
        /// The script raised an error (or broke an API rule): `sign.lua:42: attempt to …`.
        case error(String)
        /// A limit stopped the call; the message is located where Lua could.
        case limit(LuaLimitKind, String)
    }

    public var outcome: Outcome = .ok
    /// VM instructions run, counted in periods of the count hook (1,000): a call shorter than
    /// one period reads 0.
    public var instructions = 0
    /// The state's heap at its highest during the call, in bytes.
    public var peakMemory = 0
    public var microseconds: Int64 = 0
    /// `req:respond(…)` in `on_request`: answer the client with this; send nothing upstream.
    public var respond: LuaResponseView?
    /// `res:retry()` in `on_response`: treat this answer as a failed try (the `retry` policy
    /// decides whether another is made).
    public var retry = false

    public init() {}

    /// The message for the access log: nil when the call succeeded.
    public var errorMessage: String? {
        switch outcome {
        case .ok: nil
        case .error(let message), .limit(_, let message): message
        }
    }
}
