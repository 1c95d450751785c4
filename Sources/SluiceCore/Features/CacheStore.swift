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

/// One origin fetch of a URL that other requests for it wait on (collapsed forwarding,
/// docs/caching.md "Shared fills"), and, once the response is being stored, read from while it
/// arrives (Traffic Server's read-while-writer). Events in — `publish` (the response is being
/// stored, here is how to read it), `progressed` (more of its body is there), `end` — wake the
/// waiters: each registers a one-shot wake (`wait`) when it has nothing to do, and is woken by
/// the next event, on its own worker (the wake posts to that worker's loop). No polling.
///
/// Threading: any thread (a `Mutex`); wakes are called outside it.
public final class CacheFetch: Sendable {
    public enum Phase: Sendable, Equatable {
        /// The request is with the origin; nothing to read yet.
        case fetching
        /// The response is being stored: readers read `stream` up to `available` bytes.
        case streaming
        /// Over: `complete` when the whole body was stored (`available` is its length), else the
        /// fetch stored nothing or broke (readers of a partial body end incomplete).
        case ended(complete: Bool)
    }

    public struct Snapshot: Sendable {
        public let phase: Phase
        public let available: Int64
        /// What the storing side published for readers (the server's fill stream).
        public let stream: (any Sendable)?
    }

    private struct State {
        var phase = Phase.fetching
        var available: Int64 = 0
        var stream: (any Sendable)?
        /// Each waiter's wake and the `available` that wakes it (a phase change wakes all).
        var waiters: [UInt64: (until: Int64, wake: @Sendable () -> Void)] = [:]
        var nextWaiter: UInt64 = 1
        var readers = 0
    }

    public let url: String
    /// The claim's token (`CacheStore.endFetch`).
    public let token: UInt64
    private let state = Mutex(State())

    init(url: String, token: UInt64) {
        self.url = url
        self.token = token
    }

    public var snapshot: Snapshot {
        state.withLock { Snapshot(phase: $0.phase, available: $0.available, stream: $0.stream) }
    }

    /// Registers `wake` for the next phase change, or for the body reaching `until` bytes
    /// (a reader asks for a step at a time, not for every block: 100 readers of a body stored
    /// 64 KiB at a time would otherwise be woken 100 times per block), unless one came since
    /// `seen` (the phase moved on or more than `available` bytes are there): nil then, and the
    /// caller looks again now.
    public func wait(
        seen phase: Phase, available: Int64, until: Int64 = .max, wake: @escaping @Sendable () -> Void
    ) -> UInt64? {
        state.withLock { s -> UInt64? in
            guard s.phase == phase, s.available <= available else { return nil }
            let id = s.nextWaiter
            s.nextWaiter += 1
            s.waiters[id] = (max(until, available == .max ? .max : available + 1), wake)
            return id
        }
    }

    /// Forgets a registered wake (its request went away).
    public func cancelWait(_ id: UInt64) {
        _ = state.withLock { $0.waiters.removeValue(forKey: id) }
    }

    /// The response is being stored; readers read `stream`. False when the fetch is past
    /// that (an earlier response of the same fetch published, or it ended): nothing changes.
    @discardableResult
    public func publish(_ stream: any Sendable) -> Bool {
        var published = false
        wakeAll { s in
            guard s.phase == .fetching else { return false }
            s.phase = .streaming
            s.stream = stream
            published = true
            return true
        }
        return published
    }

    /// Requests reading the published stream now (`readerStarted`, `readerEnded`): the
    /// fetching side hands its transfer over only when someone else reads it.
    public var readers: Int { state.withLock { $0.readers } }
    /// Requests reading the stream, or waiting for it (registered wakes): someone besides the
    /// fetching client wants the body.
    public var wanted: Bool { state.withLock { $0.readers > 0 || !$0.waiters.isEmpty } }
    public func readerStarted() { state.withLock { $0.readers += 1 } }
    public func readerEnded() { state.withLock { $0.readers -= 1 } }

    /// `available` bytes of the body are stored (readable through the stream): wakes the
    /// waiters whose step it reaches.
    public func progressed(to available: Int64) {
        let wakes = state.withLock { s -> [@Sendable () -> Void] in
            guard available > s.available else { return [] }
            s.available = available
            var due: [@Sendable () -> Void] = []
            for (id, waiter) in s.waiters where waiter.until <= available {
                due.append(waiter.wake)
                s.waiters[id] = nil
            }
            return due
        }
        for wake in wakes { wake() }
    }

    /// The fetch is over (see `Phase.ended`).
    public func end(complete: Bool) {
        wakeAll { s in
            if case .ended = s.phase { return false }
            s.phase = .ended(complete: complete && s.phase == .streaming)
            return true
        }
    }

    private func wakeAll(_ change: (inout State) -> Bool) {
        let wakes = state.withLock { s -> [@Sendable () -> Void] in
            guard change(&s), !s.waiters.isEmpty else { return [] }
            defer { s.waiters.removeAll(keepingCapacity: true) }
            return s.waiters.values.map(\.wake)
        }
        for wake in wakes { wake() }
    }
}

/// The shared cache every worker of the process uses: the memory tier and its limits.
/// Created at start from `cache_store` (a change needs a restart: the store outlives reloads).
///
/// Threading: any thread (the tier and the table of fetches in flight lock; the rest is
/// immutable).
public final class CacheStore: Sendable {
    /// A request that finds another exchange fetching its URL waits this long at most (5 s)
    /// for that response's head, then goes to the origin itself; once the response is being
    /// stored it reads it as it arrives, however long that takes.
    public static let collapsedWaitMilliseconds = 5000

    public let settings: CacheStoreSettings
    public let memory: CacheMemoryTier
    /// URLs being fetched by a miss that may store them (collapsed forwarding).
    private let fetching = Mutex<(next: UInt64, urls: [String: CacheFetch])>((1, [:]))
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

    /// Claims the fetch of `url`: `claimed` when no other exchange is fetching it (the caller
    /// then fetches, and ends the claim with `endFetch`), else the fetch in flight (the caller
    /// may wait on it).
    public func claimFetch(_ url: String) -> (claimed: Bool, fetch: CacheFetch) {
        fetching.withLock { f in
            if let fetch = f.urls[url] { return (false, fetch) }
            let fetch = CacheFetch(url: url, token: f.next)
            f.next += 1
            f.urls[url] = fetch
            return (true, fetch)
        }
    }

    /// Claims the fetch of `url` when nobody fetches it: its token, else nil.
    public func beginFetch(_ url: String) -> UInt64? {
        let (claimed, fetch) = claimFetch(url)
        return claimed ? fetch.token : nil
    }

    /// Ends the claim `token` made (a later claim of the same URL is left alone) and wakes the
    /// requests waiting on it; `complete`: its whole body was stored.
    public func endFetch(_ url: String, token: UInt64, complete: Bool = false) {
        let ended = fetching.withLock { f -> CacheFetch? in
            guard let fetch = f.urls[url], fetch.token == token else { return nil }
            f.urls[url] = nil
            return fetch
        }
        ended?.end(complete: complete)
    }

    /// Whether some exchange is fetching `url` now.
    public func isFetching(_ url: String) -> Bool {
        fetching.withLock { $0.urls[url] != nil }
    }

    /// The largest body kept: `max_object_size`, and never more than the largest tier.
    public var maxObjectSize: Int64 { settings.storableObjectSize }
}
