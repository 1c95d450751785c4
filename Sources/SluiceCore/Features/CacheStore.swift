import Synchronization

/// `cache_store:` — where the shared cache keeps responses. Without it nothing is cached and
/// no request is looked up (plain forwarding costs what it did without a cache).
///
/// ```yaml
/// cache_store:
///   memory: 256MiB          # the memory tier's size bound (LRU)
///   disk: { path: /var/cache/sluice, size: 10GiB }   # optional disk tier (LRU, crash-safe)
///   max_object_size: 8MiB   # larger responses are served, not stored
/// ```
///
/// Threading: an immutable value.
public struct CacheStoreSettings: Sendable, Equatable {
    /// `cache_store.disk`: the disk tier's directory and its size bound.
    public struct Disk: Sendable, Equatable {
        public var path: String
        public var size: Int64
        public init(path: String, size: Int64) {
            self.path = path
            self.size = size
        }
    }

    /// With a disk tier, the memory tier keeps bodies up to this fraction of its size (1/8);
    /// larger ones, and bodies that outgrow it while streaming, go to disk.
    public static let memoryShareDivisor: Int64 = 8

    /// `256MiB` by default.
    public static let defaultMemory: Int64 = 256 << 20
    /// `8MiB` by default (a memory-only store keeps no object larger).
    public static let defaultMaxObjectSize: Int64 = 8 << 20
    /// With a disk tier, `1GiB` by default, or `disk.size / 8` when that is smaller (so that
    /// one object cannot take the whole tier): an operator who gives Sluice a disk wants
    /// downloads kept on it.
    public static let defaultDiskMaxObjectSize: Int64 = 1 << 30

    /// The default `max_object_size` for these settings (`defaultDiskMaxObjectSize` bounded
    /// by an eighth of the disk tier, or `defaultMaxObjectSize` without one).
    public static func defaultMaxObjectSize(disk: Disk?) -> Int64 {
        guard let disk else { return defaultMaxObjectSize }
        return min(defaultDiskMaxObjectSize, max(1, disk.size / memoryShareDivisor))
    }

    public var memory: Int64
    public var maxObjectSize: Int64
    public var disk: Disk?

    public init(
        memory: Int64 = CacheStoreSettings.defaultMemory, maxObjectSize: Int64 = CacheStoreSettings.defaultMaxObjectSize,
        disk: Disk? = nil
    ) {
        self.memory = memory
        self.maxObjectSize = maxObjectSize
        self.disk = disk
    }

    /// The largest body stored at all: `max_object_size`, bounded by the largest tier (the
    /// disk tier when there is one, else the memory tier).
    public var storableObjectSize: Int64 { min(maxObjectSize, disk?.size ?? memory) }

    /// The largest body kept in the memory tier: every storable body without a disk tier;
    /// with one, bodies up to 1/8 of the memory tier (the rest stream to disk).
    public var memoryObjectSize: Int64 {
        disk == nil ? storableObjectSize : min(storableObjectSize, memory / Self.memoryShareDivisor)
    }
}

/// The shared cache every worker of the process uses: the memory tier and its limits.
/// Created at start from `cache_store` (a change needs a restart: the store outlives reloads).
///
/// Threading: any thread (the tier and the table of fetches in flight lock; the rest is
/// immutable).
public final class CacheStore: Sendable {
    /// A request that finds another exchange fetching its URL waits this long at most (5 s)
    /// for that response to be stored, then goes to the origin itself.
    public static let collapsedWaitMilliseconds = 5000
    /// How often a waiting request looks whether the fetch it waits for ended (5 ms).
    public static let collapsedPollMilliseconds = 5

    public let settings: CacheStoreSettings
    public let memory: CacheMemoryTier
    /// URLs being fetched by a miss that may store them (collapsed forwarding), with the
    /// fetching exchange's token.
    private let fetching = Mutex<(next: UInt64, urls: [String: UInt64])>((1, [:]))

    /// For disk entries of `https` URLs written or validated by this process: the trust
    /// generation (`PolicyTable.generation`) they were fetched or validated under. The disk
    /// keeps none, so an entry from before a restart, or one this table no longer holds, is
    /// validated before it answers; one written since, under the current generation, is a hit.
    /// Bounded: past `maxDiskTrustRecords` the table is emptied (its entries then validate once).
    private let diskTrust = Mutex<[String: UInt64]>([:])
    public static let maxDiskTrustRecords = 100_000

    public init(_ settings: CacheStoreSettings) {
        self.settings = settings
        memory = CacheMemoryTier(capacity: Int(settings.memory))
    }

    /// Records that `url`'s disk entry was just written (or its head rewritten) by an exchange
    /// under `generation` (nil: not https, nothing to record; the record is dropped).
    public func recordDiskTrust(_ url: String, generation: UInt64?) {
        diskTrust.withLock { table in
            guard let generation else {
                table[url] = nil
                return
            }
            if table.count >= Self.maxDiskTrustRecords { table.removeAll(keepingCapacity: true) }
            table[url] = generation
        }
    }

    /// The trust generation `url`'s disk entry was fetched or validated under in this process.
    public func diskTrustGeneration(_ url: String) -> UInt64? {
        diskTrust.withLock { $0[url] }
    }

    /// Claims the fetch of `url`: a token when no other exchange is fetching it (the caller
    /// then fetches, and ends the claim with `endFetch`), nil when one is (the caller may wait).
    public func beginFetch(_ url: String) -> UInt64? {
        fetching.withLock { f in
            guard f.urls[url] == nil else { return nil }
            let token = f.next
            f.next += 1
            f.urls[url] = token
            return token
        }
    }

    /// Ends the claim `token` made (a later claim of the same URL is left alone).
    public func endFetch(_ url: String, token: UInt64) {
        fetching.withLock { f in
            if f.urls[url] == token { f.urls[url] = nil }
        }
    }

    /// Whether some exchange is fetching `url` now.
    public func isFetching(_ url: String) -> Bool {
        fetching.withLock { $0.urls[url] != nil }
    }

    /// The largest body kept: `max_object_size`, and never more than the largest tier.
    public var maxObjectSize: Int64 { settings.storableObjectSize }
}
