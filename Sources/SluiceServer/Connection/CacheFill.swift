import SluiceCore

/// The tee between a response streaming to its client and the shared cache: the transfer
/// hands it each body block after the block went to the client's output, and it keeps a copy.
/// Past `limit` bytes it gives up and frees what it kept: the response is still served whole,
/// only not stored; so it does when the body overruns its declared length. `complete`
/// publishes the object, unless an invalidation of the URL came after the fill began
/// (`CacheMemoryTier.beginFill`).
///
/// The memory copy is kept in chunks (one allocation per chunk: the size the `Content-Length`
/// announces, up to 1 MiB, else 64 KiB at a time), each counted against the memory tier as it
/// is allocated (`CacheMemoryTier.reserveFill`, which evicts to make room).
///
/// With a disk tier (docs/caching.md, "Tiers") the disk is the store: every body is written
/// behind the response into a disk writer under its URL and `Vary` variant, and a body up to
/// the memory tier's share (`CacheStoreSettings.memoryObjectSize`) is also kept in memory, the
/// hot layer. A body that outgrows the share (or announces more) keeps no memory copy; a body
/// too large for `max_object_size` is abandoned in both. A failed disk write (disk full,
/// unwritable) ends the disk copy (the tier logs it once per episode) and the memory copy is
/// still stored; the client's response is never affected.
///
/// Shared fills (docs/caching.md): with the fetch other requests wait on (`CacheFetch`), a
/// body of known length is published to them as it is stored (`FillStream`): from the disk
/// writer's temporary file (each block readable once written) or, without a disk tier, from
/// the memory copy's sealed chunks; each step is told to the fetch (`progressed`), and the end
/// too (`end`: complete only when every byte was kept).
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
    /// The disk entry's variant (`CacheStoredResponse.varyKey`) and the key its trust is
    /// recorded under.
    let variant: String
    var diskKey: String { DiskCacheTier.entryKey(url, variant: variant) }
    private let limit: Int
    private let memoryLimit: Int
    /// The disk writer (with a disk tier, until it fails).
    private var writer: DiskCacheTier.Writer?
    /// Whether the body is still being kept in memory.
    private var keepsMemoryCopy: Bool
    /// Where `complete` stored the object (for the access log / tests).
    private(set) var storedOnDisk = false
    private(set) var storedInMemory = false
    private var remainingDeclared: Int?
    private let declared: Int?
    /// This fill's registration with the memory tier (an invalidation cancels it).
    private let token: UInt64
    private var chunks: [CacheChunk] = []
    private var current: UnsafeMutableRawBufferPointer?
    private var used = 0
    private(set) var total = 0
    private(set) var abandoned = false
    /// Objects the memory tier evicted to make room for this fill's chunks.
    private var evictedForRoom = 0
    /// The fetch others wait on, when this fill published its body to them, and the chunk list
    /// of a memory source.
    private var published: CacheFetch?
    private var publishedChunks: FillChunks?
    private var sealedBytes = 0
    /// A published memory copy reserved its whole length at once: it is never dropped midway
    /// (its readers, the fetching client among them, depend on it).
    private var reservedWhole = false

    /// - Parameter contentLength: the body's length as the client's framing uses it (nil
    ///   when the response is chunked, even with a `Content-Length`).
    init(
        store: CacheStore, disk: DiskCacheTier? = nil, url: String, response: CacheStoredResponse, contentLength: Int64?,
        trustGeneration: UInt64? = nil, fetch: CacheFetch? = nil
    ) {
        self.trustGeneration = trustGeneration
        self.store = store
        self.disk = disk
        self.url = url
        self.response = response
        variant = response.varyKey
        limit = Int(disk == nil ? store.settings.memoryObjectSize : store.maxObjectSize)
        memoryLimit = disk == nil ? limit : Int(store.settings.memoryObjectSize)
        remainingDeclared = contentLength.map { Int($0) }
        declared = remainingDeclared
        token = store.memory.beginFill(url)
        keepsMemoryCopy = (contentLength ?? 0) <= Int64(memoryLimit)
        writer = disk?.beginWrite(key: url, variant: variant, metadata: response.encode())
        if writer == nil, !keepsMemoryCopy { abandon() }
        if let fetch, contentLength.map({ $0 > 0 }) ?? (writer != nil), !abandoned {
            // Readers announce a known length; an unknown one is read only from a disk write
            // (a memory copy of unknown length may outgrow its share and be dropped midway).
            if let writer {
                if fetch.publish(
                    FillStream(
                        response: response, contentLength: contentLength,
                        source: .disk(disk!, temporary: writer.temporaryName)))
                {
                    published = fetch
                }
            } else if keepsMemoryCopy, let length = contentLength,
                let evicted = store.memory.reserveFill(url, token, bytes: Int(length))
            {
                evictedForRoom += evicted
                reservedWhole = true
                let chunks = FillChunks()
                if fetch.publish(FillStream(response: response, contentLength: contentLength, source: .memory(chunks))) {
                    published = fetch
                    publishedChunks = chunks
                }
            }
        }
    }

    deinit {
        current?.deallocate()
        store.memory.endFill(url, token)
        published?.end(complete: false)  // dropped before its end (a retry, a failed head)
    }

    func append(_ data: UnsafeRawBufferPointer) {
        guard !abandoned, data.count > 0 else { return }
        guard total + data.count <= limit else { return abandon() }
        if let declared, total + data.count > declared { return abandon() }  // overruns its length
        total += data.count
        if let writer, !writer.append(data) { self.writer = nil }
        if keepsMemoryCopy {
            if total > memoryLimit || !keep(data) { dropMemoryCopy() }
        }
        if writer == nil && !keepsMemoryCopy { abandon() }
        if let published {
            if publishedChunks == nil {
                // A disk source: what the writer wrote is readable.
                if writer == nil { return failPublished() }
                published.progressed(to: Int64(total))
            } else if !keepsMemoryCopy {
                failPublished()
            }
        }
    }

    /// Copies `data` into the memory copy's chunks; false when the memory tier cannot hold
    /// another chunk (or the fill was cancelled).
    private func keep(_ data: UnsafeRawBufferPointer) -> Bool {
        var offset = 0
        while offset < data.count {
            if current == nil {
                let wanted = remainingDeclared.map { max(1, min($0, Self.maxChunk)) } ?? Self.unknownLengthChunk
                if !reservedWhole {
                    guard let evicted = store.memory.reserveFill(url, token, bytes: wanted) else { return false }
                    evictedForRoom += evicted
                }
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
        return true
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
        if let publishedChunks, let chunk = chunks.last, chunks.count > 0 {
            // A memory source: the sealed chunk is readable.
            publishedChunks.append(chunk)
            sealedBytes += chunk.count
            published?.progressed(to: Int64(sealedBytes))
        }
    }

    /// The published source broke (the disk write failed, or the memory copy was dropped):
    /// the readers' bodies cannot be completed.
    private func failPublished() {
        published?.end(complete: false)
        published = nil
        publishedChunks = nil
    }

    /// The body is published to the fetch's waiters (a shared fill: a disk file, or a memory
    /// copy reserved whole) and still intact: its client may fall behind and read it
    /// (`FillProducer`), so that readers arriving later are not paced by that client.
    var sharesItsBody: Bool { published != nil && !abandoned }

    /// `sharesItsBody`, and someone else reads it or waits for it now: only then does the
    /// transfer go on when its client goes away (it would otherwise hold no upstream slot for
    /// nobody). A waiter counts: cut off, it would fetch the same response again itself.
    var othersWantItsBody: Bool { sharesItsBody && published?.wanted == true }

    /// The fetch this fill publishes to (nil when it does not).
    var publishedFetch: CacheFetch? { published }

    /// Stops keeping the body in memory (it outgrew the share, or the tier had no room).
    private func dropMemoryCopy() {
        if keepsMemoryCopy { store.memory.releaseFill(url, token) }
        keepsMemoryCopy = false
        chunks = []
        current?.deallocate()
        current = nil
    }

    private func abandon() {
        failPublished()
        abandoned = true
        dropMemoryCopy()
        writer?.abort()
        writer = nil
    }

    /// Stores the object (the response ended whole): in the disk tier when there is one, and
    /// in memory when the copy was kept. Returns the evictions it caused (the memory tier's;
    /// the disk tier evicts by itself), or nil when nothing was stored (abandoned, too large,
    /// an invalidation came meanwhile, or the disk commit failed without a memory copy).
    func complete() -> Int? {
        guard !abandoned else { return nil }
        if let declared, total != declared {
            abandon()  // shorter than its length said: never stored
            return nil
        }
        // Every byte is readable, whatever storing does now: the disk write's file is the
        // readers' (an open descriptor outlives a rename or an unlink), the memory source's last
        // chunk is sealed here. The fetch is told it ended once the store is done, so that a
        // request woken by it finds the stored response.
        if publishedChunks != nil { seal() }
        defer {
            published?.end(complete: true)
            published = nil
        }
        var diskEntry: CacheObject.DiskEntry?
        if let writer {
            self.writer = nil
            guard store.memory.fillIsLive(url, token) else {  // an invalidation came meanwhile
                writer.abort()
                return nil
            }
            // No record while the entry changes (a lookup in between validates), then this one.
            store.recordDiskTrust(diskKey, generation: nil)
            if writer.commit() {
                store.recordDiskTrust(diskKey, generation: trustGeneration)
                storedOnDisk = true
                diskEntry = CacheObject.DiskEntry(name: writer.name, generation: writer.generation)
            }
        }
        if let disk, !storedOnDisk, keepsMemoryCopy {
            // The disk copy failed: an older disk entry of this URL must not outlive the memory one.
            disk.remove(key: url)
        }
        guard keepsMemoryCopy else {
            // Only on disk: a memory copy of this variant from before is outdated.
            store.memory.endFill(url, token)
            if storedOnDisk { store.memory.dropVariant(url, varyKey: variant) }
            return storedOnDisk ? evictedForRoom : nil
        }
        seal()
        let evicted = store.memory.insert(
            CacheObject(response: response, chunks: chunks, trustGeneration: trustGeneration, diskEntry: diskEntry),
            for: url, fill: token)
        storedInMemory = evicted != nil
        if !storedInMemory, storedOnDisk { store.memory.dropVariant(url, varyKey: variant) }
        return evicted.map { $0 + evictedForRoom } ?? (storedOnDisk ? evictedForRoom : nil)
    }
}
