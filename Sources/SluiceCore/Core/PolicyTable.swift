import HTTPTypes
import Synchronization

/// One entry of `policies:` as written: the sections it names (a `nil` section inherits the
/// default's). Adapters keep the name of the entry they come from, for `sluice check`.
public struct PolicyEntry: Sendable {
    /// A section that is either set (to a value, or explicitly off) or inherited.
    public enum Section<Value: Sendable>: Sendable {
        case inherit
        case off
        case on(Value)
        var value: Value? { if case .on(let v) = self { return v } else { return nil } }
    }

    public var name: String
    public var adapters: [any RequestAdapter]
    public var redirect: Redirector?
    public var retry: Section<RetryPolicy>
    public var validate: Section<ResponseValidator>
    public var credentials: Section<Credentials>
    public var trust: Section<any ServerTrustEvaluating>
    public var upstream: Section<UpstreamOverride>
    public var upstreamProxy: Section<UpstreamProxy>
    public var clientCertificate: Section<ClientCertificate>
    public var health: Section<Health>
    /// `rate_limit:`.
    public var rateLimit: Section<RateLimitSettings>
    /// `intercept:`; nil inherits the default's.
    public var intercept: Bool?
    /// `upgrades:`; nil inherits the default's.
    public var upgrades: Upgrades?
    /// `cache:`; nil inherits the default's (`cache`).
    public var cache: CacheBehavior?
    /// `resume:`; nil inherits the default's (on).
    public var resume: Bool?
    /// `max_body:` (bytes); nil inherits the default's (`HostPolicy.defaultMaxBody`).
    public var maxBody: Int64?

    public init(
        name: String, adapters: [any RequestAdapter] = [], redirect: Redirector? = nil,
        retry: Section<RetryPolicy> = .inherit, validate: Section<ResponseValidator> = .inherit,
        credentials: Section<Credentials> = .inherit, trust: Section<any ServerTrustEvaluating> = .inherit,
        upstream: Section<UpstreamOverride> = .inherit, upstreamProxy: Section<UpstreamProxy> = .inherit,
        clientCertificate: Section<ClientCertificate> = .inherit, health: Section<Health> = .inherit,
        intercept: Bool? = nil, upgrades: Upgrades? = nil, rateLimit: Section<RateLimitSettings> = .inherit
    ) {
        self.rateLimit = rateLimit
        self.name = name
        self.adapters = adapters
        self.redirect = redirect
        self.retry = retry
        self.validate = validate
        self.credentials = credentials
        self.trust = trust
        self.upstream = upstream
        self.upstreamProxy = upstreamProxy
        self.clientCertificate = clientCertificate
        self.health = health
        self.intercept = intercept
        self.upgrades = upgrades
    }
}

/// The effective policy for a host: the default entry merged with the host's entry.
/// Immutable and computed once at load; an exchange keeps the one it started with, so a
/// reload never changes a request midway.
public final class HostPolicy: Sendable {
    public struct SourcedAdapter: Sendable {
        public let adapter: any RequestAdapter
        /// The policy entry it comes from (`default` or the host entry's name).
        public let entry: String
    }

    /// The matched entry's name (`default`, `api.example.com`, `*.corp.internal`).
    public let name: String
    public let adapters: [SourcedAdapter]
    public let redirector: Redirector
    public let retryPolicy: RetryPolicy?
    /// Shared by every worker: each host's budget counts its traffic process-wide.
    public let retryBudgets: RetryBudgets?
    public let validator: ResponseValidator?
    public let credentials: Credentials?
    /// Upstream statuses an adapter wants to hear about (oauth2's `refresh_on`).
    public let refreshStatuses: Set<Int>
    /// The adapters composed with Alamofire's order rules, and the retriers: adapters that
    /// also retry (oauth2's refresh on 401) first, then the retry policy. Without the
    /// adapters `modelHeaderPlan` stands for.
    public let interceptor: Interceptor
    /// The once-per-exchange adapters that are fixed header edits and come before `lua`
    /// scripts that are all the rest (`headers`, `bearer`, then a script): their edits are
    /// made as the request model's fields are built, and only the scripts run on the model
    /// (a retry adapts again the model so built). Nil for any other policy.
    public let modelHeaderPlan: HeaderEditPlan?
    /// `modelHeaderPlan.appended` as fields, made once.
    public let modelHeaderFields: [HTTPField]
    /// How TLS connections to the host are evaluated (ServerTrustManager's answer for it).
    public let trust: ServerTrust
    public let upstream: UpstreamOverride?
    /// The HTTP version policy for the host's origin (`upstream.http2`, default `auto`).
    public var http2: HTTP2Mode { upstream?.http2 ?? .auto }
    /// The transport forced for the host's tries (`upstream.engine`); nil: chosen per try by
    /// `UpstreamEngine.choose`.
    public var upstreamEngine: UpstreamEngine? { upstream?.engine }
    /// The parent proxy the host's origin is reached through (`upstream_proxy:`).
    public let upstreamProxy: UpstreamProxy?
    public let clientCertificate: ClientCertificate?
    /// The origins' circuit breaking (`health:`); nil: none (tries never ask `UpstreamHealth`).
    public let health: Health?
    /// The host's rate limits (`rate_limit:`); nil: none (tries never ask `RateLimitTable`).
    /// Boxed: a try reads them with one retain, not a copy of every field.
    public let rateLimiting: RateLimiting?
    public var rateLimit: RateLimitSettings? { rateLimiting?.settings }
    /// CONNECTs to the host are answered with Sluice's own TLS (`sluice ca init`).
    public let intercept: Bool
    /// The protocol upgrades carried for the host and their idle timeout (`upgrades:`).
    public let upgrades: Upgrades
    /// What the shared cache does for the host (`cache:`), when a `cache_store` exists:
    /// `doNotCache` whatever it says when a script of the policy has `on_request` or
    /// `on_response`, so that no stored response reaches a client without its scripts — a
    /// refusal skipped, a rewrite by a request's header or edits made for another client served
    /// from the store. (Scripts with `on_log` alone leave the cache as it is.)
    public let cache: CacheBehavior
    /// A `GET` whose upstream breaks mid-body is resumed (`resume:`, `Resume`). On by default.
    public let resume: Bool
    /// The adapters as one header edit, when each of them is a fixed header edit.
    public let headerEditPlan: HeaderEditPlan?
    /// The adapters' names, in order, for `.requestAdapted`.
    public let adapterNames: [String]
    /// The adapters that run on every try (`AdapterTiming.everyTry`: signers, and scripts with
    /// `every_try` or `read_body`), the scripts first, each kind in its order; they run after
    /// the others (`interceptor.adapters`), in the try stages.
    public let tryAdapters: [any RequestAdapter]
    /// The first adapter that reads the request body whole (`readsBody`), if any: the body is
    /// then read before the first try, up to `maxBody`.
    public let bodyReader: String?
    /// Whether an adapter is a `lua` script: the adapter stages then move its call's record
    /// into the exchange's summary (`LuaStateCache.takeLastCall`), and the response stages and
    /// the exchange's end run its `on_response` and `on_log`.
    public let runsScripts: Bool
    /// The `lua` adapters, in order (empty for most policies).
    public let scripts: [LuaAdapter]
    /// Whether a script of the policy defines `on_response` (`LuaAdapter.hooks`): the
    /// response stage runs only then.
    public let runsResponseScripts: Bool
    /// Whether a script of the policy defines `on_log`: the exchange's end runs them (and
    /// closes the exchange's `ctx`s) only then, or when a hook kept a `ctx` open.
    public let runsLogScripts: Bool
    /// The adapters that run once per exchange (`interceptor.adapters`) are all `lua` scripts
    /// that never wait (after the header edits of `modelHeaderPlan`, if any), and nothing
    /// else needs the request model: no adapter on every try, no redirect followed, no
    /// retrier or learned rate limit (a retry adapts the request again). The scripts then run
    /// on the forwarded request's header lines (`LuaHeaderLines`), and their edits are made as
    /// those lines are copied: no model is built (docs/scripting.md, "Cost").
    public let scriptsOnLines: Bool
    /// The most response-body bytes kept for the scripts that read it (`read_response_body`:
    /// the largest of their `limits.body`); nil when none does, and responses stream.
    public let responseBodyLimit: Int?
    /// The largest request body an adapter that reads it (`bodyReader`) is given (`max_body`);
    /// a larger one is refused with `413`.
    public let maxBody: Int64

    /// `max_body` when no policy sets it: `8 MiB`.
    public static let defaultMaxBody: Int64 = 8 << 20

    public init(
        name: String, adapters: [SourcedAdapter], redirector: Redirector, retryPolicy: RetryPolicy? = nil,
        validator: ResponseValidator? = nil, credentials: Credentials? = nil,
        trust: ServerTrust = .builtInDefault, upstream: UpstreamOverride? = nil,
        upstreamProxy: UpstreamProxy? = nil, clientCertificate: ClientCertificate? = nil,
        health: Health? = nil, intercept: Bool = false, upgrades: Upgrades = .standard,
        cache: CacheBehavior = .defaultBehavior, rateLimit: RateLimitSettings? = nil, resume: Bool = true,
        maxBody: Int64 = HostPolicy.defaultMaxBody
    ) {
        self.resume = resume
        self.maxBody = maxBody
        rateLimiting = rateLimit.map { RateLimiting(policy: name, settings: $0) }
        self.name = name
        self.upgrades = upgrades
        self.trust = trust
        self.upstream = upstream
        self.upstreamProxy = upstreamProxy
        self.clientCertificate = clientCertificate
        self.health = health
        self.intercept = intercept
        headerEditPlan = adapters.isEmpty ? nil : HeaderEditPlan.of(adapters.map(\.adapter))
        adapterNames = adapters.map(\.adapter.name)
        self.adapters = adapters
        self.redirector = redirector
        self.retryPolicy = retryPolicy
        retryBudgets = retryPolicy?.budget.map { RetryBudgets(limits: $0) }
        self.validator = validator
        self.credentials = credentials
        let retriers: [any RequestRetrier] =
            adapters.compactMap { $0.adapter as? any RequestRetrier }
            + (retryPolicy.map { [$0] } ?? [])
        let all = adapters.map(\.adapter)
        // Scripts before signers, whatever the list's order: a signer signs the request as it
        // is sent, so a script that edits it on every try (its body, with `read_body`) must
        // have run (docs/configuration.md, "Request signers").
        tryAdapters =
            all.filter { $0.timing == .everyTry && $0 is LuaAdapter }
            + all.filter { $0.timing == .everyTry && !($0 is LuaAdapter) }
        bodyReader = tryAdapters.first { $0.readsBody }?.name
        scripts = all.compactMap { $0 as? LuaAdapter }
        runsScripts = !scripts.isEmpty
        runsResponseScripts = scripts.contains { $0.hooks.contains(.onResponse) }
        runsLogScripts = scripts.contains { $0.hooks.contains(.onLog) }
        responseBodyLimit = scripts.filter(\.readResponseBody).map(\.limits.body).max()
        // The shared cache answers before the adapters run and stores what one client got: a
        // hit would skip a script's refusal, its rewrite by a request's header, its edits made
        // for one client (`cache` below).
        let scriptsSeeMessages = scripts.contains { !$0.hooks.isDisjoint(with: [.onRequest, .onResponse]) }
        self.cache = scriptsSeeMessages ? .doNotCache : cache
        let once = all.filter { $0.timing != .everyTry }
        let editors = once.prefix { ($0 as? any HeaderEditingAdapter)?.headerEdits != nil }
        if !editors.isEmpty, editors.count < once.count, once[editors.count...].allSatisfy({ $0 is LuaAdapter }) {
            let plan = HeaderEditPlan.of(Array(editors))
            modelHeaderPlan = plan
            modelHeaderFields = (plan?.appended ?? []).compactMap { name, value in
                HTTPField.Name(name).map { HTTPField(name: $0, value: value) }
            }
            interceptor = Interceptor(adapters: Array(once[editors.count...]), retriers: retriers)
        } else {
            modelHeaderPlan = nil
            modelHeaderFields = []
            interceptor = Interceptor(adapters: once, retriers: retriers)
        }
        scriptsOnLines =
            !interceptor.adapters.isEmpty
            && interceptor.adapters.allSatisfy { ($0 as? LuaAdapter).map { !$0.mayWait } ?? false }
            && tryAdapters.isEmpty && retriers.isEmpty && !redirector.follows && rateLimit?.learn != true
        refreshStatuses = adapters.reduce(into: []) { set, sourced in
            if let oauth = sourced.adapter as? OAuth2Authenticator { set.formUnion(oauth.settings.refreshOn) }
        }
    }

    /// Default-first adapters and section-wise replacement (DESIGN §3). A host whose entries
    /// name no `trust` gets the built-in `default` evaluator, or is refused when
    /// `allHostsMustBeEvaluated` (Alamofire's ServerTrustManager flag).
    public convenience init(merging host: PolicyEntry?, over base: PolicyEntry, allHostsMustBeEvaluated: Bool = false) {
        let baseAdapters = base.adapters.map { SourcedAdapter(adapter: $0, entry: base.name) }
        let hostAdapters = (host?.adapters ?? []).map { SourcedAdapter(adapter: $0, entry: host!.name) }
        func pick<V>(_ h: PolicyEntry.Section<V>?, _ b: PolicyEntry.Section<V>) -> V? {
            switch h {
            case nil, .inherit?: return b.value
            case .off?: return nil
            case .on(let v)?: return v
            }
        }
        self.init(
            name: host?.name ?? base.name, adapters: baseAdapters + hostAdapters,
            redirector: host?.redirect ?? base.redirect ?? .doNotFollow,
            retryPolicy: pick(host?.retry, base.retry), validator: pick(host?.validate, base.validate),
            credentials: pick(host?.credentials, base.credentials),
            trust: pick(host?.trust, base.trust).map(ServerTrust.init)
                ?? (allHostsMustBeEvaluated ? .refused : .builtInDefault),
            upstream: pick(host?.upstream, base.upstream),
            upstreamProxy: pick(host?.upstreamProxy, base.upstreamProxy),
            clientCertificate: pick(host?.clientCertificate, base.clientCertificate),
            health: pick(host?.health, base.health),
            intercept: host?.intercept ?? base.intercept ?? false,
            upgrades: host?.upgrades ?? base.upgrades ?? .standard,
            cache: host?.cache ?? base.cache ?? .defaultBehavior,
            rateLimit: pick(host?.rateLimit, base.rateLimit),
            resume: host?.resume ?? base.resume ?? true,
            maxBody: host?.maxBody ?? base.maxBody ?? HostPolicy.defaultMaxBody)
    }
}

/// Maps a host to its effective policy: an exact name beats any wildcard, and among
/// wildcards (`*.suffix`) the longest suffix wins. Host names compare case-insensitively.
public final class PolicyTable: Sendable {
    public static let defaultName = "default"

    public let defaultPolicy: HostPolicy
    private let exact: [String: HostPolicy]
    /// `(".suffix", policy)`, longest suffix first.
    private let wildcards: [(String, HostPolicy)]

    /// Whether any host's policy intercepts CONNECTs (the interception CA is then needed).
    public let intercepts: Bool
    /// Policies whose trust is `disabled`, for the start-up warning.
    public let insecurePolicies: [String]
    /// Policies whose `cache: { modify: { ignore_origin_directives } }` overrule the origin,
    /// with the directives (sorted): warned about at every load, as insecure trust is.
    public let cacheOverrulingPolicies: [(name: String, directives: [String])]
    /// Every policy's name, `default` first, then in the file's order.
    public let names: [String]
    private let named: [String: HostPolicy]
    /// Whether any policy's `health:` has a probe (the probe timer runs then).
    public let probes: Bool
    /// Every `lua` script the policies run (`LuaScript.identity`): what each worker's
    /// `LuaStateCache` keeps when this table takes effect (`retain(only:)`).
    public let scripts: Set<String>
    /// Unique to this table in the process (every load and reload builds a new one): what the
    /// shared cache records with an `https` entry, the trust it was fetched under.
    public let generation: UInt64
    private static let generations = Atomic<UInt64>(0)

    public init(entries: [PolicyEntry], allHostsMustBeEvaluated: Bool = false) {
        let base = entries.first { $0.name == Self.defaultName } ?? PolicyEntry(name: Self.defaultName)
        defaultPolicy = HostPolicy(merging: nil, over: base, allHostsMustBeEvaluated: allHostsMustBeEvaluated)
        var all = [defaultPolicy]
        var exact: [String: HostPolicy] = [:]
        var wildcards: [(String, HostPolicy)] = []
        for entry in entries where entry.name != Self.defaultName {
            let policy = HostPolicy(merging: entry, over: base, allHostsMustBeEvaluated: allHostsMustBeEvaluated)
            all.append(policy)
            if entry.name.hasPrefix("*.") {
                wildcards.append((String(entry.name.dropFirst()).lowercased(), policy))
            } else {
                exact[entry.name.lowercased()] = policy
            }
        }
        self.exact = exact
        self.wildcards = wildcards.sorted { $0.0.count > $1.0.count }
        intercepts = all.contains { $0.intercept }
        insecurePolicies = all.filter { $0.trust.requirements.insecure }.map(\.name)
        cacheOverrulingPolicies = all.compactMap { policy in
            guard let ignored = policy.cache.modification?.ignoredDirectives, !ignored.isEmpty else { return nil }
            return (policy.name, ignored.map(\.rawValue).sorted())
        }
        names = all.map(\.name)
        named = Dictionary(all.map { ($0.name, $0) }, uniquingKeysWith: { first, _ in first })
        probes = all.contains { $0.health?.probe != nil }
        scripts = Set(all.flatMap { $0.adapters.compactMap { ($0.adapter as? LuaAdapter)?.script.identity } })
        generation = Self.generations.add(1, ordering: .relaxed).newValue
    }

    /// The empty table: the default policy only, with no adapters and no redirects followed.
    public static let empty = PolicyTable(entries: [])

    /// The policy of that name, as the file wrote it (`default`, `api.example.com`, `*.example.com`).
    public func policy(named name: String) -> HostPolicy? { named[name] }

    public func match(host: String) -> HostPolicy {
        if exact.isEmpty && wildcards.isEmpty { return defaultPolicy }
        let host = host.lowercased()
        if let policy = exact[host] { return policy }
        for (suffix, policy) in wildcards where host.hasSuffix(suffix) && host.count > suffix.count {
            return policy
        }
        return defaultPolicy
    }
}

/// Everything a reload swaps at once: policies, monitors and the redaction rules they share,
/// and the proxy's users (`access.proxy_auth`: its users file is re-read on reload too).
public struct Pipeline: Sendable {
    public var policies: PolicyTable
    public var monitors: [any EventMonitorFactory]
    public var redactor: Redactor
    /// nil: forward-proxy clients need no credentials (the default).
    public var proxyAuthentication: ProxyAuthentication?
    /// An adapter as `sluice check --host` and `GET /config` show it (secrets redacted): set
    /// by the loader from the kind that read it; the adapter's name otherwise.
    public var describeAdapter: @Sendable (any RequestAdapter) -> String = { $0.name }

    public init(
        policies: PolicyTable = .empty, monitors: [any EventMonitorFactory] = [],
        redactor: Redactor = Redactor()
    ) {
        self.policies = policies
        self.monitors = monitors
        self.redactor = redactor
    }
}
