import HTTPTypes
import Synchronization

/// What an adapter may ask of the worker it runs on: Alamofire passes `Session` to
/// `adapt(_:for:completion:)`; Sluice passes the worker's session core.
///
/// Threading: an instance belongs to one worker thread; call it only there. `waker` is the
/// part other threads may use.
public protocol SessionContext: AnyObject {
    /// POSTs through this worker's libcurl session (same trust settings as every upstream);
    /// `completion` runs on this worker's thread.
    func post(
        url: String, headers: [(String, String)], body: [UInt8],
        completion: @escaping (Result<(status: Int, body: [UInt8]), ProxyError>) -> Void)
    /// Keeps `work` to run on this worker's thread after `waker.wake()` is called (from any
    /// thread); `work` returns false to stay queued for the next wake.
    func park(_ work: @escaping () -> Bool)
    var waker: any SessionWaker { get }
    var monitor: (any EventMonitor)? { get }
    /// The fleet's token store (`fleet:`), when there is one: one token per credential for
    /// every instance.
    var sharedTokens: (any SharedTokenStore)? { get }
    /// What `lua` scripts that wait (`sluice.http`) use of the worker; nil where they cannot.
    var lua: (any LuaHost)? { get }
}

extension SessionContext {
    public var sharedTokens: (any SharedTokenStore)? { nil }
    public var lua: (any LuaHost)? { nil }
}

/// Tokens shared by a fleet of instances (docs/fleet.md): each call answers once, on the
/// worker's thread, within the store's timeout — `nil` / `.unavailable` when the store cannot
/// answer (the caller then does what one instance alone would).
public protocol SharedTokenStore: AnyObject {
    /// The token kept for `key` and the milliseconds it has left.
    func token(_ key: String, completion: @escaping (SharedToken) -> Void)
    /// Takes the right to fetch `key`'s token (`true`), or finds another instance fetching it
    /// (`false`: `awaitToken` then), or cannot tell (`nil`).
    func lock(_ key: String, completion: @escaping (Bool?) -> Void)
    /// Waits (bounded) for the instance that holds the lock to store the token.
    func awaitToken(_ key: String, completion: @escaping (SharedToken) -> Void)
    /// Keeps `token` for `milliseconds` and gives the lock back.
    func store(_ key: String, token: String, milliseconds: Int)
    /// Gives the lock back without a token (the fetch failed).
    func unlock(_ key: String)
    /// Forgets `token` if it is still the one kept (a newer one is never thrown away).
    func invalidate(_ key: String, token: String)
}

public enum SharedToken: Sendable, Equatable {
    case found(token: String, milliseconds: Int)
    case none
    case unavailable
}

/// Wakes a worker's parked work; safe from any thread.
public protocol SessionWaker: Sendable {
    func wake()
    /// Identifies the worker, so it is woken once however many of its requests wait.
    var id: Int { get }
}

/// The `oauth2` adapter (Alamofire's `AuthenticationInterceptor` with an OAuth 2 client
/// credentials or refresh token grant). One instance is shared by every worker: the token,
/// the single fetch in flight and the refresh window live behind one lock; requests that wait
/// for a token are parked on their own worker, never blocking a thread.
public final class OAuth2Authenticator: RequestAdapter, RequestRetrier, Sendable {
    public enum Grant: String, Sendable {
        case clientCredentials = "client_credentials"
        case refreshToken = "refresh_token"
    }
    public enum ClientAuthentication: String, Sendable { case basic, body }

    public struct Settings: Sendable {
        public var grant: Grant
        public var tokenURL: String
        public var clientID: String
        public var clientSecret: Secret?
        public var refreshToken: Secret?
        public var scope: String?
        public var audience: String?
        public var clientAuthentication: ClientAuthentication
        /// `30 s` by default.
        public var refreshBeforeExpiry: Int
        /// At most `windowMax` refreshes per `windowMilliseconds` (Alamofire's RefreshWindow:
        /// 5 per 30 s by default).
        public var windowMax: Int
        public var windowMilliseconds: Int
        /// `[401]` by default.
        public var refreshOn: Set<Int>
        /// With a `fleet:`, the token is shared by every instance (`share: false` keeps it in
        /// this process).
        public var share = true

        public init(
            grant: Grant, tokenURL: String, clientID: String, clientSecret: Secret?, refreshToken: Secret? = nil,
            scope: String? = nil, audience: String? = nil, clientAuthentication: ClientAuthentication = .basic,
            refreshBeforeExpiry: Int = 30_000, windowMax: Int = 5, windowMilliseconds: Int = 30_000,
            refreshOn: Set<Int> = [401]
        ) {
            self.grant = grant
            self.tokenURL = tokenURL
            self.clientID = clientID
            self.clientSecret = clientSecret
            self.refreshToken = refreshToken
            self.scope = scope
            self.audience = audience
            self.clientAuthentication = clientAuthentication
            self.refreshBeforeExpiry = refreshBeforeExpiry
            self.windowMax = windowMax
            self.windowMilliseconds = windowMilliseconds
            self.refreshOn = refreshOn
        }
    }

    struct State {
        var token: String?
        var expiresAt: Int = 0
        var refreshToken: String?
        var fetching = false
        var failure: String?
        /// Incremented per finished fetch, so parked requests know a new answer is in.
        var generation = 0
        var refreshTimes: [Int] = []
        var wakers: [any SessionWaker] = []
        /// A token an upstream refused (`refresh_on`): a shared copy of it is not taken again.
        var refused: String?
    }

    public var name: String { "oauth2" }
    public let settings: Settings
    private let state: Mutex<State>

    public init(settings: Settings) {
        self.settings = settings
        state = Mutex(State(refreshToken: settings.refreshToken?.value))
    }

    static func now() -> Int { MonotonicClock.milliseconds() }

    public func adapt(_ request: ProxyRequest, completion: @escaping (Result<ProxyRequest, AdaptationError>) -> Void) {
        completion(.failure(AdaptationError(adapter: name, reason: "needs a session to fetch tokens")))
    }

    public func adapt(
        _ request: ProxyRequest, for session: any SessionContext,
        completion: @escaping (Result<ProxyRequest, AdaptationError>) -> Void
    ) {
        enum Next {
            case apply(String)
            case fail(String)
            case wait(startFetch: Bool, generation: Int)
        }
        let now = Self.now()
        let next: Next = state.withLock { s in
            if let token = s.token, now < s.expiresAt - settings.refreshBeforeExpiry { return .apply(token) }
            if !s.wakers.contains(where: { $0.id == session.waker.id }) { s.wakers.append(session.waker) }
            if s.fetching { return .wait(startFetch: false, generation: s.generation) }
            s.refreshTimes = s.refreshTimes.filter { now - $0 < settings.windowMilliseconds }
            if s.refreshTimes.count >= settings.windowMax {
                return .fail(
                    "excessive refresh: more than \(settings.windowMax) token refreshes in \(settings.windowMilliseconds) ms")
            }
            s.refreshTimes.append(now)
            s.fetching = true
            return .wait(startFetch: true, generation: s.generation)
        }
        switch next {
        case .apply(let token):
            completion(.success(Self.applying(token, to: request)))
        case .fail(let why):
            completion(.failure(AdaptationError(adapter: name, reason: why)))
        case .wait(let startFetch, let generation):
            session.park { [self] in
                let outcome: FetchOutcome? = state.withLock { s in
                    if s.generation == generation { return nil }
                    if let failure = s.failure { return .failed(failure) }
                    return s.token.map { .token($0, nil, nil) } ?? .failed("no token")
                }
                switch outcome {
                case nil: return false
                case .token(let token, _, _)?: completion(.success(Self.applying(token, to: request)))
                case .failed(let why)?: completion(.failure(AdaptationError(adapter: name, reason: why)))
                }
                return true
            }
            if startFetch { fetch(on: session) }
        }
    }

    static func applying(_ token: String, to request: ProxyRequest) -> ProxyRequest {
        var request = request
        request.headerFields[.authorization] = "Bearer " + token
        return request
    }

    /// One upstream status in `refreshOn` on the first try: the token is dropped (unless a
    /// newer one already replaced it) and the request retried once with a fresh one.
    public func retry(
        _ request: ProxyRequest, dueTo failure: TryFailure, attempt: Int,
        completion: @escaping (RetryResult) -> Void
    ) {
        guard case .status(let code, _) = failure, settings.refreshOn.contains(code), attempt == 0 else {
            return completion(.doNotRetry)
        }
        let used = request.headerFields[.authorization]
        state.withLock { s in
            if let token = s.token, used == "Bearer " + token {
                s.token = nil
                s.refused = token
            }
        }
        completion(.retry)
    }

    /// The fleet's key for this credential: a hash of the token URL, the client and the scope
    /// (the client id is not in it as written).
    public var sharedKey: String {
        let identity = [settings.tokenURL, settings.clientID, settings.scope ?? "", settings.audience ?? ""]
            .joined(separator: "\u{0}")
        return Hex.lowercase(Crypto.sha256(Array(identity.utf8)).prefix(16))
    }

    /// A token is needed: from the fleet when one is kept there (or another instance is
    /// fetching it), else from the token endpoint — with the fleet's lock, so that one instance
    /// at a time fetches, and the token is kept for the others.
    private func fetch(on session: any SessionContext) {
        guard settings.share, let shared = session.sharedTokens else { return fetchFromEndpoint(on: session, shared: nil) }
        let key = sharedKey
        let refused = state.withLock { $0.refused }
        shared.token(key) { [self] found in
            switch found {
            case .found(let token, let ms) where token != refused && ms > settings.refreshBeforeExpiry + Self.sharedMargin:
                finish(.token(token, ms, nil), monitor: nil)
            case .unavailable:
                fetchFromEndpoint(on: session, shared: nil)
            case .found(let token, _):
                // Refused upstream, or about to expire: replaced (if still the one kept).
                if token == refused { shared.invalidate(key, token: token) }
                lockThenFetch(on: session, shared, key)
            case .none:
                lockThenFetch(on: session, shared, key)
            }
        }
    }

    private func lockThenFetch(on session: any SessionContext, _ shared: any SharedTokenStore, _ key: String) {
        shared.lock(key) { [self] acquired in
            switch acquired {
            case true?:
                fetchFromEndpoint(on: session, shared: (shared, key))
            case false?:
                shared.awaitToken(key) { [self] found in
                    if case .found(let token, let ms) = found, ms > settings.refreshBeforeExpiry + Self.sharedMargin {
                        finish(.token(token, ms, nil), monitor: nil)
                    } else {
                        fetchFromEndpoint(on: session, shared: nil)  // the other instance failed or is slow
                    }
                }
            case nil:
                fetchFromEndpoint(on: session, shared: nil)
            }
        }
    }

    private func fetchFromEndpoint(on session: any SessionContext, shared: (store: any SharedTokenStore, key: String)?) {
        var form: [(String, String)] = [("grant_type", settings.grant.rawValue)]
        let refresh = state.withLock { $0.refreshToken }
        if settings.grant == .refreshToken, let refresh { form.append(("refresh_token", refresh)) }
        if let scope = settings.scope { form.append(("scope", scope)) }
        if let audience = settings.audience { form.append(("audience", audience)) }
        var headers = [("Content-Type", "application/x-www-form-urlencoded"), ("Accept", "application/json")]
        switch settings.clientAuthentication {
        case .basic:
            let pair = Self.formEncode(settings.clientID) + ":" + Self.formEncode(settings.clientSecret?.value ?? "")
            headers.append(("Authorization", "Basic " + Base64.encode(Array(pair.utf8))))
        case .body:
            form.append(("client_id", settings.clientID))
            if let secret = settings.clientSecret { form.append(("client_secret", secret.value)) }
        }
        let body = form.map { Self.formEncode($0.0) + "=" + Self.formEncode($0.1) }.joined(separator: "&")
        let monitor = session.monitor
        session.post(url: settings.tokenURL, headers: headers, body: Array(body.utf8)) { [self] result in
            let outcome: FetchOutcome
            switch result {
            case .failure(let error):
                outcome = .failed("token endpoint: \(error.message)")
            case .success(let response) where !(200..<300).contains(response.status):
                outcome = .failed("token endpoint answered \(response.status)")
            case .success(let response):
                outcome = Self.parseToken(response.body)
            }
            if let shared {
                if case .token(let token, let expiresIn, _) = outcome {
                    shared.store.store(shared.key, token: token, milliseconds: expiresIn ?? 3_600_000)
                } else {
                    shared.store.unlock(shared.key)
                }
            }
            finish(outcome, monitor: monitor)
        }
    }

    /// A fetch ended (from the endpoint, or from the fleet's store: no event then): the token
    /// (or the failure) is kept and the waiting requests are woken.
    private func finish(_ outcome: FetchOutcome, monitor: (any EventMonitor)?) {
        let wakers: [any SessionWaker] = state.withLock { s in
            s.fetching = false
            s.generation += 1
            switch outcome {
            case .token(let token, let expiresIn, let refreshToken):
                s.token = token
                s.failure = nil
                s.refused = nil
                s.expiresAt = Self.now() + (expiresIn ?? 3_600_000)
                if let refreshToken { s.refreshToken = refreshToken }
            case .failed(let why):
                s.token = nil
                s.failure = why
            }
            defer { s.wakers = [] }
            return s.wakers
        }
        switch outcome {
        case .token: monitor?.handle(.credentialRefreshed(source: settings.tokenURL))
        case .failed(let why): monitor?.handle(.credentialRefreshFailed(source: settings.tokenURL, reason: why))
        }
        for waker in wakers { waker.wake() }
    }

    /// A token from the fleet must outlive the refresh point by this much (ms): one due for
    /// refresh is fetched anew, not taken again and again.
    static let sharedMargin = 5_000

    enum FetchOutcome {
        /// access token, its lifetime in milliseconds (`expires_in` × 1000), a new refresh token
        case token(String, Int?, String?)
        case failed(String)
    }

    static func parseToken(_ body: [UInt8]) -> FetchOutcome {
        guard let object = JSONObjectFields(body), let token = object.string("access_token"), !token.isEmpty
        else { return .failed("token endpoint sent no access_token") }
        let expires = object.integer("expires_in")
        return .token(token, expires.map { min($0, 100_000_000) * 1000 }, object.string("refresh_token"))
    }

    /// application/x-www-form-urlencoded, also used for Basic client credentials (RFC 6749 §2.3.1).
    static func formEncode(_ s: String) -> String {
        PercentEncoding.encodeQueryValue(s)
    }
}
