import SluiceCore
import Testing

@testable import SluiceConfig

#if canImport(Glibc)
    import Glibc
#endif

/// `cache_store` and the policy key `cache`: values, defaults, merging, located errors.
@Suite struct CacheConfigTests {
    func issues(_ yaml: String) -> [ConfigIssue] {
        do {
            _ = try ConfigLoader.parse(yaml: yaml, file: "f.yaml")
            return []
        } catch let error as ConfigError {
            return error.issues
        } catch {
            return []
        }
    }

    @Test func noStoreByDefault() throws {
        let c = try ConfigLoader.parse(yaml: "workers: 1", file: "t.yaml")
        #expect(c.server.cacheStore == nil)
        #expect(c.pipeline.policies.match(host: "a.test").cache == .cache)
    }

    @Test func cacheStoreWithUnitsAndDefaults() throws {
        let c = try ConfigLoader.parse(yaml: "cache_store: { memory: 64MiB, max_object_size: 2MiB }", file: "t.yaml")
        #expect(c.server.cacheStore == CacheStoreSettings(memory: 64 << 20, maxObjectSize: 2 << 20))
        let d = try ConfigLoader.parse(yaml: "cache_store: {}", file: "t.yaml")
        #expect(d.server.cacheStore == CacheStoreSettings())
        let e = try ConfigLoader.parse(yaml: "cache_store:", file: "t.yaml")
        #expect(e.server.cacheStore == CacheStoreSettings(memory: 256 << 20, maxObjectSize: 8 << 20))
    }

    @Test func diskTierIsReadAndItsDirectoryCreated() throws {
        let root = "/tmp/sluice-config-test-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        let dir = root + "/a/b"
        defer { for d in [dir, root + "/a", root] { rmdir(d) } }
        let c = try ConfigLoader.parse(
            yaml: "cache_store:\n  memory: 8MiB\n  disk: { path: \(dir), size: 1GiB }\n  max_object_size: 512MiB\n",
            file: "t.yaml")
        let store = try #require(c.server.cacheStore)
        #expect(store.disk == CacheStoreSettings.Disk(path: dir, size: 1 << 30))
        #expect(store.storableObjectSize == 512 << 20)
        #expect(store.memoryObjectSize == 1 << 20)  // 1/8 of memory with a disk tier
        // Without max_object_size, a disk tier stores bodies up to 1 GiB, or an eighth of it.
        let unset = try #require(
            try ConfigLoader.parse(yaml: "cache_store:\n  disk: { path: \(dir), size: 10GiB }\n", file: "t.yaml")
                .server.cacheStore)
        #expect(unset.maxObjectSize == 1 << 30 && unset.storableObjectSize == 1 << 30)
        let small = try #require(
            try ConfigLoader.parse(yaml: "cache_store:\n  disk: { path: \(dir), size: 100MiB }\n", file: "t.yaml")
                .server.cacheStore)
        #expect(small.maxObjectSize == (100 << 20) / 8 && small.storableObjectSize == (100 << 20) / 8)
        let memoryOnly = try #require(try ConfigLoader.parse(yaml: "cache_store: {}\n", file: "t.yaml").server.cacheStore)
        #expect(memoryOnly.maxObjectSize == 8 << 20)
        var st = stat()
        #expect(stat(dir, &st) == 0 && st.st_mode & S_IFMT == S_IFDIR)
    }

    @Test func diskTierErrorsAreLocated() {
        let scratch = "/tmp/sluice-config-test-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        defer { for d in [scratch + "/x", scratch + "/y", scratch] { rmdir(d) } }
        let typo = issues("cache_store:\n  disk: { paht: /tmp/x }\n")
        #expect(typo.contains { $0.message.contains("did you mean 'path'") })
        let relative = issues("cache_store:\n  disk:\n    path: cache\n    size: 1GiB\n")
        #expect(relative.count == 1 && relative[0].line == 3 && relative[0].message.contains("absolute"))
        let badSize = issues("cache_store:\n  disk:\n    path: \(scratch)/x\n    size: huge\n")
        #expect(badSize.count == 1 && badSize[0].line == 4)
        let missing = issues("cache_store:\n  disk: { size: 1GiB }\n")
        #expect(missing.count == 1 && missing[0].message.contains("both path and size"))
        let unusable = issues("cache_store:\n  disk:\n    path: /dev/null/cache\n    size: 1GiB\n")
        #expect(
            unusable.count == 1 && unusable[0].line == 3 && unusable[0].message.contains("/dev/null")
                && unusable[0].message.contains("Not a directory"))
        let tooBig = issues("cache_store:\n  disk: { path: \(scratch)/y, size: 2MiB }\n  max_object_size: 3MiB\n")
        #expect(tooBig.count == 1 && tooBig[0].line == 3 && tooBig[0].message.contains("cache_store.disk.size"))
    }

    @Test func badStoreValuesAreLocated() {
        let found = issues("cache_store:\n  memory: lots\n  max_object_size: 0\n  memroy: 1MiB\n")
        #expect(found.map(\.line) == [2, 3, 4])
        #expect(found[2].message.contains("did you mean 'memory'"))
        let tooBig = issues("cache_store:\n  memory: 1MiB\n  max_object_size: 2MiB\n")
        #expect(tooBig.count == 1 && tooBig[0].line == 3 && tooBig[0].message.contains("larger than cache_store.memory"))
    }

    @Test func policyCacheWordsModifyAndMerging() throws {
        let yaml = """
            cache_store: { memory: 8MiB }
            policies:
              default: { cache: do_not_cache }
              a.test: { cache: cache }
              b.test:
                cache:
                  modify:
                    freshness: 10m
                    max_freshness: 1h
                    ignore_origin_directives: [no-cache, private]
                    drop_response_headers: [Set-Cookie]
                    key_request_headers: [Accept-Language, X-Tenant]
              c.test: { retry: none }
            """
        let p = try ConfigLoader.parse(yaml: yaml, file: "t.yaml").pipeline.policies
        #expect(p.match(host: "a.test").cache == .cache)
        #expect(p.match(host: "c.test").cache == .doNotCache)  // inherits the default's
        #expect(p.match(host: "other.test").cache == .doNotCache)
        #expect(
            p.match(host: "b.test").cache
                == .modify(
                    .init(
                        freshness: 600, maxFreshness: 3600,
                        ignoredDirectives: [.noCache, .isPrivate],
                        dropResponseHeaders: ["set-cookie"],
                        keyRequestHeaders: ["accept-language", "x-tenant"])))
    }

    @Test func badPolicyCacheValuesAreLocated() {
        let found = issues(
            """
            policies:
              a.test: { cache: do_not_cash }
              b.test: { cache: { modfy: {} } }
              c.test:
                cache:
                  modify:
                    freshness: 1500ms
                    ignore_origin_directives: [no-store]
                    drop_response_headers: ["bad header"]
                    key_request_header: [X]
            """)
        #expect(found.map(\.line) == [2, 3, 7, 8, 9, 10])
        #expect(found[0].message.contains("did you mean 'do_not_cache'"))
        #expect(found[1].message.contains("did you mean 'modify'"))
        #expect(found[2].message.contains("whole seconds"))
        #expect(found[3].message.contains("no-cache and private"))
        #expect(found[5].message.contains("did you mean 'key_request_headers'"))
    }

    @Test func checkDescribesTheCacheRules() throws {
        let yaml = "policies: { b.test: { cache: { modify: { freshness: 1m, ignore_origin_directives: [private] } } } }"
        let text = PolicyDescription.describe(try ConfigLoader.parse(yaml: yaml, file: "t").pipeline, host: "b.test")
        #expect(text.contains("cache: modify: freshness 60 s; IGNORES origin private"))
    }
}
