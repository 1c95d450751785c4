import SluiceCore

extension NodeReader {
    /// `rate_limit:` in a policy: `{ rate: 100/s, burst: 10, on_limit: wait, max_wait: 2s,
    /// key: host, learn: true, max_concurrent: 8 }`, or with several limits `{ limits: [{ rate:
    /// 10/s, burst: 10 }, { rate: 5000/h, burst: 100 }], … }`, or only `{ learn: true }` / `{
    /// max_concurrent: N }`, or `none` (no limit for a host under a default that has one). Behaviour: Sources/SluiceCore/Features/RateLimit.swift and
    /// Sources/SluiceServer/Stages/QuotaStage.swift.
    mutating func readRateLimit(_ node: YAMLNode) -> PolicyEntry.Section<RateLimitSettings> {
        if let word = node.scalar?.string {
            if word == "none" || word == "off" { return .off }
            fail(node, "rate_limit must be a mapping such as { rate: 100/s, burst: 10 }, or none")
            return .inherit
        }
        var settings = RateLimitSettings(limits: [])
        var single: (rate: YAMLNode?, burst: YAMLNode?) = (nil, nil)
        var list: YAMLNode?
        var learn: YAMLNode?
        var concurrent: YAMLNode?
        let known = ["rate", "burst", "limits", "on_limit", "max_wait", "key", "learn", "max_concurrent", "scope"]
        entries(node, in: "rate_limit", known: known) { r, key, value in
            switch key {
            case "rate": single.rate = value
            case "burst": single.burst = value
            case "limits": list = value
            case "on_limit":
                if let word = value.scalar?.string, let onLimit = RateLimitSettings.OnLimit(rawValue: word) {
                    settings.onLimit = onLimit
                } else {
                    r.fail(value, "on_limit must be wait or reject")
                }
            case "max_wait":
                if let ms = r.duration(value, key: key) { settings.maxWait = ms }
            case "scope":
                if let word = value.scalar?.string, let scope = RateLimitSettings.Scope(rawValue: word) {
                    settings.scope = scope
                } else {
                    r.fail(value, "scope must be fleet or local")
                }
            case "learn":
                learn = value
                if let on = r.bool(value, key: key) { settings.learn = on }
            case "max_concurrent":
                concurrent = value
                if let n = value.scalar.flatMap({ Int($0.string) }), n >= 1, n <= 100_000 {
                    settings.maxConcurrent = n
                } else {
                    r.fail(value, "max_concurrent must be 1 to 100000")
                }
            default:
                if let key = r.rateLimitKey(value) { settings.key = key }
            }
        }
        if let list {
            if single.rate != nil || single.burst != nil {
                fail(node, "rate_limit has rate and burst, or limits: a list of { rate, burst }, not both")
            }
            guard case .sequence(let items) = list, !items.isEmpty else {
                fail(list, "limits must be a list of { rate, burst }")
                return .inherit
            }
            for item in items {
                var rate: YAMLNode?
                var burst: YAMLNode?
                entries(item, in: "rate_limit.limits", known: ["rate", "burst"]) { _, key, value in
                    if key == "rate" { rate = value } else { burst = value }
                }
                if let limit = rateLimit(rate, burst, at: item) { settings.limits.append(limit) }
            }
        } else if single.rate != nil || single.burst != nil || (learn == nil && concurrent == nil) {
            if let limit = rateLimit(single.rate, single.burst, at: node) { settings.limits.append(limit) }
        }
        if settings.limits.isEmpty && settings.maxConcurrent == nil && !settings.learn {
            if learn != nil && concurrent == nil && single.rate == nil && list == nil {
                fail(node, "rate_limit with learn: false and no rate or max_concurrent limits nothing (write none)")
            }
            return .inherit
        }
        return .on(settings)
    }

    /// One limit from its `rate` (`100/s`, `6000/min`, `5000/h`) and `burst` (default 1).
    private mutating func rateLimit(_ rate: YAMLNode?, _ burst: YAMLNode?, at node: YAMLNode) -> RateLimit? {
        guard let rate else {
            fail(node, "rate_limit needs a rate such as 100/s, 6000/min or 5000/h")
            return nil
        }
        guard let text = rate.scalar?.string, let parsed = RateLimitSettings.parseRate(text) else {
            fail(rate, "rate must be a count per s, min or h, such as 100/s, 6000/min or 5000/h")
            return nil
        }
        var burstCount = 1
        if let burst {
            guard let n = burst.scalar.flatMap({ Int($0.string) }), n >= 1, n <= 1_000_000 else {
                fail(burst, "burst must be 1 to 1000000")
                return nil
            }
            burstCount = n
        }
        return RateLimit(requests: parsed.requests, periodMilliseconds: parsed.periodMilliseconds, burst: burstCount)
    }

    /// `host`, `client`, `user` or `header:NAME`.
    private mutating func rateLimitKey(_ node: YAMLNode) -> RateLimitSettings.Key? {
        guard let word = node.scalar?.string else {
            fail(node, "key must be host, client, user or header:NAME")
            return nil
        }
        switch word {
        case "host": return .host
        case "client": return .client
        case "user": return .user
        default:
            let name = word.hasPrefix("header:") ? String(word.dropFirst("header:".count)) : ""
            guard !name.isEmpty, name.utf8.allSatisfy({ Self.isTokenByte($0) }) else {
                fail(node, "key must be host, client, user or header:NAME (a field name)")
                return nil
            }
            return .header(name.lowercased())
        }
    }
}
