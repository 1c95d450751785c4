import CLibEvent
import SluiceCore

/// Writes a stored response to a client's output (docs/caching.md): the head (`304` for the
/// client's matching conditional, `206`/`416` for a `Range`) with `Via`, `Age`,
/// `Cache-Status` and `Content-Length`, then the body — from memory at once, or from the
/// disk tier a block at a time as the client drains.
///
/// A small memory chunk is copied; a large one is added by reference: the chunk is retained
/// (`passRetained`) for libevent, and the cleanup callback, which libevent calls exactly once
/// when those bytes are drained or the buffer is freed (on this worker's thread), releases it —
/// so the bytes outlive an eviction or a revalidation that drops the object meanwhile.
///
/// A disk hit to a plain-http client is sent by the kernel instead (`pumpKernel`): the body
/// file's bytes go to the socket with `sendfile(2)`, queued as file segments of at most
/// `kernelSlice` behind the head; only blocks not yet verified at the file's identity are read
/// first (`DiskCacheTier+KernelSend`). TLS clients and a hit that promotes its entry to memory
/// need the bytes in user space and take the read path (`pump`).
///
/// Threading: the worker's thread. A disk block is read and verified on it (one `pread` of
/// the tier's block size plus its SHA-256), only while the client's output holds less than
/// `diskOutputBound`: the loop never waits for a slow client.
enum StoredResponseWriter {
    /// Chunks at least this large (16 KiB) are written by reference, smaller ones copied.
    static let referenceThreshold = 16 << 10
    /// A disk hit reads its next block only while the client's output holds less than this
    /// (1 MiB): a slow client holds at most this plus one block in memory.
    static let diskOutputBound = 1 << 20
    /// A disk hit the kernel sends is queued in slices of this much (1 MiB, rounded to whole
    /// blocks), each checked (`fstat`, and any block not yet verified) just before it is
    /// queued, while the client's output holds less than `diskOutputBound`.
    static let kernelSlice = 1 << 20

    /// The fields a `304` from the cache carries (RFC 9110 §15.4.5).
    static let notModifiedFields: Set<String> = [
        "cache-control", "content-location", "date", "etag", "expires",
        "vary", "last-modified",
    ]

    /// Writes the head of `answer` for a request (`isHead`: a HEAD; `range` and `ifRange`: its
    /// `Range` and `If-Range` values); returns the status sent and the part of the body that
    /// follows it (empty: none).
    ///
    /// `unknownLength`: the body's length is not known yet (a shared fill of a chunked
    /// response): it is sent chunked (`.chunked`) or up to the close (`.close`, for an HTTP/1.0
    /// client), and the returned range is `0..<Int.max`.
    static func writeHead(
        _ answer: StoredAnswer, isHead: Bool, range rangeValue: String?, ifRange: String? = nil, keepAlive: Bool,
        viaLine: [UInt8], unknownLength: ResponseEncoder.Framing? = nil, into output: OpaquePointer
    ) -> (status: Int, body: Range<Int>) {
        let object = answer.object
        var range = CacheRange.full
        if !answer.notModified, !isHead, object.response.status == 200, unknownLength == nil, let rangeValue,
            ifRange.map({
                CacheRange.ifRangeHolds(
                    $0, etag: object.response.etag, lastModified: object.response.parsed.lastModified,
                    date: object.response.parsed.date)
            }) ?? true
        {
            range = CacheRange.evaluate(rangeValue, length: Int64(object.bodyLength))
        }
        let status: Int
        var bodyRange = 0..<object.bodyLength
        var contentRange: (first: Int64?, last: Int64)?  // `first` nil: `bytes */length`
        switch range {
        case _ where answer.notModified: status = 304
        case .full: status = object.response.status
        case .partial(let first, let last):
            status = 206
            bodyRange = Int(first)..<Int(last + 1)
            contentRange = (first, last)
        case .unsatisfiable:
            status = 416
            bodyRange = 0..<0
            contentRange = (nil, 0)
        }
        let bodiless = answer.notModified || status == 204 || status < 200
        let metadataOnly = answer.notModified || status == 416
        // The head in one buffer, one copy into the output (no string is built per field).
        var head: [UInt8] = []
        head.reserveCapacity(192 + object.fieldLines.count + viaLine.count + answer.parameters.utf8.count)
        head.append(contentsOf: "HTTP/1.1 ".utf8)
        ASCII.appendDecimal(status, to: &head)
        head.append(0x20)
        head.append(contentsOf: ResponseEncoder.reasonPhrase(status).utf8)
        head.append(contentsOf: "\r\n".utf8)
        if metadataOnly {
            for field in object.response.fields where notModifiedFields.contains(field.name.lowercased()) {
                head.append(contentsOf: field.name.utf8)
                head.append(contentsOf: ": ".utf8)
                head.append(contentsOf: field.value.utf8)
                head.append(contentsOf: "\r\n".utf8)
            }
        } else {
            head.append(contentsOf: object.fieldLines)
        }
        head.append(contentsOf: viaLine)
        head.append(contentsOf: "Age: ".utf8)
        ASCII.appendDecimal(Int(answer.age), to: &head)
        head.append(contentsOf: "\r\n".utf8)
        if let contentRange {
            head.append(contentsOf: "Content-Range: bytes ".utf8)
            if let first = contentRange.first {
                ASCII.appendDecimal(Int(first), to: &head)
                head.append(UInt8(ascii: "-"))
                ASCII.appendDecimal(Int(contentRange.last), to: &head)
            } else {
                head.append(UInt8(ascii: "*"))
            }
            head.append(UInt8(ascii: "/"))
            ASCII.appendDecimal(object.bodyLength, to: &head)
            head.append(contentsOf: "\r\n".utf8)
        }
        head.append(contentsOf: "Cache-Status: Sluice; ".utf8)
        head.append(contentsOf: answer.parameters.utf8)
        head.append(contentsOf: "\r\n".utf8)
        if !bodiless {
            switch unknownLength {
            case nil:
                head.append(contentsOf: "Content-Length: ".utf8)
                ASCII.appendDecimal(bodyRange.count, to: &head)
                head.append(contentsOf: "\r\n".utf8)
            case .chunked?: head.append(contentsOf: "Transfer-Encoding: chunked\r\n".utf8)
            default: break  // up to the close
            }
            if unknownLength != nil { bodyRange = 0..<Int.max }
        }
        if !keepAlive { head.append(contentsOf: "Connection: close\r\n".utf8) }
        head.append(contentsOf: "\r\n".utf8)
        head.withUnsafeBytes { _ = evbuffer_add(output, $0.baseAddress, $0.count) }
        return (status, bodiless || isHead ? 0..<0 : bodyRange)
    }

    /// Writes `range` of a memory object's body; returns the bytes written.
    static func writeBody(_ object: CacheObject, _ range: Range<Int>, into output: OpaquePointer) -> Int {
        guard !range.isEmpty else { return 0 }
        var sent = 0
        var offset = 0
        for chunk in object.chunks {
            defer { offset += chunk.count }
            // The part of this chunk inside the range (all of it without a Range).
            let from = max(range.lowerBound, offset)
            let to = min(range.upperBound, offset + chunk.count)
            guard from < to else { continue }
            let start = chunk.bytes.baseAddress! + (from - offset)
            let count = to - from
            if count >= referenceThreshold {
                addReference(chunk, start, count, into: output)
            } else {
                evbuffer_add(output, start, count)
            }
            sent += count
        }
        return sent
    }

    /// Adds `count` bytes of `chunk` from `start` to `output` by reference: the chunk is
    /// retained until libevent has sent them or freed the buffer (see the type's note).
    static func addReference(
        _ chunk: CacheChunk, _ start: UnsafeRawPointer, _ count: Int, into output: OpaquePointer
    ) {
        let retained = Unmanaged.passRetained(chunk).toOpaque()
        evbuffer_add_reference(
            output, start, count,
            { _, _, extra in
                Unmanaged<CacheChunk>.fromOpaque(extra!).release()
            }, retained)
    }

    /// Sends a disk hit's next blocks while the client's output is below `diskOutputBound`.
    /// Returns why the body cannot be completed (a block failed its digest, the entry ended
    /// early), or nil.
    static func pump(_ hit: DiskHitStream, into output: OpaquePointer) -> String? {
        while hit.offset < hit.range.upperBound, evbuffer_get_length(output) < diskOutputBound {
            let start = hit.offset
            let range = hit.range
            let read: Int?
            do {
                read = try hit.reader.withNextBlock { bytes -> Int in
                    hit.promotion?.append(bytes)
                    let from = max(range.lowerBound, start)
                    let to = min(range.upperBound, start + bytes.count)
                    if from < to { evbuffer_add(output, bytes.baseAddress! + (from - start), to - from) }
                    return bytes.count
                }
            } catch {
                return "disk cache entry corrupt at block \(error.block)"
            }
            guard let read, read > 0 else { return "disk cache entry ended early" }
            hit.sent += min(range.upperBound, start + read) - max(range.lowerBound, start)
            hit.offset += read
        }
        if hit.offset >= hit.range.upperBound, let promotion = hit.promotion {
            hit.promotion = nil
            promotion.complete()
            if promotion.evicted > 0 { hit.exchange.reportCache(.evicted(count: promotion.evicted)) }
        }
        return nil
    }

    /// Queues a disk hit's next slices for the kernel to send (`sendfile` from the body file)
    /// while the client's output holds less than `diskOutputBound`. Returns why the body cannot
    /// be completed (a block failed its digest, the file is not the size it should be, libevent
    /// refused the segment), or nil.
    static func pumpKernel(_ hit: DiskHitStream, into output: OpaquePointer) -> String? {
        let reader = hit.reader
        let slice = max(1, kernelSlice / reader.blockSize) * reader.blockSize
        while hit.offset < hit.range.upperBound, evbuffer_get_length(output) < diskOutputBound {
            let end = min(hit.range.upperBound, (hit.offset / slice + 1) * slice)
            do {
                try reader.prepareKernelSend(hit.offset..<end)
            } catch {
                return "disk cache entry corrupt at block \(error.block)"
            }
            guard let segment = hit.fileSegment(),
                evbuffer_add_file_segment(output, segment, Int64(hit.offset), Int64(end - hit.offset)) == 0
            else { return "disk cache entry cannot be queued for sendfile" }
            reader.tier.countKernelSend(end - hit.offset)
            hit.sent += end - hit.offset
            hit.offset = end
        }
        return nil
    }
}

/// A stored response whose body streams from the disk tier to one client: the entry's open
/// reader (the entry may be evicted or replaced meanwhile; the reader keeps its file), the
/// byte range sent, how far it got, and the copy that promotes a small entry to memory when
/// the whole body is read (`CachePromotion`) — or, when the kernel sends it (`kernel`), the
/// libevent file segment over the body file that its slices are queued from.
///
/// Threading: owned by its connection's `ExchangeDriver` (its `.servingDisk` phase) on the
/// worker's thread. The reader's descriptor is closed when the stream goes and no queued file
/// segment still needs it: the segment holds the reader (released by libevent's cleanup
/// callback, on this thread, once its last slice is sent or the output is freed).
final class DiskHitStream {
    let reader: DiskCacheTier.Reader
    let exchange: Exchange
    let range: Range<Int>
    let keepAlive: Bool
    /// Whether the kernel sends the body (`StoredResponseWriter.pumpKernel`), not the read path.
    let kernel: Bool
    /// The body offset of the next block to read (the read path), or of the next byte to queue
    /// (the kernel's).
    var offset: Int
    var sent = 0
    var promotion: CachePromotion?
    /// Made on the first slice (`fileSegment()`); this stream's reference is dropped with it.
    private var segment: OpaquePointer?

    init(
        reader: DiskCacheTier.Reader, exchange: Exchange, range: Range<Int>, keepAlive: Bool,
        promotion: CachePromotion? = nil, kernel: Bool = false
    ) {
        self.reader = reader
        self.exchange = exchange
        self.range = range
        self.keepAlive = keepAlive
        // The kernel sends from any offset; a promotion needs the bytes, so it reads them.
        self.kernel = kernel && promotion == nil
        offset = self.kernel ? range.lowerBound : Int(reader.seek(toBlockContaining: UInt64(range.lowerBound)))
        // Only a body read whole, from its first block to its last, is promoted.
        self.promotion = offset == 0 && range.upperBound == Int(reader.bodyLength) ? promotion : nil
    }

    deinit {
        if let segment { evbuffer_file_segment_free(segment) }
    }

    /// The libevent file segment over the whole body (no locking: one thread uses it), made on
    /// first use; nil if libevent cannot make one.
    func fileSegment() -> OpaquePointer? {
        if let segment { return segment }
        guard
            let made = evbuffer_file_segment_new(
                reader.fd, 0, Int64(reader.bodyLength), UInt32(EVBUF_FS_DISABLE_LOCKING))
        else { return nil }
        evbuffer_file_segment_add_cleanup_cb(
            made,
            { _, _, reader in
                Unmanaged<DiskCacheTier.Reader>.fromOpaque(reader!).release()
            }, Unmanaged.passRetained(reader).toOpaque())
        segment = made
        return made
    }
}
