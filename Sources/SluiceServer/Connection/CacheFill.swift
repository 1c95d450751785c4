import SluiceCore

/// The tee between a response streaming to its client and the shared cache: the transfer
/// hands it each body block after the block went to the client's output, and it keeps a copy
/// in chunks (one allocation per chunk: the size the `Content-Length` announces, up to 1 MiB,
/// else 64 KiB at a time). Past `limit` bytes it gives up and frees what it kept: the
/// response is still served whole, only not stored. `complete` publishes the object.
///
/// Threading: owned by the exchange on its worker's thread; what `complete` publishes is
/// immutable and shared.
final class CacheFill {
    /// The largest chunk kept in one allocation (1 MiB).
    static let maxChunk = 1 << 20
    /// The chunk size when the length is unknown (64 KiB).
    static let unknownLengthChunk = 64 << 10

    let store: CacheStore
    let url: String
    let response: CacheStoredResponse
    private let limit: Int
    private var remainingDeclared: Int?
    private var chunks: [CacheChunk] = []
    private var current: UnsafeMutableRawBufferPointer?
    private var used = 0
    private(set) var total = 0
    private(set) var abandoned = false

    init(store: CacheStore, url: String, response: CacheStoredResponse, contentLength: Int64?) {
        self.store = store
        self.url = url
        self.response = response
        limit = Int(store.maxObjectSize)
        remainingDeclared = contentLength.map { Int($0) }
    }

    deinit { current?.deallocate() }

    func append(_ data: UnsafeRawBufferPointer) {
        guard !abandoned, data.count > 0 else { return }
        guard total + data.count <= limit else { return abandon() }
        total += data.count
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

    private func abandon() {
        abandoned = true
        chunks = []
        current?.deallocate()
        current = nil
    }

    /// Stores the object (the response ended whole). Returns the evictions it caused, or nil
    /// when nothing was stored (abandoned, or larger than the memory tier).
    func complete() -> Int? {
        guard !abandoned else { return nil }
        seal()
        return store.memory.insert(CacheObject(response: response, chunks: chunks), for: url)
    }
}
