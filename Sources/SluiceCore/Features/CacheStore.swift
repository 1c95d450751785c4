/// `cache_store:` — where the shared cache keeps responses. Without it nothing is cached and
/// no request is looked up (plain forwarding costs what it did without a cache).
///
/// ```yaml
/// cache_store:
///   memory: 256MiB          # the memory tier's size bound (LRU)
///   max_object_size: 8MiB   # larger responses are served, not stored
/// ```
///
/// Threading: an immutable value.
public struct CacheStoreSettings: Sendable, Equatable {
    /// `256MiB` by default.
    public static let defaultMemory: Int64 = 256 << 20
    /// `8MiB` by default (a memory-only store keeps no object larger).
    public static let defaultMaxObjectSize: Int64 = 8 << 20

    public var memory: Int64
    public var maxObjectSize: Int64

    public init(memory: Int64 = CacheStoreSettings.defaultMemory, maxObjectSize: Int64 = CacheStoreSettings.defaultMaxObjectSize) {
        self.memory = memory
        self.maxObjectSize = maxObjectSize
    }
}

/// The shared cache every worker of the process uses: the memory tier and its limits.
/// Created at start from `cache_store` (a change needs a restart: the store outlives reloads).
///
/// Threading: any thread (the tier locks; the rest is immutable).
public final class CacheStore: Sendable {
    public let settings: CacheStoreSettings
    public let memory: CacheMemoryTier

    public init(_ settings: CacheStoreSettings) {
        self.settings = settings
        memory = CacheMemoryTier(capacity: Int(settings.memory))
    }

    /// The largest body kept: `max_object_size`, and never more than the memory tier.
    public var maxObjectSize: Int64 { min(settings.maxObjectSize, settings.memory) }
}
