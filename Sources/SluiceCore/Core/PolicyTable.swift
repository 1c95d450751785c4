/// One entry of `policies:` as written: the sections it names (a `nil` section inherits the
/// default's). Adapters keep the name of the entry they come from, for `sluice check`.
public struct PolicyEntry: Sendable {
    public var name: String
    public var adapters: [any RequestAdapter]
    public var redirect: Redirector?

    public init(name: String, adapters: [any RequestAdapter] = [], redirect: Redirector? = nil) {
        self.name = name
        self.adapters = adapters
        self.redirect = redirect
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
    /// The adapters composed with Alamofire's order rules.
    public let interceptor: Interceptor

    public init(name: String, adapters: [SourcedAdapter], redirector: Redirector) {
        self.name = name
        self.adapters = adapters
        self.redirector = redirector
        interceptor = Interceptor(adapters: adapters.map(\.adapter))
    }

    /// Default-first adapters and section-wise replacement (DESIGN §3).
    public convenience init(merging host: PolicyEntry?, over base: PolicyEntry) {
        let baseAdapters = base.adapters.map { SourcedAdapter(adapter: $0, entry: base.name) }
        let hostAdapters = (host?.adapters ?? []).map { SourcedAdapter(adapter: $0, entry: host!.name) }
        self.init(name: host?.name ?? base.name, adapters: baseAdapters + hostAdapters,
                  redirector: host?.redirect ?? base.redirect ?? .doNotFollow)
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

    public init(entries: [PolicyEntry]) {
        let base = entries.first { $0.name == Self.defaultName } ?? PolicyEntry(name: Self.defaultName)
        defaultPolicy = HostPolicy(merging: nil, over: base)
        var exact: [String: HostPolicy] = [:]
        var wildcards: [(String, HostPolicy)] = []
        for entry in entries where entry.name != Self.defaultName {
            let policy = HostPolicy(merging: entry, over: base)
            if entry.name.hasPrefix("*.") {
                wildcards.append((String(entry.name.dropFirst()).lowercased(), policy))
            } else {
                exact[entry.name.lowercased()] = policy
            }
        }
        self.exact = exact
        self.wildcards = wildcards.sorted { $0.0.count > $1.0.count }
    }

    /// The empty table: the default policy only, with no adapters and no redirects followed.
    public static let empty = PolicyTable(entries: [])

    public func match(host: String) -> HostPolicy {
        let host = host.lowercased()
        if let policy = exact[host] { return policy }
        for (suffix, policy) in wildcards where host.hasSuffix(suffix) && host.count > suffix.count {
            return policy
        }
        return defaultPolicy
    }
}

/// Everything a reload swaps at once: policies, monitors and the redaction rules they share.
public struct Pipeline: Sendable {
    public var policies: PolicyTable
    public var monitors: [any EventMonitorFactory]
    public var redactor: Redactor

    public init(policies: PolicyTable = .empty, monitors: [any EventMonitorFactory] = [],
                redactor: Redactor = Redactor()) {
        self.policies = policies
        self.monitors = monitors
        self.redactor = redactor
    }
}
