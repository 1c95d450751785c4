import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// Immutable body bytes of a cached object, in one allocation that never moves: a hit hands
/// them to the client's output by reference (libevent keeps the chunk alive until sent), so a
/// large body is not copied per hit.
///
/// Threading: written only by `init` (before the chunk is published), read-only afterwards,
/// from any worker; hence `@unchecked Sendable`. Freed when the last reference goes.
public final class CacheChunk: @unchecked Sendable {
    public let bytes: UnsafeRawBufferPointer

    public init(copying source: UnsafeRawBufferPointer) {
        let storage = UnsafeMutableRawBufferPointer.allocate(byteCount: max(1, source.count), alignment: 16)
        if let base = source.baseAddress, source.count > 0 {
            storage.baseAddress!.copyMemory(from: base, byteCount: source.count)
        }
        bytes = UnsafeRawBufferPointer(start: storage.baseAddress, count: source.count)
    }

    /// Takes ownership of `storage` (allocated with `UnsafeMutableRawBufferPointer.allocate`),
    /// of which the first `count` bytes are the chunk: no copy.
    public init(adopting storage: UnsafeMutableRawBufferPointer, count: Int) {
        bytes = UnsafeRawBufferPointer(start: storage.baseAddress, count: count)
    }

    public init(_ array: [UInt8]) {
        let storage = UnsafeMutableRawBufferPointer.allocate(byteCount: max(1, array.count), alignment: 16)
        array.withUnsafeBytes {
            if let base = $0.baseAddress { storage.baseAddress!.copyMemory(from: base, byteCount: $0.count) }
        }
        bytes = UnsafeRawBufferPointer(start: storage.baseAddress, count: array.count)
    }

    public var count: Int { bytes.count }

    deinit { UnsafeMutableRawPointer(mutating: bytes.baseAddress!).deallocate() }
}

/// A complete cached response: its head (`CacheStoredResponse`) and body chunks. Never
/// changed once built; a revalidation that updates the head makes a new object sharing the
/// chunks.
///
/// Threading: immutable; shared by every worker.
public final class CacheObject: Sendable {
    public let response: CacheStoredResponse
    public let chunks: [CacheChunk]
    public let bodyLength: Int
    /// What the object counts against the memory tier: body plus an estimate of its head.
    public let size: Int
    /// The stored fields as they are sent on a hit, `Name: value` CRLF each, `Age` left out
    /// (every hit sends its own): serialized once, written per hit without rebuilding.
    public let fieldLines: [UInt8]
    /// The body is in the disk tier (under the URL), not in `chunks`: a hit streams it from
    /// the reader its lookup opened. Such an object is never inserted in the memory tier.
    public let onDisk: Bool
    /// The disk tier's entry holding the same response (with a disk tier): its name and the
    /// generation of its body, so that a memory hit keeps the entry recently used on disk and a
    /// `304` rewrites the head of this body and no other. nil without one.
    public let diskEntry: DiskEntry?

    public struct DiskEntry: Sendable, Equatable {
        public let name: String
        public let generation: UInt64
        public init(name: String, generation: UInt64) {
            self.name = name
            self.generation = generation
        }
    }

    /// For an `https` URL, the `PolicyTable.generation` the response was fetched (or last
    /// validated) under: a hit under another one is validated first (the trust may have
    /// changed with a reload). nil for `http`, and for a disk entry this process has not
    /// written or validated (`CacheStore.recordDiskTrust`): such an https entry is validated
    /// before it answers.
    public let trustGeneration: UInt64?

    public convenience init(
        response: CacheStoredResponse, chunks: [CacheChunk], trustGeneration: UInt64? = nil, diskEntry: DiskEntry? = nil
    ) {
        self.init(
            response: response, chunks: chunks, onDisk: false, diskLength: 0, trustGeneration: trustGeneration,
            diskEntry: diskEntry)
    }

    /// An object whose `diskLength`-byte body is in the disk tier.
    public convenience init(
        response: CacheStoredResponse, diskLength: Int, trustGeneration: UInt64? = nil, diskEntry: DiskEntry? = nil
    ) {
        self.init(
            response: response, chunks: [], onDisk: true, diskLength: diskLength, trustGeneration: trustGeneration,
            diskEntry: diskEntry)
    }

    private init(
        response: CacheStoredResponse, chunks: [CacheChunk], onDisk: Bool, diskLength: Int,
        trustGeneration: UInt64?, diskEntry: DiskEntry?
    ) {
        self.diskEntry = diskEntry
        self.onDisk = onDisk
        self.trustGeneration = trustGeneration
        let length = onDisk ? diskLength : chunks.reduce(0) { $0 + $1.count }
        var response = response
        response.bodyLength = Int64(length)
        self.response = response
        self.chunks = chunks
        bodyLength = length
        var lines: [UInt8] = []
        for field in response.fields where !field.name.caseInsensitiveEquals("age") {
            lines.append(contentsOf: field.name.utf8)
            lines.append(contentsOf: ": ".utf8)
            lines.append(contentsOf: field.value.utf8)
            lines.append(contentsOf: "\r\n".utf8)
        }
        fieldLines = lines
        size = length + lines.count + 256
    }

    /// The same object recorded under another trust generation; itself when it has that one.
    /// Nothing is serialized again (the disk tier keeps a decoded entry's object for its later
    /// hits, `DiskDecodedRecords`, and each hit reads the entry's trust generation anew).
    public func withTrustGeneration(_ generation: UInt64?) -> CacheObject {
        generation == trustGeneration ? self : CacheObject(copying: self, trustGeneration: generation)
    }

    private init(copying object: CacheObject, trustGeneration: UInt64?) {
        response = object.response
        chunks = object.chunks
        bodyLength = object.bodyLength
        size = object.size
        fieldLines = object.fieldLines
        onDisk = object.onDisk
        diskEntry = object.diskEntry
        self.trustGeneration = trustGeneration
    }

    /// The same body under an updated head (after a `304`), validated under `trustGeneration`.
    public func withResponse(_ response: CacheStoredResponse, trustGeneration: UInt64?) -> CacheObject {
        CacheObject(
            response: response, chunks: chunks, onDisk: onDisk, diskLength: bodyLength, trustGeneration: trustGeneration,
            diskEntry: diskEntry)
    }
}

/// The memory tier of the shared cache (`cache_store.memory`): objects by URL (each URL's
/// variants together, selected by `CacheLookup`), bounded in bytes, evicting the least
/// recently used URL first. Bodies being filled count against the bound as they grow
/// (`reserveFill`), so stored objects plus fills in progress never exceed it. Every worker uses the one instance; each call takes the lock
/// once, for a dictionary lookup and a list splice (no I/O, no body copy under the lock).
///
/// Threading: any thread (a `Mutex`); objects are immutable, so what a lookup returns stays
/// valid after the lock is released, even if the URL is evicted meanwhile.
public final class CacheMemoryTier: Sendable {
    /// Figures for the admin API and metrics.
    public struct Stats: Sendable, Equatable {
        public var objects = 0
        public var bytes = 0
        public var evictions = 0
        /// Bytes held by fills in progress (not yet objects).
        public var filling = 0
    }

    private struct Entry {
        var variants: [CacheObject]
        var size: Int
        var newer: String?
        var older: String?
    }

    private struct State {
        var entries: [String: Entry] = [:]
        /// The most and least recently used URLs (the ends of the list through `newer`/`older`).
        var newest: String?
        var oldest: String?
        var stats = Stats()
        /// The fills in progress per URL (`beginFill`) and the bytes each holds; an
        /// invalidation removes a URL's, so their `insert` stores nothing.
        var fills: [String: [UInt64: Int]] = [:]
        var nextFill: UInt64 = 1
        /// The fills that promote a disk entry (`beginFill(_:promotion:)`).
        var promotions: Set<UInt64> = []

        /// Forgets fill `token` of `url`, releasing its bytes; false when it was not registered.
        mutating func endFill(_ url: String, _ token: UInt64) -> Bool {
            guard let held = fills[url]?.removeValue(forKey: token) else { return false }
            stats.filling -= held
            promotions.remove(token)
            if fills[url]?.isEmpty == true { fills[url] = nil }
            return true
        }

        mutating func cancelPromotions(_ url: String) {
            for (token, _) in fills[url] ?? [:] where promotions.contains(token) { _ = endFill(url, token) }
        }

        /// Evicts least recently used URLs until `more` bytes fit beside what is stored and
        /// being filled; returns how many objects went.
        mutating func evict(toFit more: Int, capacity: Int) -> Int {
            var evicted = 0
            while stats.bytes + stats.filling + more > capacity, let victim = oldest {
                evicted += remove(victim)?.variants.count ?? 0
            }
            stats.evictions += evicted
            return evicted
        }

        mutating func unlink(_ key: String) {
            guard let e = entries[key] else { return }
            if let n = e.newer { entries[n]!.older = e.older } else { newest = e.older }
            if let o = e.older { entries[o]!.newer = e.newer } else { oldest = e.newer }
            entries[key]!.newer = nil
            entries[key]!.older = nil
        }

        mutating func pushNewest(_ key: String) {
            entries[key]!.older = newest
            entries[key]!.newer = nil
            if let n = newest { entries[n]!.newer = key }
            newest = key
            if oldest == nil { oldest = key }
        }

        mutating func remove(_ key: String) -> Entry? {
            guard entries[key] != nil else { return nil }
            unlink(key)
            let e = entries.removeValue(forKey: key)!
            stats.bytes -= e.size
            stats.objects -= e.variants.count
            return e
        }
    }

    /// The tier's size bound, in bytes.
    public let capacity: Int
    private let state = Mutex(State())

    public init(capacity: Int) {
        self.capacity = capacity
    }

    /// The variants stored for `url` (most recently stored last); marks the URL used.
    public func variants(for url: String) -> [CacheObject] {
        state.withLock { s in
            guard let e = s.entries[url] else { return [] }
            if s.newest != url {
                s.unlink(url)
                s.pushNewest(url)
            }
            return e.variants
        }
    }

    /// Stores `object` for `url`, replacing the variant with the same secondary key
    /// (`CacheStoredResponse.varyKey`); evicts least recently used URLs until the tier fits.
    /// Returns how many objects were evicted; an object larger than the whole tier, or than
    /// what the fills in progress leave of it, is not stored (returns nil).
    ///
    /// With `fill`, the object is the body that fill kept: nothing is stored (nil) when an
    /// invalidation of `url` came after its `beginFill` (the body predates an unsafe method).
    ///
    /// With `ifAbsent`, nothing is stored (nil) when the URL already has this variant (a
    /// promotion never replaces a copy stored meanwhile).
    @discardableResult
    public func insert(_ object: CacheObject, for url: String, fill: UInt64? = nil, ifAbsent: Bool = false) -> Int? {
        guard object.size <= capacity, !object.onDisk else {
            if let fill { endFill(url, fill) }
            return nil
        }
        return state.withLock { s -> Int? in
            if let fill {
                guard s.endFill(url, fill) else { return nil }
                // A copy stored now is newer than any a promotion in progress read from disk.
                if !ifAbsent { s.cancelPromotions(url) }
            }
            // What other fills hold counts: an object that cannot fit beside them is not kept.
            guard object.size + s.stats.filling <= capacity else { return nil }
            let varyKey = object.response.varyKey
            if ifAbsent, s.entries[url]?.variants.contains(where: { $0.response.varyKey == varyKey }) == true {
                return nil
            }
            var entry = s.remove(url) ?? Entry(variants: [], size: 0)
            entry.variants.removeAll { $0.response.varyKey == varyKey }
            entry.variants.append(object)
            entry.size = entry.variants.reduce(0) { $0 + $1.size }
            var evicted = s.evict(toFit: entry.size, capacity: capacity)
            if entry.size + s.stats.filling > capacity {
                // The URL's other variants alone no longer fit beside the new one: keep the new one.
                evicted += entry.variants.count - 1
                s.stats.evictions += entry.variants.count - 1
                entry.variants = [object]
                entry.size = object.size
            }
            s.entries[url] = entry
            s.pushNewest(url)
            s.stats.bytes += entry.size
            s.stats.objects += entry.variants.count
            return evicted
        }
    }

    /// Drops every variant of `url` (invalidation) and cancels the fills of `url` in progress
    /// (their `insert` stores nothing); returns how many variants there were.
    @discardableResult
    public func invalidate(_ url: String) -> Int {
        state.withLock { s in
            for (token, _) in s.fills[url] ?? [:] { _ = s.endFill(url, token) }
            return s.remove(url)?.variants.count ?? 0
        }
    }

    /// Drops `url`'s variant with secondary key `varyKey` (a newer copy of it went to disk
    /// only) and cancels the URL's promotions in progress (they copy an older entry), leaving
    /// its other variants and its other fills alone.
    public func dropVariant(_ url: String, varyKey: String) {
        state.withLock { s in
            s.cancelPromotions(url)
            guard var entry = s.remove(url) else { return }
            entry.variants.removeAll { $0.response.varyKey == varyKey }
            guard !entry.variants.isEmpty else { return }
            entry.size = entry.variants.reduce(0) { $0 + $1.size }
            s.entries[url] = entry
            s.pushNewest(url)
            s.stats.bytes += entry.size
            s.stats.objects += entry.variants.count
        }
    }

    /// Registers a fill of `url` starting now: the token its `insert` passes. Ended by that
    /// `insert`, or by `endFill` when the fill stores nothing.
    /// A `promotion` (a disk entry copied into memory) is also cancelled by `dropVariant`.
    public func beginFill(_ url: String, promotion: Bool = false) -> UInt64 {
        state.withLock { s in
            let token = s.nextFill
            s.nextFill += 1
            s.fills[url, default: [:]][token] = 0
            if promotion { s.promotions.insert(token) }
            return token
        }
    }

    /// Counts `bytes` more held by fill `token` of `url` against the tier's size, evicting
    /// least recently used URLs to make room. False when the fill was cancelled (an
    /// invalidation) or the bytes cannot fit even with nothing stored: the fill then keeps no
    /// memory copy (and ends its registration with `endFill`).
    ///
    /// Returns how many objects were evicted for it, or nil when refused.
    public func reserveFill(_ url: String, _ token: UInt64, bytes: Int) -> Int? {
        state.withLock { s in
            guard s.fills[url]?[token] != nil, s.stats.filling + bytes <= capacity else { return nil }
            let evicted = s.evict(toFit: bytes, capacity: capacity)
            s.fills[url]![token]! += bytes
            s.stats.filling += bytes
            return evicted
        }
    }

    /// Gives back what fill `token` of `url` reserved (it keeps no memory copy any more),
    /// leaving it registered: its invalidation still cancels it.
    public func releaseFill(_ url: String, _ token: UInt64) {
        state.withLock { s in
            guard let held = s.fills[url]?[token] else { return }
            s.fills[url]![token] = 0
            s.stats.filling -= held
        }
    }

    /// Whether fill `token` of `url` is still registered (no invalidation cancelled it).
    public func fillIsLive(_ url: String, _ token: UInt64) -> Bool {
        state.withLock { $0.fills[url]?[token] != nil }
    }

    /// Forgets the fill `token` of `url` (given up, or already inserted: then nothing happens).
    /// True when it was still registered (no invalidation cancelled it).
    @discardableResult
    public func endFill(_ url: String, _ token: UInt64) -> Bool {
        state.withLock { s in s.endFill(url, token) }
    }

    public var stats: Stats { state.withLock { $0.stats } }
}
