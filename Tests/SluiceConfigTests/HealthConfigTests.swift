import SluiceCore
import Testing

@testable import SluiceConfig

/// `health:` in a policy: defaults, inheritance, `none`, located errors.
@Suite struct HealthConfigTests {
    @Test func healthParsesWithDefaultsAndInherits() throws {
        let yaml = """
            policies:
              default:
                health: { consecutive_failures: 3, cooldown: 2s, probe: { path: /healthz, interval: 500ms } }
              plain.example: { health: none }
              defaults.example: { health: {} }
              other.example: {}
            """
        let policies = try ConfigLoader.parse(yaml: yaml, file: "t.yaml").pipeline.policies
        #expect(
            policies.match(host: "other.example").health
                == Health(consecutiveFailures: 3, cooldown: 2000, probe: .init(path: "/healthz", interval: 500)))
        #expect(policies.match(host: "plain.example").health == nil)
        #expect(policies.match(host: "defaults.example").health == Health(consecutiveFailures: 5, cooldown: 10_000, probe: nil))
        #expect(policies.probes)
        let noProbe = try ConfigLoader.parse(yaml: "policies: { default: { health: { probe: { path: /up } } } }", file: "t.yaml")
        #expect(noProbe.pipeline.policies.defaultPolicy.health?.probe == .init(path: "/up", interval: 5000))
        #expect(try !ConfigLoader.parse(yaml: "workers: 1", file: "t.yaml").pipeline.policies.probes)
    }

    @Test func badHealthValuesAreLocated() {
        let yaml = """
            policies:
              default:
                health:
                  consecutive_failures: 0
                  cooldown: soon
                  probe: { path: healthz, interval: 0s }
              a.example:
                health: { probe: { interval: 1s } }
              b.example:
                health: { cooldwn: 1s }
            """
        #expect {
            try ConfigLoader.parse(yaml: yaml, file: "f.yaml")
        } throws: { error in
            let issues = (error as? ConfigError)?.issues ?? []
            return issues.map(\.line) == [4, 5, 6, 6, 8, 10]
                && issues[0].message == "consecutive_failures must be 1 to 1000"
                && issues[1].message == "cooldown must be a duration such as 500ms, 30s or 5m"
                && issues[2].message.hasPrefix("probe path must be an origin-form path")
                && issues[3].message == "interval must be longer than 0"
                && issues[4].message == "health.probe needs a path"
                && issues[5].message.contains("did you mean 'cooldown'")
        }
    }
}
