/// A policy's `cache` section: what the shared cache does with a host's exchanges, when a
/// `cache_store` is configured (without one nothing is cached and nothing is looked up).
///
/// ```yaml
/// policies:
///   default:
///     cache: cache                      # the default: RFC 9111 shared-cache semantics
///   tracker.example:
///     cache: do_not_cache               # never looked up, never stored
///   static.example:
///     cache:
///       modify:
///         freshness: 10m                # overrides the origin's lifetime
///         max_freshness: 1h             # caps it
///         ignore_origin_directives: [no-cache, private]   # loud on purpose
///         drop_response_headers: [Set-Cookie]
///         key_request_headers: [Accept-Language]
/// ```
///
/// Threading: immutable; shared by every worker.
public enum CacheBehavior: Sendable, Equatable {
    case cache
    case doNotCache
    case modify(CacheModification)

    /// `cache` unless the policy says otherwise.
    public static let defaultBehavior = CacheBehavior.cache

    public var modification: CacheModification? {
        if case .modify(let m) = self { return m }
        return nil
    }

    public var caches: Bool { self != .doNotCache }
}

/// The rules of `cache: { modify: … }`.
///
/// Threading: an immutable value, shared by every worker.
public struct CacheModification: Sendable, Equatable {
    /// Origin directives a policy may overrule, each named on purpose.
    public enum IgnorableDirective: String, Sendable, CaseIterable {
        case noCache = "no-cache"
        case isPrivate = "private"
    }

    /// Overrides the freshness lifetime (seconds) of every response of the host.
    public var freshness: Int64?
    /// Caps the freshness lifetime (seconds).
    public var maxFreshness: Int64?
    /// Response directives ignored for this host's origin.
    public var ignoredDirectives: Set<IgnorableDirective>
    /// Response header fields removed before storing (lower-cased).
    public var dropResponseHeaders: [String]
    /// Request header fields added to the cache key (lower-cased), as if the origin had
    /// named them in `Vary`.
    public var keyRequestHeaders: [String]

    public init(
        freshness: Int64? = nil, maxFreshness: Int64? = nil, ignoredDirectives: Set<IgnorableDirective> = [],
        dropResponseHeaders: [String] = [], keyRequestHeaders: [String] = []
    ) {
        self.freshness = freshness
        self.maxFreshness = maxFreshness
        self.ignoredDirectives = ignoredDirectives
        self.dropResponseHeaders = dropResponseHeaders.map { $0.lowercased() }
        self.keyRequestHeaders = keyRequestHeaders.map { $0.lowercased() }
    }
}
