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
/// Threading: the worker's thread. A disk block is read and verified on it (one `pread` of
/// the tier's block size plus its SHA-256), only while the client's output holds less than
/// `diskOutputBound`: the loop never waits for a slow client.
enum StoredResponseWriter {
    /// Chunks at least this large (16 KiB) are written by reference, smaller ones copied.
    static let referenceThreshold = 16 << 10
    /// A disk hit reads its next block only while the client's output holds less than this
    /// (1 MiB): a slow client holds at most this plus one block in memory.
    static let diskOutputBound = 1 << 20

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
        var contentRange: String?
        switch range {
        case _ where answer.notModified: status = 304
        case .full: status = object.response.status
        case .partial(let first, let last):
            status = 206
            bodyRange = Int(first)..<Int(last + 1)
            contentRange = "bytes \(first)-\(last)/\(object.bodyLength)"
        case .unsatisfiable:
            status = 416
            bodyRange = 0..<0
            contentRange = "bytes */\(object.bodyLength)"
        }
        let bodiless = answer.notModified || status == 204 || status < 200
        let metadataOnly = answer.notModified || status == 416
        var statusLine = "HTTP/1.1 \(status) \(ResponseEncoder.reasonPhrase(status))\r\n"
        statusLine.withUTF8 { _ = evbuffer_add(output, $0.baseAddress, $0.count) }
        if metadataOnly {
            var text = ""
            for field in object.response.fields where notModifiedFields.contains(field.name.lowercased()) {
                text += field.name + ": " + field.value + "\r\n"
            }
            text.withUTF8 { _ = evbuffer_add(output, $0.baseAddress, $0.count) }
        } else {
            object.fieldLines.withUnsafeBytes { _ = evbuffer_add(output, $0.baseAddress, $0.count) }
        }
        var text = "Age: \(answer.age)\r\n"
        if let contentRange { text += "Content-Range: \(contentRange)\r\n" }
        viaLine.withUnsafeBytes { _ = evbuffer_add(output, $0.baseAddress, $0.count) }
        text += "Cache-Status: Sluice; \(answer.parameters)\r\n"
        if !bodiless {
            switch unknownLength {
            case nil: text += "Content-Length: \(bodyRange.count)\r\n"
            case .chunked?: text += "Transfer-Encoding: chunked\r\n"
            default: break  // up to the close
            }
            if unknownLength != nil { bodyRange = 0..<Int.max }
        }
        if !keepAlive { text += "Connection: close\r\n" }
        text += "\r\n"
        text.withUTF8 { _ = evbuffer_add(output, $0.baseAddress, $0.count) }
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
}

/// A stored response whose body streams from the disk tier to one client: the entry's open
/// reader (the entry may be evicted or replaced meanwhile; the reader keeps its file), the
/// byte range sent, how far it got, and the copy that promotes a small entry to memory when
/// the whole body is read (`CachePromotion`).
///
/// Threading: owned by its connection's `ExchangeDriver` (its `.servingDisk` phase) on the
/// worker's thread; the reader's descriptor is closed when the stream goes.
final class DiskHitStream {
    let reader: DiskCacheTier.Reader
    let exchange: Exchange
    let range: Range<Int>
    let keepAlive: Bool
    /// The body offset of the next block to read.
    var offset: Int
    var sent = 0
    var promotion: CachePromotion?

    init(
        reader: DiskCacheTier.Reader, exchange: Exchange, range: Range<Int>, keepAlive: Bool,
        promotion: CachePromotion? = nil
    ) {
        self.reader = reader
        self.exchange = exchange
        self.range = range
        self.keepAlive = keepAlive
        offset = Int(reader.seek(toBlockContaining: UInt64(range.lowerBound)))
        // Only a body read whole, from its first block to its last, is promoted.
        self.promotion = offset == 0 && range.upperBound == Int(reader.bodyLength) ? promotion : nil
    }
}
