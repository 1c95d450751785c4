/// Every failure Sluice answers itself, as a domain value. Each case maps to exactly one
/// client-visible response: a status, a one-line plain-text body that starts with `sluice: `,
/// and whether the client connection must close afterwards (it must whenever the request's
/// framing can no longer be trusted). `docs/errors.md` is the operator's view of this table.
public enum ProxyError: Error, Sendable, Equatable {
    /// The request could not be parsed or violates RFC 9112 (smuggling-prone framing included).
    case malformedRequest(String)
    /// An origin-form or asterisk-form target arrived on a forward-proxy listener.
    case notAbsoluteURL
    /// The absolute URL is unusable (scheme, userinfo, empty host).
    case badURL(String)
    case requestLineTooLong(limit: Int)
    case headerSectionTooLarge(limit: Int)
    case tooManyHeaders(limit: Int)
    case bodyTooLarge(limit: Int64)
    /// An adapter of the policy reads the request body whole (a signer, `readsBody`) and the
    /// body is larger than the policy's `max_body`: nothing is sent.
    case bodyTooLargeForAdapter(adapter: String, limit: Int64)
    case unsupportedTransferCoding(String)
    case unsupportedVersion
    case headerTimeout(milliseconds: Int)
    case connectPortNotAllowed(Int)
    case destinationDenied(host: String)
    case loopDetected
    case upstreamRefused(host: String)
    case dnsFailure(host: String)
    case tlsFailure(host: String, reason: String)
    /// The origin's certificate failed the host's trust evaluator; nothing was sent to it.
    case trustFailure(host: String, evaluator: String, reason: String)
    case upstreamTimeout(host: String, phase: TimeoutPhase)
    case upstreamProtocol(host: String, reason: String)
    /// The parent proxy (`upstream_proxy`) could not be resolved or reached, or refused the
    /// tunnel.
    case parentProxyFailed(proxy: String, reason: String)
    /// A request adapter refused the request; nothing was sent upstream.
    case adapterFailed(name: String, reason: String)
    /// A `lua` script with `on_error: fail_closed` failed (an error, a limit) on the request;
    /// nothing was sent upstream. The body names the request id, never the script's message
    /// (the access log's `lua.error` has it).
    case luaScriptFailed(script: String, requestID: UInt64)
    /// A `lua` script answered the request itself (`req:respond`): the client gets the
    /// script's status, header fields and body, with Sluice's `Content-Length`; nothing was
    /// sent upstream. Not a failure: the exchange ends `ok`, with no error kind counted.
    case luaResponded(script: String, response: LuaResponseView)
    /// The request arrived on a gateway route in a form a route does not take.
    case notOriginForm
    /// The admin API's `POST /requests/cancel` ended the exchange before its response started.
    case cancelledByOperator
    /// `access.proxy_auth` is on and the request's `Proxy-Authorization` is missing, wrong, or
    /// could not be checked now (`reason`); answered with `Proxy-Authenticate`.
    case proxyAuthenticationRequired(reason: ProxyAuthFailure)
    /// `limits.max_connections` client connections were open: answered at accept, without
    /// reading the request (`ConnectionLimits`).
    case tooManyConnections(limit: Int)
    /// The client's address had `limits.max_connections_per_client` connections open.
    case tooManyConnectionsFromClient(limit: Int)
    /// Every upstream slot of the worker was taken and `limits.upstream_queue` requests were
    /// waiting already (`UpstreamAdmission`); nothing was sent upstream.
    case upstreamQueueFull(limit: Int)
    /// The request waited `timeouts.upstream_queue` for an upstream slot; nothing was sent upstream.
    case upstreamQueueTimeout(milliseconds: Int)
    /// No socket could be opened for the upstream connection: the process (EMFILE) or the
    /// system (ENFILE) is out of descriptors, or the kernel out of buffers. Nothing was sent;
    /// the client connection closes, which frees a descriptor.
    case socketUnavailable(host: String, reason: String)
    /// The origin's circuit is open (`health:`, `CircuitBreaker`): it failed
    /// `consecutive_failures` times in a row and its cooldown (or its probe) has not ended;
    /// nothing was sent. `retryAfter`: seconds until a trial may go.
    case upstreamCircuitOpen(host: String, retryAfter: Int)
    /// The request said `Cache-Control: only-if-cached` and the shared cache has no response
    /// it may use without the origin (RFC 9111 §5.2.1.7); nothing was sent upstream.
    case onlyIfCachedMiss
    /// The policy's `rate_limit` (`requests` per `windowSeconds`) is reached and the request
    /// may not wait (`on_limit: reject`) or would wait longer than `max_wait`; nothing was sent.
    /// `retryAfter`: seconds until a request of its key could go.
    case rateLimited(policy: String, requests: Int, windowSeconds: Int, retryAfter: Int)
    /// The origin said its own rate limit is reached (a 429 or 503 with `Retry-After`, or
    /// rate-limit fields with nothing remaining; `rate_limit.learn`), and the request may not
    /// wait that long (`on_limit: reject`, `max_wait`); nothing was sent. `retryAfter`:
    /// seconds until the origin's hold ends.
    case originRateLimited(policy: String, host: String, retryAfter: Int)
    /// `limit` tries of the policy's key hold a place already (`rate_limit.max_concurrent`: from
    /// their turn until their response has been received)
    /// and no place freed within `max_wait` (or `on_limit: reject`); nothing was sent.
    case concurrencyLimited(policy: String, limit: Int)
    /// The fleet's Redis did not answer in time (`fleet.timeout`) and `fleet.on_redis_down` is
    /// `deny`: what a fleet-wide limit covers is refused; nothing was sent.
    case fleetUnavailable(policy: String)
    /// A request signed as another instance's of the fleet (`Sluice-Peer`, `fleet.cache`) whose
    /// signature does not hold (forged, stale, replayed, or a loop); nothing is forwarded.
    case peerRequestRefused(reason: String)

    /// The case without its details: a stable name for counting refusals (the dashboard's
    /// refusals by case, a host's failed exchanges), listed in docs/errors.md. One byte, so an
    /// exchange's summary carries it at no cost.
    public enum Kind: String, Sendable, CaseIterable {
        case malformedRequest = "malformed_request"
        case notAbsoluteURL = "not_absolute_url"
        case badURL = "bad_url"
        case requestLineTooLong = "request_line_too_long"
        case headerSectionTooLarge = "header_section_too_large"
        case tooManyHeaders = "too_many_headers"
        case bodyTooLarge = "body_too_large"
        case bodyTooLargeForAdapter = "body_too_large_for_adapter"
        case unsupportedTransferCoding = "unsupported_transfer_coding"
        case unsupportedVersion = "unsupported_version"
        case headerTimeout = "header_timeout"
        case connectPortNotAllowed = "connect_port_not_allowed"
        case destinationDenied = "destination_denied"
        case loopDetected = "loop_detected"
        case upstreamRefused = "upstream_refused"
        case dnsFailure = "dns_failure"
        case tlsFailure = "tls_failure"
        case trustFailure = "trust_failure"
        case upstreamTimeout = "upstream_timeout"
        case upstreamProtocol = "upstream_protocol"
        case parentProxyFailed = "parent_proxy_failed"
        case adapterFailed = "adapter_failed"
        case luaScriptFailed = "lua_script_failed"
        case luaResponded = "lua_responded"
        case notOriginForm = "not_origin_form"
        case cancelledByOperator = "cancelled_by_operator"
        case proxyAuthenticationRequired = "proxy_authentication_required"
        case tooManyConnections = "too_many_connections"
        case tooManyConnectionsFromClient = "too_many_connections_from_client"
        case upstreamQueueFull = "upstream_queue_full"
        case upstreamQueueTimeout = "upstream_queue_timeout"
        case socketUnavailable = "socket_unavailable"
        case upstreamCircuitOpen = "upstream_circuit_open"
        case onlyIfCachedMiss = "only_if_cached_miss"
        case rateLimited = "rate_limited"
        case originRateLimited = "origin_rate_limited"
        case concurrencyLimited = "concurrency_limited"
        case fleetUnavailable = "fleet_unavailable"
        case peerRequestRefused = "peer_request_refused"
    }

    public var kind: Kind {
        switch self {
        case .malformedRequest: return .malformedRequest
        case .notAbsoluteURL: return .notAbsoluteURL
        case .badURL: return .badURL
        case .requestLineTooLong: return .requestLineTooLong
        case .headerSectionTooLarge: return .headerSectionTooLarge
        case .tooManyHeaders: return .tooManyHeaders
        case .bodyTooLarge: return .bodyTooLarge
        case .bodyTooLargeForAdapter: return .bodyTooLargeForAdapter
        case .unsupportedTransferCoding: return .unsupportedTransferCoding
        case .unsupportedVersion: return .unsupportedVersion
        case .headerTimeout: return .headerTimeout
        case .connectPortNotAllowed: return .connectPortNotAllowed
        case .destinationDenied: return .destinationDenied
        case .loopDetected: return .loopDetected
        case .upstreamRefused: return .upstreamRefused
        case .dnsFailure: return .dnsFailure
        case .tlsFailure: return .tlsFailure
        case .trustFailure: return .trustFailure
        case .upstreamTimeout: return .upstreamTimeout
        case .upstreamProtocol: return .upstreamProtocol
        case .parentProxyFailed: return .parentProxyFailed
        case .adapterFailed: return .adapterFailed
        case .luaScriptFailed: return .luaScriptFailed
        case .luaResponded: return .luaResponded
        case .notOriginForm: return .notOriginForm
        case .cancelledByOperator: return .cancelledByOperator
        case .proxyAuthenticationRequired: return .proxyAuthenticationRequired
        case .tooManyConnections: return .tooManyConnections
        case .tooManyConnectionsFromClient: return .tooManyConnectionsFromClient
        case .upstreamQueueFull: return .upstreamQueueFull
        case .upstreamQueueTimeout: return .upstreamQueueTimeout
        case .socketUnavailable: return .socketUnavailable
        case .upstreamCircuitOpen: return .upstreamCircuitOpen
        case .onlyIfCachedMiss: return .onlyIfCachedMiss
        case .rateLimited: return .rateLimited
        case .originRateLimited: return .originRateLimited
        case .concurrencyLimited: return .concurrencyLimited
        case .fleetUnavailable: return .fleetUnavailable
        case .peerRequestRefused: return .peerRequestRefused
        }
    }

    public var status: Int {
        switch self {
        case .malformedRequest, .notAbsoluteURL, .badURL, .notOriginForm: return 400
        case .connectPortNotAllowed, .destinationDenied, .peerRequestRefused: return 403
        case .proxyAuthenticationRequired: return 407
        case .rateLimited, .originRateLimited, .concurrencyLimited: return 429
        case .headerTimeout: return 408
        case .bodyTooLarge, .bodyTooLargeForAdapter: return 413
        case .requestLineTooLong: return 414
        case .headerSectionTooLarge, .tooManyHeaders: return 431
        case .unsupportedTransferCoding: return 501
        case .unsupportedVersion: return 505
        case .luaResponded(_, let response): return response.status
        case .upstreamRefused, .dnsFailure, .tlsFailure, .trustFailure, .upstreamProtocol, .adapterFailed,
            .luaScriptFailed, .parentProxyFailed:
            return 502
        case .upstreamTimeout, .onlyIfCachedMiss: return 504
        case .loopDetected: return 508
        case .cancelledByOperator, .tooManyConnections, .tooManyConnectionsFromClient, .upstreamQueueFull,
            .upstreamQueueTimeout, .socketUnavailable, .upstreamCircuitOpen, .fleetUnavailable:
            return 503
        }
    }

    /// Whether the client connection is closed after this response. True when the rest of
    /// the byte stream cannot be framed reliably (so nothing after it can be trusted).
    public var closesConnection: Bool {
        switch self {
        case .malformedRequest, .notAbsoluteURL, .badURL, .notOriginForm, .requestLineTooLong, .headerSectionTooLarge,
            .tooManyHeaders, .bodyTooLarge, .bodyTooLargeForAdapter, .unsupportedTransferCoding, .unsupportedVersion,
            .headerTimeout,
            .loopDetected, .cancelledByOperator, .tooManyConnections, .tooManyConnectionsFromClient, .socketUnavailable:
            return true
        case .connectPortNotAllowed, .destinationDenied, .upstreamRefused, .dnsFailure, .tlsFailure, .trustFailure,
            .upstreamTimeout, .upstreamProtocol, .adapterFailed, .luaScriptFailed, .luaResponded, .parentProxyFailed,
            .proxyAuthenticationRequired,
            .upstreamQueueFull, .upstreamQueueTimeout, .upstreamCircuitOpen, .onlyIfCachedMiss, .rateLimited,
            .originRateLimited, .concurrencyLimited, .fleetUnavailable, .peerRequestRefused:
            return false
        }
    }

    /// The `Retry-After` seconds of a refusal that is about load, not about the request: the
    /// client may try again shortly (nil: no `Retry-After`).
    public var retryAfterSeconds: Int? {
        switch self {
        case .tooManyConnections, .tooManyConnectionsFromClient, .upstreamQueueFull, .upstreamQueueTimeout: return 1
        case .upstreamCircuitOpen(_, let seconds): return seconds
        case .rateLimited(_, _, _, let seconds): return seconds
        case .originRateLimited(_, _, let seconds): return seconds
        case .concurrencyLimited, .fleetUnavailable: return 1
        default: return nil
        }
    }

    /// The one-line body, without the `sluice: ` prefix. Never contains request secrets:
    /// only host names, limits and the parser's or libcurl's description of the fault.
    public var message: String {
        switch self {
        case .malformedRequest(let why): return "bad request: \(why)"
        case .notAbsoluteURL:
            return "bad request: this is a forward proxy; send an absolute URL (http://host/path) or CONNECT"
        case .badURL(let why): return "bad request: \(why)"
        case .requestLineTooLong(let limit): return "request line too long (limit \(limit) bytes)"
        case .headerSectionTooLarge(let limit): return "request header section too large (limit \(limit) bytes)"
        case .tooManyHeaders(let limit): return "request header section too large (more than \(limit) fields)"
        case .bodyTooLarge(let limit): return "request body too large (limit \(limit) bytes)"
        case .bodyTooLargeForAdapter(let adapter, let limit):
            return "request body too large for adapter \(adapter), which reads it whole (limit \(limit) bytes, max_body)"
        case .unsupportedTransferCoding(let coding): return "unsupported transfer coding: \(coding)"
        case .unsupportedVersion: return "HTTP version not supported (HTTP/1.0 and HTTP/1.1 are)"
        case .headerTimeout(let ms): return "timeout: request head not received within \(ms) ms"
        case .connectPortNotAllowed(let port): return "CONNECT to port \(port) is not allowed"
        case .destinationDenied(let host): return "destination \(host) is denied by access.deny"
        case .loopDetected: return "loop detected: this request already passed through this proxy"
        case .upstreamRefused(let host): return "upstream \(host) refused the connection"
        case .dnsFailure(let host): return "DNS lookup failed for \(host)"
        case .tlsFailure(let host, let reason): return "TLS failure with upstream \(host): \(reason)"
        case .trustFailure(let host, let evaluator, let reason):
            return "TLS trust evaluation failed for upstream \(host) (evaluator: \(evaluator)): \(reason)"
        case .upstreamTimeout(let host, let phase): return "upstream \(host) timed out (\(phase.rawValue))"
        case .upstreamProtocol(let host, let reason): return "upstream \(host) failed: \(reason)"
        case .parentProxyFailed(let proxy, let reason): return "parent proxy \(proxy) failed: \(reason)"
        case .adapterFailed(let name, let reason): return "adapter \(name) failed: \(reason)"
        case .luaScriptFailed(let script, let id):
            return "script \(script) failed on request \(id) (the access log of that request says why)"
        case .luaResponded(let script, let response): return "script \(script) answered \(response.status) (req:respond)"
        case .notOriginForm:
            return "bad request: this is a gateway route; send origin-form requests (GET /path), not absolute URLs or CONNECT"
        case .cancelledByOperator: return "request cancelled by the proxy's operator"
        case .proxyAuthenticationRequired(let reason): return "proxy authentication required: \(reason.rawValue)"
        case .tooManyConnections(let limit):
            return "overloaded: \(limit) client connections are open (limits.max_connections); retry later"
        case .tooManyConnectionsFromClient(let limit):
            return "overloaded: \(limit) connections from your address are open (limits.max_connections_per_client); retry later"
        case .upstreamQueueFull(let limit):
            return "overloaded: \(limit) requests wait for an upstream slot already (limits.upstream_queue); retry later"
        case .upstreamQueueTimeout(let ms):
            return "overloaded: no upstream slot within \(ms) ms (timeouts.upstream_queue); retry later"
        case .socketUnavailable(let host, let reason): return "cannot open a socket for upstream \(host): \(reason)"
        case .upstreamCircuitOpen(let host, let seconds):
            return "upstream \(host) is failing: its circuit is open (health); retry in \(seconds) s"
        case .onlyIfCachedMiss: return "only-if-cached: no stored response can answer this request"
        case .rateLimited(let policy, let requests, let window, let seconds):
            return
                "rate limit of policy \(policy) reached (\(requests) requests per \(window) s, rate_limit); retry in \(seconds) s"
        case .originRateLimited(let policy, let host, let seconds):
            return
                "\(host) asked for no more requests for now (its rate limit, learned under policy \(policy), rate_limit.learn); retry in \(seconds) s"
        case .concurrencyLimited(let policy, let limit):
            return
                "\(limit) requests of policy \(policy) are in flight already (rate_limit.max_concurrent); retry in 1 s"
        case .fleetUnavailable(let policy):
            return
                "the fleet's Redis does not answer, and policy \(policy)'s rate_limit refuses then (fleet.on_redis_down: deny); retry in 1 s"
        case .peerRequestRefused(let reason): return "peer request refused (fleet.cache): \(reason)"
        }
    }
}

/// Why a `407` (`ProxyError.proxyAuthenticationRequired`): the raw value ends its body. Never
/// says whether a user name exists.
public enum ProxyAuthFailure: String, Sendable, CaseIterable {
    /// No `Proxy-Authorization: Basic …` field.
    case missing = "send Proxy-Authorization (Basic)"
    /// An unknown user or a wrong password.
    case invalid = "invalid user name or password"
    /// New credentials arrived while this worker's hashing budget was spent (a flood of new
    /// credentials); credentials checked before are still accepted.
    case busy = "too many new credentials to check right now; try again"
}

/// Which wait ran out in a `504` (`ProxyError.upstreamTimeout`). The raw value is the text in
/// parentheses of the error body and the access log's `error` (`upstream HOST timed out (PHASE)`).
public enum TimeoutPhase: String, Sendable, CaseIterable {
    /// Connecting to the origin (`timeouts.upstream_connect`), or a CONNECT tunnel's dial.
    case connect
    /// libcurl's total timeout (`timeouts.total`) ran out after the connection was made.
    case transfer
    /// The per-try timeout: no response head within `retry.per_try_timeout` (or
    /// `timeouts.upstream_per_try`) of the try's start.
    case noResponseHead = "no response head in time"
    /// `retry.deadline` had passed when the next try was due.
    case retryDeadlinePassed = "retry deadline passed"
    /// An `oauth2` token endpoint did not answer in time.
    case tokenRequest = "token request"
}
