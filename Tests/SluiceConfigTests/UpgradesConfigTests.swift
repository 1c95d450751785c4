import SluiceConfig
import SluiceCore
import Testing

/// `upgrades:` (Sources/SluiceConfig/UpgradesReader.swift, Sources/SluiceCore/Features/Upgrades.swift).
struct UpgradesConfigTests {
    @Test func defaultIsWebSocketWithFiveMinuteIdle() throws {
        let config = try ConfigLoader.parse(yaml: "workers: 1", file: "t.yaml")
        let upgrades = config.pipeline.policies.match(host: "example.com").upgrades
        #expect(upgrades.allowed == ["websocket"])
        #expect(upgrades.idleTimeout == 300_000)
    }

    @Test func listAndMapFormsAndInheritance() throws {
        let yaml = """
            policies:
              default:
                upgrades: { allow: [WebSocket, h2c], idle_timeout: 30s }
              none.example: { upgrades: [] }
              other.example: { retry: { limit: 1 } }
            """
        let policies = try ConfigLoader.parse(yaml: yaml, file: "t.yaml").pipeline.policies
        #expect(policies.match(host: "x.example").upgrades == Upgrades(allowed: ["websocket", "h2c"], idleTimeout: 30_000))
        #expect(policies.match(host: "none.example").upgrades.allowed.isEmpty)
        #expect(policies.match(host: "other.example").upgrades.idleTimeout == 30_000)
    }

    @Test func badValuesNameTheirLocation() {
        let yaml = """
            policies:
              a.example: { upgrades: websocket }
              b.example: { upgrades: ["web socket"] }
              c.example: { upgrades: { allow: [websocket], idle_timeout: soon } }
              d.example: { upgrades: { allowed: [websocket] } }
            """
        #expect {
            try ConfigLoader.parse(yaml: yaml, file: "f.yaml")
        } throws: { error in
            let issues = (error as? ConfigError)?.issues ?? []
            return issues.map(\.line) == [2, 3, 4, 5]
                && issues[0].message.hasPrefix("upgrades must be a list of protocol names")
                && issues[1].message.hasPrefix("invalid upgrade protocol 'web socket'") && issues[1].column == 27
                && issues[2].message == "upgrades.idle_timeout must be a duration such as 500ms, 30s or 5m"
                && issues[3].message.contains("allowed")
        }
    }

    @Test func forwardedValueKeepsOnlyAllowedProtocols() {
        let standard = Upgrades.standard
        #expect(standard.forwardedValue(offering: ["websocket"]) == "websocket")
        #expect(standard.forwardedValue(offering: ["WebSocket"]) == "WebSocket")
        #expect(standard.forwardedValue(offering: ["h2c, websocket/13"]) == "websocket/13")
        #expect(standard.forwardedValue(offering: ["h2c"]) == nil)
        #expect(standard.forwardedValue(offering: [" , "]) == nil)
        #expect(Upgrades(allowed: []).forwardedValue(offering: ["websocket"]) == nil)
        #expect(Upgrades(allowed: ["h2c", "websocket"]).forwardedValue(offering: ["h2c", "websocket"]) == "h2c, websocket")
    }
}
