import HTTPTypes
import Logging

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// The `lua` interceptor's request half (docs/scripting.md): runs the script's `on_request`
/// on the request model, and maps the script's edits (method, path, query, header fields)
/// back onto it. A script without `on_request` leaves the request as it is.
///
/// `req:respond(…)` answers the client with the script's response instead
/// (`ProxyError.luaResponded`, carried by the `AdaptationError`); `req:set_body(s)` (with
/// `read_body`) leaves the try's body in `ProxyRequest.replacedBody`.
///
/// A failed call (an error, a limit) answers `ProxyError.luaScriptFailed` with `fail_closed`
/// (the default): nothing is sent upstream, and the client's body names the request id, never
/// the script's message (that goes to the `.adaptationFailed` event). With `fail_open` the
/// request goes on as it was before the script ran.
///
/// Threading: immutable, shared by every worker of a policy snapshot; each call runs on the
/// calling worker's thread, with that thread's `LuaStateCache` (`LuaStateCache.current`): one
/// Lua state per script content per worker. A class, not a struct: the stages that run a
/// policy's scripts on every request (`on_response`, `on_log`) then take each with one retain,
/// where a copy of its fields cost some 400 instructions.
public final class LuaAdapter: RequestAdapter {
    public enum OnError: String, Sendable { case failClosed = "fail_closed", failOpen = "fail_open" }

    public var name: String { "lua" }
    public let script: LuaScript
    /// Where the script came from, for `sluice check` (`file /etc/sluice/sign.lua`, `source`).
    public let origin: String
    public let config: LuaConfig
    public let limits: LuaLimits
    public let onError: OnError
    /// `every_try: true`: the hook runs before each try, after the once-per-exchange adapters.
    /// The configuration sets it for the key or for a script whose table has `every_try = true`
    /// (`LuaState.declaresEveryTry`); a library caller passes what it wants.
    public let everyTry: Bool
    /// `read_body: true`: the body is read whole (up to `max_body`) and `req:body()` returns
    /// it; the hook then runs on every try, as only those adapters are given the body.
    public let readBody: Bool
    /// `read_response_body: true`: the response body is kept whole (up to `limits.body`)
    /// before the client gets anything, and `on_response` runs on it: `res:body()` returns it
    /// and `res:set_body(s)` replaces it (`LuaResponseStage`). Its policy's responses bypass
    /// the shared cache (`HostPolicy.responseBodyLimit`).
    public let readResponseBody: Bool

    /// The hooks the script defined when the configuration loaded it (`.all` when it was not
    /// loaded): a hook outside them is never run, so a policy whose scripts define neither
    /// `on_response` nor `on_log` skips the response stage, and its exchange's end looks at
    /// its scripts only when a call was recorded or a hook kept a `ctx` open
    /// (`ExchangeMachine.keepsScriptContexts`).
    public let hooks: LuaHooks

    /// `allow_hosts`: the hosts `sluice.http` may call. Empty (the default): none, and the
    /// hook never waits, so it runs in place with the synchronous adapters.
    public let allowHosts: [LuaAllowedHost]

    public var timing: AdapterTiming { everyTry || readBody ? .everyTry : .oncePerExchange }
    public var readsBody: Bool { readBody }
    /// Whether the script names `sluice.shared` (read from its text: a script that reaches it
    /// otherwise uses the process's table even with a fleet).
    let usesShared: Bool
    /// Whether the hook may wait (`sluice.http`, `sluice.shared` over a fleet): it then runs
    /// through the session's form.
    var mayWait: Bool { !allowHosts.isEmpty || usesShared }

    public init(
        script: LuaScript, origin: String, config: LuaConfig = .empty, limits: LuaLimits = .default,
        onError: OnError = .failClosed, everyTry: Bool = false, readBody: Bool = false,
        readResponseBody: Bool = false, allowHosts: [LuaAllowedHost] = [], hooks: LuaHooks = .all
    ) {
        self.hooks = hooks
        self.readResponseBody = readResponseBody
        self.allowHosts = allowHosts
        self.usesShared = !readBody && !everyTry && script.source.contains("shared")
        self.script = script
        self.origin = origin
        self.config = config
        self.limits = limits
        self.onError = onError
        self.everyTry = everyTry
        self.readBody = readBody
    }

    public func adapt(_ request: ProxyRequest, completion: @escaping (Result<ProxyRequest, AdaptationError>) -> Void) {
        var request = request
        do throws(AdaptationError) {
            try run(&request, body: nil)
            completion(.success(request))
        } catch {
            completion(.failure(error))
        }
    }

    /// The form a hook that may wait runs in: on the worker's loop, `completion` called when
    /// the script's waits are over (`LuaWait`).
    public func adapt(
        _ request: ProxyRequest, for session: any SessionContext,
        completion: @escaping (Result<ProxyRequest, AdaptationError>) -> Void
    ) {
        guard mayWait, let host = session.lua, !allowHosts.isEmpty || host.shared != nil else {
            return adapt(request, completion: completion)
        }
        var request = request
        do throws(AdaptationError) {
            let cache = LuaStateCache.current
            guard let (state, target) = try begin(request, cache) else { return completion(.success(request)) }
            let depth = request.scriptDepth
            let view = self.view(of: &request, target, body: nil)
            let exchange = cache.exchange(on: state, config: config, limits: limits, requestID: request.id)
            exchange.onRequest(view, waitingWith: host, allowHosts: allowHosts, depth: max(0, depth)) { view, result in
                var view = view
                do throws(AdaptationError) {
                    try self.end(&request, target, view: &view, body: nil, result: result, exchange: exchange, cache)
                    completion(.success(request))
                } catch {
                    completion(.failure(error))
                }
            }
        } catch {
            completion(.failure(error))
        }
    }

    public func adaptInPlace(_ request: inout ProxyRequest) throws(AdaptationError) -> Bool {
        guard !mayWait else { return false }
        try run(&request, body: nil)
        return true
    }

    public func adaptTry(_ request: inout ProxyRequest, _ context: TryContext) throws(AdaptationError) {
        try run(&request, body: context.body)
    }

    /// Runs `on_request` on `request` (with `body` when it was read) and applies its edits.
    func run(_ request: inout ProxyRequest, body: [UInt8]?) throws(AdaptationError) {
        let cache = LuaStateCache.current
        guard let (state, target) = try begin(request, cache) else { return }
        var view = view(of: &request, target, body: body)
        let (exchange, reusable) = cache.requestExchange(on: state, config: config, limits: limits, requestID: request.id)
        let result = exchange.onRequest(&view, restoringOnFailure: onError == .failOpen)
        defer { if reusable { cache.giveBack(exchange) } }
        try end(&request, target, view: &view, body: body, result: result, exchange: exchange, cache)
    }

    /// The worker's state for the script and the request URL's parts; nil when there is
    /// nothing to run (no `on_request`, or a script that does not load with `fail_open`).
    private func begin(_ request: ProxyRequest, _ cache: LuaStateCache) throws(AdaptationError) -> (LuaState, Target)? {
        let state: LuaState
        do throws(LuaLoadError) {
            // A later try of an exchange whose `ctx` is open runs where that `ctx` is, in the
            // state its first hook ran in (a reload may have retired it, a limit poisoned it).
            state = try cache.state(for: script, config: config, limits: limits, requestID: request.id).state
        } catch {
            try failed(error.message, request.id)
            return nil
        }
        guard state.hasOnRequest else { return nil }
        return (state, Target(request.url))
    }

    /// The request as the script sees it. With `fail_closed` the header fields move into the
    /// view and back (a failed call drops the request, so nothing needs restoring): the
    /// script's first edit does not copy them. With `fail_open` the view is a copy, so the
    /// request can go on untouched.
    private func view(of request: inout ProxyRequest, _ target: Target, body: [UInt8]?) -> LuaRequestView {
        let headers = request.headerFields
        if onError == .failClosed { request.headerFields = HTTPFields() }
        return LuaRequestView(
            method: request.method, path: target.path.isEmpty ? "/" : target.path, query: target.query,
            headers: headers, body: body ?? (readBody ? [] : nil))
    }

    /// Runs `on_request` on `view`, a request whose fields are the forwarded request's lines
    /// (`HostPolicy.scriptsOnLines`: no request model is built), and leaves the script's edits
    /// in it (a failed call with `fail_open` leaves it as it was). Returns the URL the script
    /// made when it changed the path or the query (nil when it did not); throws as `run` does.
    /// `recordingSuccess`: whether a call that succeeds and leaves no `ctx.vars` is recorded
    /// for the exchange (`cache.lastCall`), as every other is: a monitor reads it
    /// (`EventMonitor.readsEveryScriptCall`).
    public func runOnLines(
        _ view: inout LuaRequestView, url: String, requestID: UInt64, cache: LuaStateCache = .current,
        recordingSuccess: Bool = true
    ) throws(AdaptationError) -> String? {
        let state: LuaState
        do throws(LuaLoadError) {
            state = try cache.state(for: script, limits: limits)
        } catch {
            try failed(error.message, requestID)
            return nil
        }
        guard state.hasOnRequest else { return nil }
        // A view that still reads its URL is split only if the script sets the path or query.
        let before = view.keepsURL ? nil : (path: view.path, query: view.query)
        // With `fail_open`, a URL the script made wrong leaves the request as it was.
        let untouched = onError == .failOpen ? view : nil
        let (exchange, reusable) = cache.requestExchange(on: state, config: config, limits: limits, requestID: requestID)
        var result = LuaCallResult()
        exchange.onRequest(&view, restoringOnFailure: onError == .failOpen, into: &result)
        defer { if reusable { cache.giveBack(exchange) } }
        guard try settle(result, exchange, cache, requestID, recordingSuccess: recordingSuccess), !view.keepsURL else {
            return nil
        }
        let target = Target(url)
        let original = before ?? (path: target.path.isEmpty ? "/" : target.path, query: target.query)
        guard view.path != original.path || view.query != original.query else { return nil }
        guard let edited = try edited(url, target, view, requestID) else {
            if let untouched { view = untouched }
            return nil
        }
        return edited
    }

    /// Records the call (in `cache.lastCall`); throws for a failure with `fail_closed` and for
    /// a script's answer. False when the call failed with `fail_open`: its edits are dropped.
    private func settle(
        _ result: LuaCallResult, _ exchange: LuaExchange, _ cache: LuaStateCache, _ requestID: UInt64,
        recordingSuccess: Bool = true
    ) throws(AdaptationError) -> Bool {
        let vars = result.succeeded ? exchange.vars() : [:]
        if recordingSuccess || !result.succeeded || !vars.isEmpty {
            cache.lastCall = LuaCallRecord(script: script.name, hook: "on_request", result: result, vars: vars)
        } else if cache.lastCall != nil {
            // Not this call's: a record no stage took (a caller outside the stages) must not
            // be read as this exchange's.
            cache.lastCall = nil
        }
        // Kept open for the exchange's later hooks only when it made a `ctx` for them to share:
        // a later hook that takes one makes its own as well as it would find this one's.
        if exchange.hasContext { cache.lastExchange = exchange }
        if let message = result.errorMessage {
            try failed(message, requestID)
            return false
        }
        if let answer = result.respond {
            // Not a failure, whatever `on_error` says: the client gets the script's answer.
            let error = ProxyError.luaResponded(script: script.name, response: answer)
            throw AdaptationError(adapter: name, reason: error.message, answer: error)
        }
        return true
    }

    /// The URL with the path and query the script left in `view` (`url`, split as `target`),
    /// checked: nil when they are not a target's, with `fail_open` (which drops the edits).
    private func edited(
        _ url: String, _ target: Target, _ view: LuaRequestView, _ requestID: UInt64
    ) throws(AdaptationError)
        -> String?
    {
        guard view.path.hasPrefix("/"), !view.path.utf8.contains(where: Self.isUnsafeInTarget),
            !(view.query?.utf8.contains(where: Self.isUnsafeInTarget) ?? false)
        else {
            try failed("\(script.name): req.path must start with '/' and hold visible ASCII only", requestID)
            return nil
        }
        return target.origin + view.path + (view.query.map { "?" + $0 } ?? "")
    }

    /// Records the call and applies its edits to `request` (or fails it).
    private func end(
        _ request: inout ProxyRequest, _ target: Target, view: inout LuaRequestView, body: [UInt8]?,
        result: LuaCallResult, exchange: LuaExchange, _ cache: LuaStateCache
    ) throws(AdaptationError) {
        guard try settle(result, exchange, cache, request.id) else { return }
        let path = target.path.isEmpty ? "/" : target.path
        if view.path != path || view.query != target.query {
            guard let url = try edited(request.url, target, view, request.id) else { return }
            request.url = url
        }
        request.method = view.method
        swap(&request.headerFields, &view.headers)
        // `req:set_body` (only with `read_body`: the hook then runs on every try, given the
        // body read whole): the try sends the script's body with its length, and a later
        // adapter (a signer) sees both.
        if readBody, let replaced = view.body, replaced != body ?? [] {
            request.replacedBody = replaced
            request.body = .length(Int64(replaced.count))
            request.headerFields[.contentLength] = String(replaced.count)
        }
    }

    /// An absolute URL split for `req.path` and `req.query` on its UTF-8 bytes (`URLParts`
    /// slices by Character, some 20,000 instructions a request); `origin` is cut only when a
    /// script changed the path or the query.
    public struct Target {
        /// As sent, without query or fragment; empty when the URL has none.
        public var path: String
        /// Without its `?`; nil when the URL has none.
        public var query: String?
        private let url: String
        private let pathStart: Int

        public init(_ url: String) {
            var copy = url
            var pathStart = 0
            (path, query) = copy.withUTF8 { utf8 -> (String, String?) in
                var start = 0
                if let colon = utf8.firstIndex(of: UInt8(ascii: ":")) {
                    start = colon + 1
                    if utf8.count >= start + 2, utf8[start] == UInt8(ascii: "/"), utf8[start + 1] == UInt8(ascii: "/") {
                        start += 2
                    }
                }
                var i = start
                while i < utf8.count, utf8[i] != UInt8(ascii: "/"), utf8[i] != UInt8(ascii: "?"),
                    utf8[i] != UInt8(ascii: "#")
                {
                    i += 1
                }
                pathStart = i
                var end = i
                while end < utf8.count, utf8[end] != UInt8(ascii: "#") { end += 1 }
                var mark = i
                while mark < end, utf8[mark] != UInt8(ascii: "?") { mark += 1 }
                func text(_ range: Range<Int>) -> String {
                    String(decoding: UnsafeBufferPointer(rebasing: utf8[range]), as: UTF8.self)
                }
                return (text(i..<mark), mark < end ? text((mark + 1)..<end) : nil)
            }
            self.url = url
            self.pathStart = pathStart
        }

        /// `scheme://authority`.
        public var origin: String { String(decoding: url.utf8.prefix(pathStart), as: UTF8.self) }
    }

    /// A byte that cannot appear in a request target: a control byte, a space, `#`, or one past
    /// ASCII (percent-encoded, it can).
    private static func isUnsafeInTarget(_ byte: UInt8) -> Bool {
        byte <= 0x20 || byte >= 0x7F || byte == UInt8(ascii: "#")
    }

    /// `fail_open`: returns, the request untouched; `fail_closed`: throws the 502.
    private func failed(_ message: String, _ requestID: UInt64) throws(AdaptationError) {
        guard onError == .failClosed else { return }
        throw AdaptationError(
            adapter: name, reason: message, answer: .luaScriptFailed(script: script.name, requestID: requestID))
    }
}

/// One hook call as the access log's `lua` field and `sluice_lua_calls_total` report it: the
/// adapter leaves it in its worker's `LuaStateCache.lastCall`, and the stage that ran the
/// adapter moves it into the exchange's summary.
///
/// Threading: immutable; made on a worker, read by its monitors.
public final class LuaCallRecord: Sendable {
    public let script: String
    public let hook: String
    /// `ok`, `error` or `limit` (the metric's `outcome`).
    public let outcome: String
    /// The script's message (`sign.lua:42: attempt to index a nil value`); nil when it succeeded.
    public let error: String?
    public let microseconds: Int64
    public let instructions: Int
    public let memory: Int
    /// What the script put in `ctx.vars`.
    public let vars: [String: LuaValue]
    /// The exchange's other calls (`combined`), counted by `sluice_lua_calls_total` but not
    /// shown in the access log.
    public let counted: [LuaCallRecord]

    /// Whether the access log shows the record (its `lua` field): a call that failed or was
    /// stopped, or any that left `ctx.vars`. One that succeeded and left none (nearly every
    /// call of a script that only edits) is in the metrics alone: writing its field cost
    /// some 900 instructions a request.
    public var isLogged: Bool { outcome != "ok" || !vars.isEmpty }

    public init(script: String, hook: String, result: LuaCallResult, vars: [String: LuaValue]) {
        self.script = script
        self.hook = hook
        switch result.outcome {
        case .ok: outcome = "ok"
        case .error: outcome = "error"
        case .limit: outcome = "limit"
        }
        error = result.errorMessage
        microseconds = result.microseconds
        instructions = result.instructions
        memory = result.peakMemory
        self.vars = vars
        counted = []
    }

    /// `shown`'s call with `vars` and the `counted` calls beside it (`combined`).
    init(_ shown: LuaCallRecord, vars: [String: LuaValue], counted: [LuaCallRecord]) {
        script = shown.script
        hook = shown.hook
        outcome = shown.outcome
        error = shown.error
        microseconds = shown.microseconds
        instructions = shown.instructions
        memory = shown.memory
        self.vars = vars
        self.counted = counted
    }
}

extension LuaStateCache {
    /// The record of the last `on_request` a `LuaAdapter` ran on this thread, taken (and
    /// cleared) by the stage that ran the adapters.
    public static func takeLastCall() -> LuaCallRecord? {
        let cache = current
        defer { cache.lastCall = nil }
        return cache.lastCall
    }

    /// The calling thread's cache, made on its first use: a worker's, since adapters run on
    /// their worker's thread. Lives as long as the thread. Its scripts' `sluice.log` lines go
    /// to the diagnostics log (stderr): `lua sign.lua:12 request 42: message`.
    public static var current: LuaStateCache {
        if let pointer = pthread_getspecific(threadKey) {
            return Unmanaged<LuaStateCache>.fromOpaque(pointer).takeUnretainedValue()
        }
        let cache = LuaStateCache(log: { line in
            let level: Logger.Level =
                switch line.level {
                case .info: .info
                case .warn: .warning
                case .error: .error
                }
            // One line each: a script's newlines cannot forge another log line. (The message
            // was redacted as it was made: `LuaModule`.)
            let message = line.message.split(whereSeparator: \.isNewline).joined(separator: " ")
            scriptLog.log(level: level, "lua \(line.script):\(line.line) request \(line.requestID): \(message)")
        })
        pthread_setspecific(threadKey, Unmanaged.passRetained(cache).toOpaque())
        return cache
    }

    private static let scriptLog = Logger(label: "sluice.lua")

    private static let threadKey: pthread_key_t = {
        var key = pthread_key_t()
        let made = pthread_key_create(&key) { pointer in
            if let pointer { Unmanaged<LuaStateCache>.fromOpaque(pointer).release() }
        }
        precondition(made == 0, "pthread_key_create failed")
        return key
    }()
}
