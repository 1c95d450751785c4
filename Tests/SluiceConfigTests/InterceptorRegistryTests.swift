import Foundation
import HTTPTypes
import SluiceCore
import Testing

@testable import SluiceConfig

/// The registry of interceptor kinds is the one list: every kind it names is a choice of the
/// JSON Schema's `adapter`, a row of docs/configuration.md's "Adapters" table, and used in
/// config/sluice.yaml — a kind missing anywhere fails here, by name. And a program's own kind
/// is registered the way docs/library.md shows.
@Suite struct InterceptorRegistryTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    static func text(_ path: String) throws -> String {
        try String(contentsOf: root.appendingPathComponent(path), encoding: .utf8)
    }

    @Test func everyKindIsInTheSchema() throws {
        let data = try Data(contentsOf: Self.root.appendingPathComponent("config/sluice.schema.json"))
        let schema = try JSONSerialization.jsonObject(with: data) as! [String: Any]
        let adapter = (schema["$defs"] as! [String: Any])["adapter"] as! [String: Any]
        var names: Set<String> = []
        for choice in adapter["oneOf"] as! [[String: Any]] {
            for name in choice["required"] as? [String] ?? [] { names.insert(name) }
            if let bare = choice["enum"] as? [String] { names.formUnion(bare) }
            if let bare = choice["const"] as? String { names.insert(bare) }
        }
        for kind in InterceptorRegistry.builtIn.names {
            #expect(names.contains(kind), "config/sluice.schema.json's adapter choices lack \(kind)")
        }
        #expect(names.subtracting(InterceptorRegistry.builtIn.names).isEmpty, "the schema names kinds the registry lacks")
    }

    @Test func everyKindHasARowInTheDocs() throws {
        let docs = try Self.text("docs/configuration.md")
        let start = try #require(docs.range(of: "### Adapters\n"))
        let section = docs[start.upperBound...].prefix { _ in true }
        let end = section.range(of: "\n### ")?.lowerBound ?? section.endIndex
        let table = section[..<end]
        for kind in InterceptorRegistry.builtIn.names {
            #expect(table.contains("| `\(kind)` |"), "docs/configuration.md's Adapters table has no row for \(kind)")
        }
    }

    @Test func everyKindIsInTheExampleConfig() throws {
        let node = try #require(try YAMLReader.read(try Self.text("config/sluice.yaml")))
        var used: Set<String> = []
        guard case .mapping(let policies)? = node["policies"] else {
            Issue.record("config/sluice.yaml has no policies")
            return
        }
        for (_, policy) in policies {
            guard case .sequence(let entries)? = policy["adapters"] else { continue }
            for entry in entries {
                if let word = entry.scalar?.string { used.insert(word) }
                if case .mapping(let m) = entry, let key = m.first?.key.scalar?.string { used.insert(key) }
            }
        }
        for kind in InterceptorRegistry.builtIn.names {
            #expect(used.contains(kind), "config/sluice.yaml uses no \(kind) adapter")
        }
    }

    @Test func anUnknownKindIsALocatedErrorWithASuggestion() {
        let yaml = "policies:\n  h.test:\n    adapters:\n      - aws_sigv5: { service: s3, region: x }\n"
        #expect {
            _ = try ConfigLoader.parse(yaml: yaml, file: "t.yaml")
        } throws: { error in
            let issue = (error as? ConfigError)?.issues.first
            return issue?.line == 4 && issue?.message.contains("did you mean 'aws_sigv4'?") == true
        }
    }

    @Test func aMissingSettingIsLocated() {
        let yaml = "policies:\n  h.test:\n    adapters:\n      - aws_sigv4: { region: eu-west-1 }\n"
        #expect {
            _ = try ConfigLoader.parse(yaml: yaml, file: "t.yaml")
        } throws: { error in
            let issue = (error as? ConfigError)?.issues.first
            return issue?.line == 4 && issue?.message.contains("service") == true
        }
    }

    /// What ends up inside `Signature-Input`'s quoted strings cannot break out of them.
    @Test func aSignatureParameterCannotInjectIntoTheField() {
        setenv("SLUICE_TEST_HMAC", "c2x1aWNlLXRlc3Qtc2hhcmVkLXNlY3JldA==", 1)
        for (key, settings) in [
            ("tag", #"key_id: k, tag: "a\"b""#), ("key_id", #"key_id: "k\"1""#),
        ] {
            let yaml = """
                policies:
                  h.test:
                    adapters:
                      - http_signature: { \(settings), algorithm: hmac-sha256, key: "${SLUICE_TEST_HMAC}" }
                """
            #expect {
                _ = try ConfigLoader.parse(yaml: yaml, file: "t.yaml")
            } throws: { error in
                (error as? ConfigError)?.issues.contains { $0.line == 4 && $0.message.contains("\(key) must be printable ASCII") }
                    ?? false
            }
        }
    }

    // MARK: a program's own kind (docs/library.md, "Your own interceptor kind")

    struct StampAdapter: SynchronousRequestAdapter {
        var name: String { "stamp" }
        let value: String
        func adaptInPlace(_ request: inout ProxyRequest) throws(AdaptationError) -> Bool {
            request.headerFields[HTTPField.Name("X-Stamp")!] = value
            return true
        }
    }

    enum StampKind: InterceptorKind {
        static var name: String { "stamp" }
        static func read(_ settings: YAMLNode?, at entry: YAMLNode, _ reader: inout NodeReader) -> StampAdapter? {
            guard let value = settings?.scalar?.string, !value.isEmpty else {
                reader.fail(entry, "stamp needs a value, e.g. '- stamp: v1'")
                return nil
            }
            return StampAdapter(value: value)
        }
        static func describe(_ adapter: StampAdapter) -> String { "sets X-Stamp: \(adapter.value)" }
    }

    @Test func aProgramRegistersItsOwnKind() throws {
        let kinds = InterceptorRegistry.builtIn.adding(StampKind.self)
        let yaml = "policies:\n  h.test:\n    adapters:\n      - bearer: t0ken\n      - stamp: v1\n"
        let config = try ConfigLoader.parse(yaml: yaml, file: "t.yaml", kinds: kinds)
        let policy = config.pipeline.policies.match(host: "h.test")
        #expect(policy.adapterNames == ["bearer", "stamp"])
        var request = ProxyRequest(id: 1, method: "GET", url: "http://h.test/", headerFields: [:], body: .none)
        #expect(try policy.adapters[1].adapter.adaptInPlace(&request))
        #expect(request.headerFields[HTTPField.Name("X-Stamp")!] == "v1")
        let described = PolicyDescription.describe(config.pipeline, host: "h.test")
        #expect(described.contains("stamp: sets X-Stamp: v1"))
        #expect(described.contains("bearer: <redacted>"))
        // Without the kind, the same file is an error that names it.
        #expect(throws: ConfigError.self) { try ConfigLoader.parse(yaml: yaml, file: "t.yaml") }
        // Without a value, the kind's own located error.
        #expect {
            _ = try ConfigLoader.parse(yaml: "policies:\n  h.test:\n    adapters:\n      - stamp\n", file: "t.yaml", kinds: kinds)
        } throws: { error in
            (error as? ConfigError)?.issues.first.map { $0.line == 4 && $0.message.contains("stamp needs a value") } ?? false
        }
    }

    @Test func signersRunOnEveryTryAndReadTheBody() throws {
        setenv("SLUICE_TEST_HMAC", "c2x1aWNlLXRlc3Qtc2hhcmVkLXNlY3JldA==", 1)
        let yaml = """
            policies:
              h.test:
                max_body: 1KiB
                adapters:
                  - bearer: abc
                  - http_signature: { key_id: k, algorithm: hmac-sha256, key: "${SLUICE_TEST_HMAC}" }
                  - aws_sigv4: { service: s3, region: eu-west-1, payload: unsigned, credentials: { access_key_id: A, secret_access_key: B } }
            """
        let config = try ConfigLoader.parse(yaml: yaml, file: "t.yaml")
        let policy = config.pipeline.policies.match(host: "h.test")
        #expect(policy.interceptor.adapters.map(\.name) == ["bearer"])
        #expect(policy.tryAdapters.map(\.name) == ["http_signature", "aws_sigv4"])
        #expect(policy.bodyReader == "http_signature")
        #expect(policy.maxBody == 1024)
        #expect(ExchangeMachine.replayLimit(for: policy) == 1024)
        let described = PolicyDescription.describe(config.pipeline, host: "h.test")
        #expect(described.contains("aws_sigv4: service s3, region eu-west-1, payload unsigned"))
        #expect(described.contains("(every try)"))
        #expect(!described.contains("c2x1aWNl"))
    }
}
