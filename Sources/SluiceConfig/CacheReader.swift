import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// Reading of the shared cache's keys: the top-level `cache_store` and each policy's `cache`
/// (docs/caching.md). Every bad value is an error at its line and column.
extension NodeReader {
    static let cacheStoreKeys = ["memory", "disk", "max_object_size"]
    static let cacheModifyKeys = [
        "freshness", "max_freshness", "ignore_origin_directives", "drop_response_headers",
        "key_request_headers",
    ]
    static let cacheBehaviourMessage = "cache must be cache, do_not_cache or { modify: { … } }"

    /// `cache_store: { memory: SIZE, disk: { path: DIR, size: SIZE }, max_object_size: SIZE }`.
    /// The disk tier's directory is created (mode 0700, with its parents) and probed with a
    /// file created and removed, so an unusable one is an error at its line naming the OS
    /// reason; taking its lock is left to the start (a reload re-reads this while the running
    /// process holds it).
    mutating func readCacheStore(_ node: YAMLNode) -> CacheStoreSettings? {
        var settings = CacheStoreSettings()
        var maxObjectNode: YAMLNode?
        var ok = true
        if case .scalar(let s) = node, s.string.isEmpty { return settings }  // `cache_store:` alone: the defaults
        entries(node, in: "cache_store", known: Self.cacheStoreKeys) { r, key, value in
            switch key {
            case "memory":
                if let n = r.size(value, key: "cache_store.memory", min: 64 << 10) { settings.memory = n } else { ok = false }
            case "max_object_size":
                maxObjectNode = value
                if let n = r.size(value, key: "cache_store.max_object_size", min: 1) {
                    settings.maxObjectSize = n
                } else {
                    ok = false
                }
            default:
                if let disk = r.readCacheDisk(value) { settings.disk = disk } else { ok = false }
            }
        }
        if maxObjectNode == nil { settings.maxObjectSize = CacheStoreSettings.defaultMaxObjectSize(disk: settings.disk) }
        let largest = settings.disk?.size ?? settings.memory
        if let maxObjectNode, ok, settings.maxObjectSize > largest {
            let tier = settings.disk == nil ? "cache_store.memory" : "cache_store.disk.size"
            fail(
                maxObjectNode,
                "cache_store.max_object_size (\(settings.maxObjectSize) bytes) is larger than "
                    + "\(tier) (\(largest) bytes); no such object could be stored")
            ok = false
        }
        return ok ? settings : nil
    }

    /// `cache_store.disk: { path: DIR, size: SIZE }`: both required; `path` absolute.
    mutating func readCacheDisk(_ node: YAMLNode) -> CacheStoreSettings.Disk? {
        var path: String?
        var size: Int64?
        var ok = true
        guard case .mapping = node else {
            fail(node, "cache_store.disk must be { path: DIR, size: SIZE }")
            return nil
        }
        entries(node, in: "cache_store.disk", known: ["path", "size"]) { r, key, value in
            if key == "size" {
                if let n = r.size(value, key: "cache_store.disk.size", min: 1 << 20) { size = n } else { ok = false }
                return
            }
            guard let text = value.scalar?.string, text.hasPrefix("/") else {
                r.fail(value, "cache_store.disk.path must be an absolute directory path")
                ok = false
                return
            }
            if let reason = Self.probeCacheDirectory(text) {
                r.fail(value, "cache_store.disk.path \(text): \(reason)")
                ok = false
            }
            path = text
        }
        guard ok else { return nil }
        guard let path, let size else {
            fail(node, "cache_store.disk needs both path and size, such as { path: /var/cache/sluice, size: 10GiB }")
            return nil
        }
        return CacheStoreSettings.Disk(path: path, size: size)
    }

    /// Creates `path` (and its parents, mode 0700) and checks a file can be made in it: nil,
    /// or what failed with the OS reason.
    static func probeCacheDirectory(_ path: String) -> String? {
        var prefix = "/"
        for part in path.split(separator: "/") {
            prefix += part
            if mkdir(prefix, 0o700) != 0 && errno != EEXIST {
                return "cannot create \(prefix): \(String(cString: strerror(errno)))"
            }
            prefix += "/"
        }
        var st = stat()
        guard stat(path, &st) == 0 else { return "cannot open it: \(String(cString: strerror(errno)))" }
        guard st.st_mode & S_IFMT == S_IFDIR else { return "not a directory" }
        let probe = path + "/.sluice-probe-\(getpid()).tmp"
        let fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return "cannot write in it: \(String(cString: strerror(errno)))" }
        close(fd)
        unlink(probe)
        return nil
    }

    /// A policy's `cache`: `cache`, `do_not_cache`, or `{ modify: { … } }`.
    mutating func readCache(_ node: YAMLNode) -> CacheBehavior? {
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
                if k == "freshness" {
                    modification.freshness = Int64(ms / 1000)
                } else {
                    modification.maxFreshness = Int64(ms / 1000)
                }
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
                if k == "drop_response_headers" {
                    modification.dropResponseHeaders = names
                } else {
                    modification.keyRequestHeaders = names
                }
            }
        }
        return .modify(modification)
    }

    /// RFC 9110 tchar.
    static func isTokenByte(_ b: UInt8) -> Bool {
        switch b {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"):
            return true
        default: return "!#$%&'*+-.^_`|~".utf8.contains(b)
        }
    }
}
