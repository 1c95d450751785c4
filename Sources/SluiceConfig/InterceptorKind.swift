import SluiceCore

/// One kind of interceptor as a policy's `adapters:` list names it (`- bearer: ${TOKEN}`,
/// `- aws_sigv4: { service: s3, region: eu-west-1 }`): the YAML key, how its settings are
/// read and checked, how `sluice check --host` describes an instance, and the adapter it
/// builds. Each kind is one file in `Sources/SluiceConfig/Kinds/`, named after its key, and
/// one entry in `InterceptorRegistry.builtIn`; a test holds that list, the JSON Schema's
/// `adapter` choices, docs/configuration.md's "Adapters" table and `config/sluice.yaml` to
/// the same names (CONTRIBUTING.md, "Adding an interceptor kind").
///
/// Secrets are named by reading them through `NodeReader.secret` (or `secretOrString` on a
/// reference): whatever is read that way is redacted from logs, `/config` and errors.
///
/// An embedding program registers kinds of its own the same way
/// (`InterceptorRegistry.builtIn.adding(MyKind.self)`, docs/library.md).
public protocol InterceptorKind: SendableMetatype {
    associatedtype Adapter: RequestAdapter
    /// The YAML key (`aws_sigv4`), also the adapter's `name` in errors and events.
    static var name: String { get }
    /// Reads an entry: `settings` is the value under the key, nil for a bare name
    /// (`- deflate`); `entry` is the list item, where an error about the entry as a whole is
    /// reported. Reports every problem through `reader` (located) and answers nil then.
    static func read(_ settings: YAMLNode?, at entry: YAMLNode, _ reader: inout NodeReader) -> Adapter?
    /// One line for `sluice check --host` and `GET /config`, after the key: what the adapter
    /// does, with every secret shown redacted (`Secret`'s description) and where it comes from.
    static func describe(_ adapter: Adapter) -> String
}

extension InterceptorKind {
    static func readAny(_ settings: YAMLNode?, at entry: YAMLNode, _ reader: inout NodeReader) -> (any RequestAdapter)? {
        read(settings, at: entry, &reader)
    }

    static func describeAny(_ adapter: any RequestAdapter) -> String? {
        (adapter as? Adapter).map { "\(name): " + describe($0) }
    }
}

/// The interceptor kinds a configuration may name: the one list (`builtIn`), plus any an
/// embedding program adds. Immutable; read by `ConfigLoader` and `PolicyDescription`.
public struct InterceptorRegistry: Sendable {
    public let kinds: [any InterceptorKind.Type]

    /// Sluice's own kinds, in the order the docs list them.
    public static let builtIn = InterceptorRegistry(kinds: [
        HeadersKind.self,
        BearerKind.self,
        BasicKind.self,
        APIKeyKind.self,
        DeflateKind.self,
        OAuth2Kind.self,
        AWSSigV4Kind.self,
        HTTPSignatureKind.self,
        LuaKind.self,
    ])

    /// The kinds' YAML keys, in order.
    public var names: [String] { kinds.map { $0.name } }

    init(kinds: [any InterceptorKind.Type]) {
        var seen = Set<String>()
        for kind in kinds { precondition(seen.insert(kind.name).inserted, "two interceptor kinds are named \(kind.name)") }
        self.kinds = kinds
    }

    /// This registry and `kind`, whose name must be new (a program's own kind never shadows
    /// a built-in one silently).
    public func adding(_ kind: any InterceptorKind.Type) -> InterceptorRegistry {
        InterceptorRegistry(kinds: kinds + [kind])
    }

    public func kind(named name: String) -> (any InterceptorKind.Type)? {
        kinds.first { $0.name == name }
    }

    /// `adapter` described by the kind that built it; its name alone for an adapter made in
    /// Swift rather than read from YAML.
    public func describe(_ adapter: any RequestAdapter) -> String {
        for kind in kinds {
            if let text = kind.describeAny(adapter) { return text }
        }
        return adapter.name
    }
}
