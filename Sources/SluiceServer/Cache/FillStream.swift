import CLibEvent
import SluiceCore
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// What the requests waiting on a fetch read while its response is being stored (shared fills,
/// docs/caching.md): the stored head, the body's announced length, and where its bytes are —
/// the disk writer's temporary body file (with a disk tier: every byte is readable as soon as
/// the writer's `write` returned), or the memory copy's sealed chunks (without one). Published
/// on the fetch (`CacheFetch.publish`) by the `CacheFill` that stores the response: a body of
/// known length (readers announce it), or with a disk tier one of unknown length (readers send
/// it chunked, and end it when the fetch ends complete).
///
/// Threading: immutable but for the chunk list, which a `Mutex` guards; shared by the filling
/// worker and every reader's worker.
final class FillStream: Sendable {
    enum Source: Sendable {
        /// The temporary body file of a disk write in progress (`DiskCacheTier.Writer`).
        case disk(DiskCacheTier, temporary: String)
        case memory(FillChunks)
    }

    let response: CacheStoredResponse
    /// nil: unknown until the fill ends.
    let contentLength: Int64?
    let source: Source

    init(response: CacheStoredResponse, contentLength: Int64?, source: Source) {
        self.response = response
        self.contentLength = contentLength
        self.source = source
    }
}

/// The sealed chunks of a memory fill in progress, in order (appended by the filling worker).
///
/// Threading: any thread (a `Mutex`); the chunks are immutable once appended.
final class FillChunks: Sendable {
    private let chunks = Mutex<[CacheChunk]>([])

    func append(_ chunk: CacheChunk) {
        chunks.withLock { $0.append(chunk) }
    }

    /// The chunks from index `first` on.
    func chunks(from first: Int) -> ArraySlice<CacheChunk> {
        chunks.withLock { $0.count > first ? $0[first...] : [] }
    }
}

/// One request reading a fill in progress: its open source (the temporary file's descriptor,
/// opened before the head is sent, or the chunk list) and how far it got.
///
/// Threading: owned by the reading `ExchangeDriver` on its worker's thread; its descriptor is
/// closed when it goes.
final class FillReader {
    let fetch: CacheFetch
    let stream: FillStream
    let exchange: Exchange
    let keepAlive: Bool
    /// How the client's response is framed: its length announced, chunked, or by the close.
    let framing: ResponseEncoder.Framing
    /// The temporary file, read with `pread` (nil for a memory source).
    private let fd: Int32
    /// Body bytes written to the client so far.
    var offset: Int64 = 0
    /// For a memory source: the index of the next chunk, and the offset of its first byte.
    private var chunkIndex = 0
    private var chunkStart: Int64 = 0

    /// A reader of `stream`, or nil when its source cannot be opened (the disk write was just
    /// committed or abandoned: the caller looks the URL up again once the fetch ends).
    /// `offset`: body bytes the client has already (a fetching client that fell behind).
    init?(
        fetch: CacheFetch, stream: FillStream, exchange: Exchange, keepAlive: Bool, framing: ResponseEncoder.Framing,
        offset: Int64 = 0
    ) {
        switch stream.source {
        case .disk(let tier, let temporary):
            guard let fd = tier.openTemporary(temporary) else { return nil }
            self.fd = fd
        case .memory:
            fd = -1
        }
        self.fetch = fetch
        self.stream = stream
        self.exchange = exchange
        self.keepAlive = keepAlive
        self.framing = framing
        self.offset = offset
        if case .memory(let chunks) = stream.source {
            // Skip the chunks the client has already.
            for chunk in chunks.chunks(from: 0) {
                guard chunkStart + Int64(chunk.count) <= offset else { break }
                chunkStart += Int64(chunk.count)
                chunkIndex += 1
            }
        }
    }

    private var counted = false

    /// Counts this reader on its fetch (`CacheFetch.readers`) until it goes.
    func started() {
        guard !counted else { return }
        counted = true
        fetch.readerStarted()
    }

    deinit {
        if fd >= 0 { close(fd) }
        if counted { fetch.readerEnded() }
    }

    /// Moves what is stored beyond `offset` (up to `available`) into `output` while it holds
    /// less than `bound` bytes; returns the bytes moved, or nil when the file cannot be read.
    func pump(available: Int64, into output: OpaquePointer, bound: Int) -> Int? {
        var moved = 0
        while offset < available, evbuffer_get_length(output) < bound {
            switch stream.source {
            case .disk:
                let want = Int(min(available - offset, 64 << 10))
                if framing == .chunked { ResponseEncoder.chunkSizeLine(want, into: output) }
                var vec = iovec()
                guard evbuffer_reserve_space(output, want, &vec, 1) >= 1 else { return nil }
                let n = pread(fd, vec.iov_base, min(want, vec.iov_len), off_t(offset))
                guard n > 0 else {
                    vec.iov_len = 0
                    evbuffer_commit_space(output, &vec, 1)
                    return nil
                }
                vec.iov_len = n
                evbuffer_commit_space(output, &vec, 1)
                if framing == .chunked {
                    guard n == want else { return nil }  // the size line promised `want`
                    evbuffer_add(output, "\r\n", 2)
                }
                offset += Int64(n)
                moved += n
            case .memory(let chunks):
                guard let chunk = chunks.chunks(from: chunkIndex).first else { return moved }
                let from = Int(offset - chunkStart)
                let count = min(chunk.count - from, Int(available - offset))
                if framing == .chunked { ResponseEncoder.chunkSizeLine(count, into: output) }
                StoredResponseWriter.addReference(chunk, chunk.bytes.baseAddress! + from, count, into: output)
                if framing == .chunked { evbuffer_add(output, "\r\n", 2) }
                offset += Int64(count)
                moved += count
                if offset == chunkStart + Int64(chunk.count) {
                    chunkStart = offset
                    chunkIndex += 1
                }
            }
        }
        return moved
    }
}
