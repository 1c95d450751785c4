import SluiceCore

/// Copies a small disk hit into the memory tier as it is served (docs/caching.md, "Tiers"):
/// the disk is the store and memory its hot layer, so an entry read from disk whose body is
/// within the memory tier's share (`CacheStoreSettings.memoryObjectSize`) is kept in memory
/// too, and the next hit says `detail=memory`. The blocks the hit reads and verifies anyway
/// are copied (one chunk per block), each counted against the memory tier as it arrives
/// (`CacheMemoryTier.reserveFill`); when the last block was read, the object is inserted —
/// unless the URL was invalidated meanwhile, a newer copy went to disk only
/// (`CacheMemoryTier.dropVariant` cancels promotions), or memory already has the variant
/// (`insert(ifAbsent:)`: a promotion never replaces a copy stored meanwhile). Its registration
/// with the memory tier (`beginFill(_:promotion:)`) is taken by the lookup before it opens the
/// disk entry (`CacheExchange.promotionToken`), so an invalidation that removes the entry
/// after that open — it removes from disk, then from memory — cancels the promotion too.
///
/// Threading: owned by the `DiskHitStream` on its worker's thread.
final class CachePromotion {
    let store: CacheStore
    let url: String
    let object: CacheObject
    private let token: UInt64
    private var chunks: [CacheChunk] = []
    private var kept = 0
    private var failed = false
    /// Objects the memory tier evicted to make room for the copy.
    private(set) var evicted = 0

    /// A promotion of `object` (a disk entry of `url`) under the registration `token` (which
    /// it ends), or nil when its body is not for memory.
    init?(store: CacheStore, url: String, object: CacheObject, token: UInt64) {
        guard object.onDisk, object.bodyLength <= Int(store.settings.memoryObjectSize) else { return nil }
        self.store = store
        self.url = url
        self.object = object
        self.token = token
    }

    deinit { store.memory.endFill(url, token) }

    /// Keeps a copy of the next block of the body.
    func append(_ block: UnsafeRawBufferPointer) {
        guard !failed else { return }
        guard kept + block.count <= object.bodyLength, let evicted = store.memory.reserveFill(url, token, bytes: block.count)
        else {
            failed = true
            chunks = []
            store.memory.releaseFill(url, token)
            return
        }
        self.evicted += evicted
        chunks.append(CacheChunk(copying: block))
        kept += block.count
    }

    /// Inserts the copy when the whole body was kept; true when memory now holds it.
    @discardableResult
    func complete() -> Bool {
        guard !failed, kept == object.bodyLength else { return false }
        let copy = CacheObject(
            response: object.response, chunks: chunks, trustGeneration: object.trustGeneration, diskEntry: object.diskEntry)
        chunks = []
        guard let evicted = store.memory.insert(copy, for: url, fill: token, ifAbsent: true) else { return false }
        self.evicted += evicted
        return true
    }
}
