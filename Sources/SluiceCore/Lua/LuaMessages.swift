import HTTPTypes

/// The request as a script sees it (`req` in `on_request`): with `fail_open`, what the pipeline
/// copies in before the hook and copies back when the hook succeeds, so a failed call leaves
/// the caller's view as it was and the request goes on as the script never touched it; with
/// `fail_closed` (whose failed request is dropped), the caller's view itself, lent to the call
/// (`LuaCallSlot.lending`).
///
/// The header fields are `headers`, or — for a request whose scripts run on the forwarded
/// request's header lines (`HostPolicy.scriptsOnLines`) — `lines` followed by `lineEdits`,
/// until a script's call needs them as `HTTPFields` (`materializeHeaders`).
public struct LuaRequestView: Sendable, Equatable {
    public var method: String
    /// The path as sent (percent-encoded), starting with `/`.
    public var path: String {
        get { url.map { Self.parts(of: $0).path } ?? storedPath }
        set {
            split()
            storedPath = newValue
        }
    }
    /// The query without its `?`; nil when the URL has none.
    public var query: String? {
        get { url.map { Self.parts(of: $0).query } ?? storedQuery }
        set {
            split()
            storedQuery = newValue
        }
    }
    /// The absolute URL `path` and `query` are read from, while neither was set (a view made
    /// with `init(method:url:lines:)`): most scripts never read them, so the URL is split
    /// only for those that do (each read splits it again; a write splits it for good).
    private var url: String?
    private var storedPath: String
    private var storedQuery: String?
    /// The fields; empty while `lines` holds them.
    public var headers: HTTPFields
    /// The fields as the forwarded request's lines (nil: `headers` holds them). Spelled
    /// `Optional<…>`: a `T?` stored property starts as an implicit nil, which the initializers'
    /// assignment then destroyed through the existential's witness. No observer: with one, a
    /// call on the lines in place copied them out and back; whoever sets them sets `hasLines`.
    public internal(set) var lines: Optional<any LuaHeaderLines>
    /// Whether `lines` holds the fields: read by every `req.headers` call, where testing the
    /// optional existential itself copies it (a retain and a release).
    public internal(set) var hasLines = false
    /// The scripts' edits of `lines`, in order (`req.headers:set`, `add`, `remove`).
    public var lineEdits = LuaLineEdits()
    /// The buffered body (up to `limits.body`); nil when the pipeline did not buffer it, and
    /// then `req:body()` returns nil.
    public var body: [UInt8]?

    public init(method: String, path: String, query: String? = nil, headers: HTTPFields = [:], body: [UInt8]? = nil) {
        self.method = method
        self.storedPath = path
        self.storedQuery = query
        self.headers = headers
        self.body = body
        lines = nil
    }

    /// A view whose fields are `lines` (`HostPolicy.scriptsOnLines`).
    public init(method: String, path: String, query: String?, lines: any LuaHeaderLines) {
        self.init(method: method, path: path, query: query)
        self.lines = lines
        hasLines = true
    }

    /// A view whose fields are `lines`, its path and query those of the absolute `url`,
    /// split when first read.
    public init(method: String, url: String, lines: any LuaHeaderLines) {
        // Every field set here: through the other initializers, `lines`' observer would copy
        // the existential to test it.
        self.method = method
        self.url = url
        storedPath = "/"
        // Shared, not made: an empty `HTTPFields` literal builds its storage (~100
        // instructions a request), and these stay empty unless materialized.
        headers = Self.noFields
        self.lines = lines
        hasLines = true
    }

    private static let noFields: HTTPFields = [:]

    /// Whether `path` and `query` are still the URL's, never set (`init(method:url:lines:)`).
    public var keepsURL: Bool { url != nil }

    /// Makes `path` and `query` stored values before one of them is set.
    private mutating func split() {
        guard let url else { return }
        (storedPath, storedQuery) = Self.parts(of: url)
        self.url = nil
    }

    private static func parts(of url: String) -> (path: String, query: String?) {
        let target = LuaAdapter.Target(url)
        return (target.path.isEmpty ? "/" : target.path, target.query)
    }

    /// Views are equal when their fields are, however each holds them.
    public static func == (a: LuaRequestView, b: LuaRequestView) -> Bool {
        guard a.method == b.method, a.path == b.path, a.query == b.query, a.body == b.body else { return false }
        if !a.hasLines && !b.hasLines { return a.headers == b.headers }
        var a = a
        var b = b
        a.materializeHeaders()
        b.materializeHeaders()
        return a.headers == b.headers
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

    /// Whether the call succeeded (read by a pattern: `outcome == .ok` copies the outcome
    /// and its message to compare them).
    public var succeeded: Bool {
        if case .ok = outcome { true } else { false }
    }

    /// The message for the access log: nil when the call succeeded.
    public var errorMessage: String? {
        switch outcome {
        case .ok: nil
        case .error(let message), .limit(_, let message): message
        }
    }
}
