import SluiceCore
import Testing

@testable import SluiceConfig

/// `rate_limit:` in a policy: one limit or several, the defaults, inheritance, `none`,
/// located errors, and what `sluice check --host` says.
@Suite struct RateLimitConfigTests {
    @Test func rateLimitsParseWithDefaultsAndInherit() throws {
        let yaml = """
            policies:
              default:
                rate_limit: { rate: 100/s, burst: 10 }
              api.example:
                rate_limit:
                  limits: [{ rate: 10/s, burst: 10 }, { rate: 5000/h, burst: 100 }]
                  on_limit: reject
                  key: header:X-Api-Key
              free.example: { rate_limit: none }
              other.example: {}
              users.example: { rate_limit: { rate: 6000/min, max_wait: 500ms, key: user } }
            """
        let policies = try ConfigLoader.parse(yaml: yaml, file: "t.yaml").pipeline.policies
        #expect(
            policies.match(host: "other.example").rateLimit
                == RateLimitSettings(limits: [RateLimit(requests: 100, periodMilliseconds: 1000, burst: 10)]))
        #expect(
            policies.match(host: "api.example").rateLimit
                == RateLimitSettings(
                    limits: [
                        RateLimit(requests: 10, periodMilliseconds: 1000, burst: 10),
                        RateLimit(requests: 5000, periodMilliseconds: 3_600_000, burst: 100),
                    ], onLimit: .reject, key: .header("x-api-key")))
        #expect(policies.match(host: "free.example").rateLimit == nil)
        let users = policies.match(host: "users.example").rateLimit
        #expect(users?.maxWait == 500 && users?.key == .user && users?.limits.first?.interval == 10_000)
        let description = PolicyDescription.describe(
            try ConfigLoader.parse(yaml: yaml, file: "t.yaml").pipeline, host: "api.example")
        #expect(
            description.contains(
                "rate_limit: 10/s (burst 10) and 5000/h (burst 100) per header:x-api-key, in this process; over it a request is answered 429 at once; learns the origin's own limit (429/503 Retry-After, RateLimit, X-RateLimit-*)"
            ))
    }

    @Test func learningAndConcurrencyParse() throws {
        let yaml = """
            policies:
              default:
                rate_limit: { learn: true }
              a.example: { rate_limit: { max_concurrent: 4, learn: false, max_wait: 30s } }
              b.example: { rate_limit: { rate: 5/s, max_concurrent: 2 } }
            """
        let pipeline = try ConfigLoader.parse(yaml: yaml, file: "t.yaml").pipeline
        let policies = pipeline.policies
        #expect(policies.match(host: "x.example").rateLimit == RateLimitSettings(limits: []))
        #expect(
            policies.match(host: "a.example").rateLimit
                == RateLimitSettings(limits: [], maxWait: 30_000, learn: false, maxConcurrent: 4))
        let b = policies.match(host: "b.example").rateLimit
        #expect(b?.limits.count == 1 && b?.maxConcurrent == 2 && b?.learn == true)
        #expect(
            PolicyDescription.describe(pipeline, host: "a.example").contains(
                "rate_limit: at most 4 upstream at once per host, in this process; over it a request waits up to 30000 ms for its turn, then 429\n"
            ))
        #expect(PolicyDescription.describe(pipeline, host: "x.example").contains("rate_limit: only the origin's own limit"))
        #expect {
            try ConfigLoader.parse(
                yaml:
                    "policies:\n  h.example:\n    rate_limit: { learn: false }\n  i.example:\n    rate_limit: { max_concurrent: 0 }\n",
                file: "f.yaml")
        } throws: { error in
            let issues = (error as? ConfigError)?.issues ?? []
            return issues.map(\.line) == [3, 5] && issues[0].message.hasPrefix("rate_limit with learn: false")
                && issues[1].message == "max_concurrent must be 1 to 100000"
        }
    }

    @Test func badRateLimitsAreLocated() {
        let yaml = """
            policies:
              default:
                rate_limit: { rate: 100/day, burst: 0 }
              a.example:
                rate_limit: { burst: 5 }
              b.example:
                rate_limit: { rate: 1/s, on_limit: queue, key: "header:" }
              c.example:
                rate_limit: { rate: 1/s, limits: [{ rate: 2/s }] }
              d.example:
                rate_limit: fast
            """
        #expect {
            try ConfigLoader.parse(yaml: yaml, file: "f.yaml")
        } throws: { error in
            let issues = (error as? ConfigError)?.issues ?? []
            return issues.map(\.line) == [3, 5, 7, 7, 9, 11]
                && issues[0].message.hasPrefix("rate must be a count per s, min or h")
                && issues[1].message.hasPrefix("rate_limit needs a rate")
                && issues[2].message == "on_limit must be wait or reject"
                && issues[3].message.hasPrefix("key must be host, client, user or header:NAME")
                && issues[4].message.hasPrefix("rate_limit has rate and burst, or limits")
                && issues[5].message.hasPrefix("rate_limit must be a mapping")
        }
    }
}

/// `fleet:`: addresses (IP, IPv6, Unix socket; never a host name), every key, located errors.
@Suite struct FleetConfigTests {
    @Test func fleetParsesWithDefaultsAndEveryKey() throws {
        let plain = try ConfigLoader.parse(yaml: "fleet: { redis: 127.0.0.1:6379 }\n", file: "f.yaml").server.fleet
        #expect(plain == FleetSettings(redis: .tcp(host: "127.0.0.1", port: 6379)))
        #expect(plain?.timeout == 20 && plain?.onRedisDown == .localShare && plain?.heartbeat == 2000)
        let yaml = """
            fleet:
              redis: "[::1]:6380"
              database: 2
              username: sluice
              password: s3cret
              key_prefix: "gw:"
              timeout: 5ms
              on_redis_down: deny
              heartbeat: 500ms
            policies:
              default: { rate_limit: { rate: 10/s, scope: local } }
            """
        let config = try ConfigLoader.parse(yaml: yaml, file: "f.yaml")
        let fleet = try #require(config.server.fleet)
        #expect(fleet.redis == .tcp(host: "::1", port: 6380) && fleet.redis.description == "[::1]:6380")
        #expect(fleet.database == 2 && fleet.username == "sluice" && fleet.password?.value == "s3cret")
        #expect(fleet.keyPrefix == "gw:" && fleet.timeout == 5 && fleet.onRedisDown == .deny && fleet.heartbeat == 500)
        #expect(config.pipeline.policies.match(host: "x").rateLimit?.scope == .local)
        for bad in [
            "fleet: { redis: \"::1:6379\" }", "fleet: { redis: \"[::1]16379\" }", "fleet: { redis: 127.0.0.1:6379, username: u }",
        ] {
            #expect(throws: ConfigError.self) { try ConfigLoader.parse(yaml: bad + "\n", file: "f.yaml") }
        }
        let unix = try ConfigLoader.parse(yaml: "fleet: { redis: unix:/run/redis/redis.sock }\n", file: "f.yaml")
        #expect(unix.server.fleet?.redis == .unix(path: "/run/redis/redis.sock"))
    }

    @Test func badFleetSettingsAreLocated() {
        let yaml = """
            fleet:
              redis: redis.internal:6379
              timeout: 0ms
              on_redis_down: panic
            """
        #expect {
            try ConfigLoader.parse(yaml: yaml, file: "f.yaml")
        } throws: { error in
            let issues = (error as? ConfigError)?.issues ?? []
            return issues.map(\.line) == [2, 3, 4]
                && issues[0].message.contains("not the host name 'redis.internal'")
                && issues[1].message == "timeout must be longer than 0"
                && issues[2].message == "on_redis_down must be local_share, allow or deny"
        }
    }
}
