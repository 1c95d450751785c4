import SluiceCore

/// The tee between a response streaming to its client and the shared cache: the transfer
/// hands it each body block after the block went to the client's output, and it keeps a copy
/// in chunks (one allocation per chunk: the size the `Content-Length` announces, up to 1 MiB,
/// else 64 KiB at a time). Past `limit` bytes it gives up and frees what it kept: the
/// response is still served whole, only not stored; so it does when the body overruns its
/// declared length. `complete` publishes the object, unless an invalidation of the URL came
/// after the fill began (`CacheMemoryTier.beginFill`).
///
/// With a disk tier (docs/caching.md, "Tiers"): a body whose `Content-Length` exceeds the
/// memory tier's share (`CacheStoreSettings.memoryObjectSize`) streams straight into a disk
/// writer; one of unknown length starts in memory and, when it outgrows that share, spills:
/// what was kept is written to a disk writer and freed, and the rest follows it there. A
/// failed disk write (disk full, unwritable) abandons the fill (the tier logs it once per
/// episode); the client's response is never affected. An object goes to one tier: storing it
/// drops the URL from the other, so a lookup never sees two copies.
///
/// Threading: owned by the exchange on its worker's thread; what `complete` publishes is
/// immutable and shared. A disk writer's `append` blocks this thread for one `write` of the
/// block (to the page cache) plus its SHA-256: bounded by the transfer's block size.
final class CacheFill {
    /// The largest chunk kept in one allocation (1 MiB).
    static let maxChunk = 1 << 20
    /// The chunk size when the length is unknown (64 KiB).
    static let unknownLengthChunk = 64 << 10

    let store: CacheStore
    let disk: DiskCacheTier?
    let url: String
    let response: CacheStoredResponse
    let trustGeneration: UInt64?
    private let limit: Int
    private let memoryLimit: Int
    /// The disk writer once the body goes to disk.
    private var writer: DiskCacheTier.Writer?
    /// Where `complete` stored the object (for the access log / tests).
    private(set) var storedOnDisk = false
    private var remainingDeclared: Int?
    private let declared: Int?
    /// This fill's registration with the memory tier (an invalidation cancels it).
    private let token: UInt64
    private var chunks: [CacheChunk] = []
    private var current: UnsafeMutableRawBufferPointer?
    private var used = 0
    private(set) var total = 0
    private(set) var abandoned = false

    /// - Parameter contentLength: the body's length as the client's framing uses it (nil
    ///   when the response is chunked, even with a `Content-Length`).
    init(
        store: CacheStore, disk: DiskCacheTier? = nil, url: String, response: CacheStoredResponse, contentLength: Int64?,
        trustGeneration: UInt64? = nil
    ) {
        self.trustGeneration = trustGeneration
        self.store = store
        self.disk = disk
        self.url = url
        self.response = response
        limit = Int(disk == nil ? store.settings.memoryObjectSize : store.maxObjectSize)
        memoryLimit = disk == nil ? limit : Int(store.settings.memoryObjectSize)
        remainingDeclared = contentLength.map { Int($0) }
        declared = remainingDeclared
        token = store.memory.beginFill(url)
        if disk != nil, let contentLength, contentLength > Int64(memoryLimit) { spill() }
    }

    deinit {
        current?.deallocate()
        store.memory.endFill(url, token)
    }

    func append(_ data: UnsafeRawBufferPointer) {
        guard !abandoned, data.count > 0 else { return }
        guard total + data.count <= limit else { return abandon() }
        if let declared, total + data.count > declared { return abandon() }  // overruns its length
        if writer == nil, total + data.count > memoryLimit {
            guard disk != nil else { return abandon() }
            spill()
            if abandoned { return }
        }
        total += data.count
        if let writer {
            if !writer.append(data) { abandon() }
            return
        }
        var offset = 0
        while offset < data.count {
            if current == nil {
                let wanted = remainingDeclared.map { max(1, min($0, Self.maxChunk)) } ?? Self.unknownLengthChunk
                current = .allocate(byteCount: wanted, alignment: 16)
                used = 0
            }
            let room = current!.count - used
            let n = min(room, data.count - offset)
            (current!.baseAddress! + used).copyMemory(from: data.baseAddress! + offset, byteCount: n)
            used += n
            offset += n
            if let r = remainingDeclared { remainingDeclared = max(0, r - n) }
            if used == current!.count { seal() }
        }
    }

    /// Keeps the current chunk. A full one is adopted as it is; a partly filled one (the end
    /// of a body of unknown length) is copied to its exact size, so what the tier counts is
    /// what the chunk holds (a 100-byte body does not keep a 64 KiB allocation).
    private func seal() {
        guard let buffer = current else { return }
        if used == buffer.count {
            chunks.append(CacheChunk(adopting: buffer, count: used))
        } else {
            if used > 0 { chunks.append(CacheChunk(copying: UnsafeRawBufferPointer(start: buffer.baseAddress, count: used))) }
            buffer.deallocate()
        }
        current = nil
        used = 0
    }

    /// Moves the fill to a disk writer: what was kept so far is written there and freed.
    private func spill() {
        guard let disk, let writer = disk.beginWrite(key: url, metadata: response.encode()) else { return abandon() }
        self.writer = writer
        seal()
        for chunk in chunks where !writer.append(chunk.bytes) { return abandon() }
        chunks = []
    }

    private func abandon() {
        abandoned = true
        chunks = []
        current?.deallocate()
        current = nil
        writer?.abort()
        writer = nil
    }

    /// Stores the object (the response ended whole). Returns the evictions it caused (the
    /// memory tier's; 0 for the disk tier, which evicts by itself), or nil when nothing was
    /// stored (abandoned, larger than the memory tier, or the disk commit failed).
    func complete() -> Int? {
        guard !abandoned else { return nil }
        if let writer {
            self.writer = nil
            guard store.memory.endFill(url, token) else {  // an invalidation came meanwhile
                writer.abort()
                return nil
            }
            // No record while the entry changes (a lookup in between validates), then this one.
            store.recordDiskTrust(url, generation: nil)
            guard writer.commit() else { return nil }
            store.recordDiskTrust(url, generation: trustGeneration)
            store.memory.invalidate(url)
            storedOnDisk = true
            return 0
        }
        seal()
        let evicted = store.memory.insert(
            CacheObject(response: response, chunks: chunks, trustGeneration: trustGeneration),
            for: url, fill: token)
        if evicted != nil { disk?.remove(key: url) }
        return evicted
    }
}
