import SluiceConfig
import SluiceCore
import Testing

/// `fleet.cache:`: every key, the static members, Redis left out, located errors, the secret
/// redacted.
@Suite struct FleetCacheConfigTests {
    static let secret = "peer-secret-0123456789"

    @Test func everyKeyIsReadAndTheStaticMembersIncludeThisInstance() throws {
        let yaml = """
            fleet:
              cache:
                advertise: 10.0.0.1:3128
                secret: \(Self.secret)
                listen: 0.0.0.0:3128
                weight: 2
                peers:
                  - { address: 10.0.0.1:3128, weight: 2 }
                  - { address: "[fd00::2]:3128", weight: 0.5 }
                  - address: 10.0.0.3:3128
            """
        let config = try ConfigLoader.parse(yaml: yaml, file: "f.yaml")
        #expect(config.server.fleet == nil)
        let cache = try #require(config.server.fleetCache)
        #expect(cache.advertise == "10.0.0.1:3128" && cache.secret.value == Self.secret && cache.listen == "0.0.0.0:3128")
        #expect(cache.weight == 2 && cache.peers.map(\.weight) == [2, 0.5, 1])
        #expect(Set(cache.staticMembers.map(\.address)) == ["10.0.0.1:3128", "[fd00::2]:3128", "10.0.0.3:3128"])
        #expect(cache.staticMembers.count == 3)
        #expect(!"\(cache)".contains(Self.secret))
        // With Redis, peers may be left out; without fleet.cache nothing is shared.
        let redis = try ConfigLoader.parse(
            yaml: "fleet: { redis: 127.0.0.1:6379, cache: { advertise: 127.0.0.1:3128, secret: \(Self.secret) } }\n",
            file: "f.yaml")
        #expect(redis.server.fleet != nil && redis.server.fleetCache?.peers == [])
        #expect(redis.server.fleetCache?.staticMembers == [RendezvousOwners.Member(address: "127.0.0.1:3128")])
        #expect(try ConfigLoader.parse(yaml: "fleet: { redis: 127.0.0.1:6379 }\n", file: "f.yaml").server.fleetCache == nil)
    }

    @Test func badSettingsAreLocated() {
        let yaml = """
            fleet:
              timeout: 5ms
              cache:
                advertise: peer.internal:3128
                secret: short
                weight: 0
                peers:
                  - { address: 10.0.0.2:3128 }
                  - { address: 10.0.0.2:3128 }
                  - { weight: 1 }
            """
        #expect {
            try ConfigLoader.parse(yaml: yaml, file: "f.yaml")
        } throws: { error in
            let issues = (error as? ConfigError)?.issues ?? []
            let text = issues.map { "\($0.line): \($0.message)" }.joined(separator: "\n")
            return issues.map(\.line).sorted() == [2, 4, 5, 6, 9, 10]
                && text.contains("fleet.timeout needs fleet.redis")
                && text.contains("fleet.cache.advertise must be an IP:port")
                && text.contains("fleet.cache.secret must be at least 16 bytes")
                && text.contains("fleet.cache.weight must be a number above 0")
                && text.contains("10.0.0.2:3128 is listed twice")
                && text.contains("each entry needs address")
                && !text.contains("short")
        }
        for bad in [
            "fleet: { cache: { advertise: 127.0.0.1:3128, secret: \(Self.secret) } }",
            "fleet: { cache: { secret: \(Self.secret), peers: [{ address: 127.0.0.1:3128 }] } }",
            "fleet: { cache: { advertise: 127.0.0.1:3128, peers: [{ address: 127.0.0.1:3128 }] } }",
            "fleet: { cache: { advertise: 127.0.0.1:3128, secret: \(Self.secret), peers: [{ address: 127.0.0.1:3128, weight: 3 }] } }",
            "listen: [127.0.0.1:3130]\nfleet: { cache: { advertise: 127.0.0.1:3128, secret: \(Self.secret), listen: 127.0.0.1:3130, peers: [{ address: 127.0.0.2:1 }] } }",
        ] {
            #expect(throws: ConfigError.self) { try ConfigLoader.parse(yaml: bad + "\n", file: "f.yaml") }
        }
    }
}
