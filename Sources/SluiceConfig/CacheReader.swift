import SluiceCore
import Yams

/// Reading of the shared cache's keys: the top-level `cache_store` and each policy's `cache`
/// (docs/caching.md). Every bad value is an error at its line and column.
extension NodeReader {
    static let cacheStoreKeys = ["memory", "disk", "max_object_size"]
    static let cacheModifyKeys = ["freshness", "max_freshness", "ignore_origin_directives", "drop_response_headers",
                                  "key_request_headers"]
    static let cacheBehaviourMessage = "cache must be cache, do_not_cache or { modify: { … } }"

    /// `cache_store: { memory: SIZE, max_object_size: SIZE }`. `disk` is read (so a typo in it
    /// is reported as such) and then refused: this version has no disk tier.
    mutating func readCacheStore(_ node: Node) -> CacheStoreSettings? {
        var settings = CacheStoreSettings()
        var maxObjectNode: Node?
        var ok = true
        if case .scalar(let s) = node, s.string.isEmpty { return settings }  // `cache_store:` alone: the defaults
        entries(node, in: "cache_store", known: Self.cacheStoreKeys) { r, key, value in
            switch key {
            case "memory":
                if let n = r.size(value, key: "cache_store.memory", min: 64 << 10) { settings.memory = n } else { ok = false }
            case "max_object_size":
                maxObjectNode = value
                if let n = r.size(value, key: "cache_store.max_object_size", min: 1) { settings.maxObjectSize = n } else { ok = false }
            default:
                r.entries(value, in: "cache_store.disk", known: ["path", "size"]) { _, _, _ in }
                r.fail(value, "cache_store.disk: the disk tier is not available in this version of Sluice "
                       + "(remove disk; the memory tier caches up to cache_store.memory)")
                ok = false
            }
        }
        if let maxObjectNode, settings.maxObjectSize > settings.memory {
            fail(maxObjectNode, "cache_store.max_object_size (\(settings.maxObjectSize) bytes) is larger than "
                 + "cache_store.memory (\(settings.memory) bytes); no such object could be stored")
            ok = false
        }
        return ok ? settings : nil
    }

    /// A policy's `cache`: `cache`, `do_not_cache`, or `{ modify: { … } }`.
    mutating func readCache(_ node: Node) -> CacheBehavior? {
        if let word = node.scalar?.string {
            switch word {
            case "cache": return .cache
            case "do_not_cache": return .doNotCache
            default:
                let suggestion = DidYouMean.closest(to: word, among: ["cache", "do_not_cache"])
                fail(node, Self.cacheBehaviourMessage + (suggestion.map { "; did you mean '\($0)'?" } ?? ""))
                return nil
            }
        }
        guard case .mapping(let m) = node, m.count == 1, let key = m.first!.key.scalar?.string else {
            fail(node, Self.cacheBehaviourMessage)
            return nil
        }
        guard key == "modify" else {
            let suggestion = DidYouMean.closest(to: key, among: ["modify", "cache", "do_not_cache"])
            fail(m.first!.key, "unknown cache behaviour '\(key)'" + (suggestion.map { "; did you mean '\($0)'?" } ?? ""))
            return nil
        }
        var modification = CacheModification()
        if case .scalar(let s) = m.first!.value, s.string.isEmpty { return .modify(modification) }  // `modify:` alone
        entries(m.first!.value, in: "cache.modify", known: Self.cacheModifyKeys) { r, k, v in
            switch k {
            case "freshness", "max_freshness":
                guard let ms = r.duration(v, key: "cache.modify.\(k)") else { return }
                guard ms % 1000 == 0 else { return r.fail(v, "cache.modify.\(k) must be whole seconds, such as 30s or 10m") }
                if k == "freshness" { modification.freshness = Int64(ms / 1000) } else { modification.maxFreshness = Int64(ms / 1000) }
            case "ignore_origin_directives":
                for (word, itemNode) in r.strings(v, what: "cache.modify.ignore_origin_directives") ?? [] {
                    if let d = CacheModification.IgnorableDirective(rawValue: word) {
                        modification.ignoredDirectives.insert(d)
                    } else {
                        r.fail(itemNode, "ignore_origin_directives takes no-cache and private, not '\(word)'")
                    }
                }
            default:
                var names: [String] = []
                for (name, itemNode) in r.strings(v, what: "cache.modify.\(k)") ?? [] {
                    if !name.isEmpty, name.utf8.allSatisfy(Self.isTokenByte) {
                        names.append(name.lowercased())
                    } else {
                        r.fail(itemNode, "'\(name)' is not a header field name")
                    }
                }
                if k == "drop_response_headers" { modification.dropResponseHeaders = names } else { modification.keyRequestHeaders = names }
            }
        }
        return .modify(modification)
    }

    /// RFC 9110 tchar.
    static func isTokenByte(_ b: UInt8) -> Bool {
        switch b {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"): return true
        default: return "!#$%&'*+-.^_`|~".utf8.contains(b)
        }
    }
}
