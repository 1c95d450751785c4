import SluiceCore
import Testing

@testable import SluiceConfig

/// The `trust`, `upstream`, `client_certificate` and `intercept` sections: what they mean
/// once merged, and where a mistake is reported.
@Suite struct TrustConfigTests {
    private func issue(_ yaml: String) -> ConfigIssue? {
        do {
            _ = try ConfigLoader.parse(yaml: yaml, file: "t.yaml")
            return nil
        } catch let error as ConfigError {
            return error.issues.first
        } catch {
            return nil
        }
    }

    private func policies(_ yaml: String) throws -> PolicyTable {
        try ConfigLoader.parse(yaml: yaml, file: "t.yaml").pipeline.policies
    }

    @Test func hostsWithoutTrustGetTheDefaultEvaluator() throws {
        let table = try policies("policies: { a.test: { adapters: [] } }")
        #expect(table.match(host: "a.test").trust.evaluatorName == "default")
        #expect(table.match(host: "a.test").trust.isAllowed)
        #expect(table.match(host: "other.test").trust.requirements == DefaultTrustEvaluator().requirements)
    }

    @Test func allHostsMustBeEvaluatedRefusesHostsWithoutTrust() throws {
        let table = try policies(
            """
            tls: { all_hosts_must_be_evaluated: true }
            policies:
              pinned.test: { trust: { public_keys: ["sha256/\(String(repeating: "A", count: 43))="] } }
            """)
        #expect(table.match(host: "pinned.test").trust.isAllowed)
        #expect(table.match(host: "pinned.test").trust.evaluatorName == "public_keys")
        #expect(!table.match(host: "elsewhere.test").trust.isAllowed)
        #expect(table.match(host: "elsewhere.test").trust.evaluatorName == "none")
    }

    @Test func exactBeatsWildcardAndHostReplacesDefault() throws {
        let pin = "sha256/" + Base64.encode([UInt8](repeating: 7, count: 32))
        let table = try policies(
            """
            policies:
              default: { trust: { default: true, validate_host: false } }
              "*.corp.test": { trust: { public_keys: ["\(pin)"], validate_chain: false } }
              api.corp.test: { trust: default }
            """)
        #expect(table.match(host: "x.corp.test").trust.evaluatorName == "public_keys")
        #expect(table.match(host: "x.corp.test").trust.requirements.publicKeyPins == [[[UInt8](repeating: 7, count: 32)]])
        #expect(!table.match(host: "x.corp.test").trust.requirements.validateChain)
        #expect(table.match(host: "api.corp.test").trust.requirements.validateHost)
        #expect(!table.match(host: "other.test").trust.requirements.validateHost)
    }

    @Test func compositeNeedsEveryMember() throws {
        let pin = "sha256/" + Base64.encode([UInt8](repeating: 1, count: 32))
        let table = try policies(
            """
            policies:
              h.test: { trust: { composite: [default, { public_keys: ["\(pin)"], validate_chain: false }] } }
            """)
        let trust = table.match(host: "h.test").trust
        #expect(trust.evaluatorName == "composite(default, public_keys)")
        #expect(trust.requirements.validateChain)  // default demands it; the looser member can't waive it
        #expect(trust.requirements.publicKeyPins.count == 1)
        #expect(!trust.requirements.isCurlNative)
    }

    @Test func disabledNeedsInsecureAndIsReportedWhereWritten() throws {
        let bad = issue("policies:\n  h.test:\n    trust: { disabled: true }\n")
        #expect(bad?.line == 3)
        #expect(bad?.message.contains("insecure: true") == true)
        let bare = issue("policies:\n  h.test:\n    trust: disabled\n")
        #expect(bare?.line == 3 && bare?.column == 12)
        let table = try policies("policies: { h.test: { trust: { disabled: true, insecure: true } } }")
        #expect(table.match(host: "h.test").trust.requirements.insecure)
        #expect(table.insecurePolicies == ["h.test"])
    }

    @Test func mistakesAreLocatedAndExplained() {
        let unknown = issue("policies:\n  h.test:\n    trust: { pinned_certificate: [/x.pem] }\n")
        #expect(unknown?.line == 3 && unknown?.column == 14)
        #expect(unknown?.message.contains("did you mean 'pinned_certificates'") == true)
        let pin = issue("policies:\n  h.test:\n    trust: { public_keys: [\"sha256/short\"] }\n")
        #expect(pin?.line == 3 && pin?.column == 28)
        #expect(pin?.message.contains("base64 of 32 bytes") == true)
        let file = issue("policies:\n  h.test:\n    trust: { pinned_certificates: [/nonexistent/pin.pem] }\n")
        #expect(file?.message.contains("cannot read /nonexistent/pin.pem") == true)
        let both = issue("policies:\n  h.test:\n    trust: { default: true, public_keys: [] }\n")
        #expect(both?.message.contains("composite") == true)
        let option = issue("policies:\n  h.test:\n    trust: { default: true, validate_chain: false }\n")
        #expect(option?.message.contains("validate_chain") == true)
        let scheme = issue("policies:\n  h.test:\n    upstream: { scheme: ftp }\n")
        #expect(scheme?.line == 3 && scheme?.message.contains("http or https") == true)
    }

    @Test func upstreamClientCertificateAndInterceptMerge() throws {
        let table = try policies(
            """
            policies:
              default: { intercept: false }
              api.test: { upstream: { scheme: https, port: 8443 }, intercept: true }
            """)
        let api = table.match(host: "api.test")
        #expect(api.upstream == UpstreamOverride(scheme: .https, port: 8443))
        #expect(api.intercept)
        #expect(table.intercepts)
        #expect(table.match(host: "other.test").upstream == nil)
        #expect(!table.match(host: "other.test").intercept)
        let missing = issue(
            "policies:\n  h.test:\n    client_certificate: { certificate: /nonexistent.pem, key: /nonexistent.key }\n")
        #expect(missing?.message.contains("readable PEM file") == true)
    }
}
