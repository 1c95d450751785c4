import CCurl
import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// A request's header lines as libcurl reads them (`CURLOPT_HTTPHEADER`), converted from its
/// `RequestHeaderLines` when a `CurlUpstreamTransfer` hands the request to curl: a
/// `curl_slist` whose nodes and bytes are one allocation owned by this value and freed with
/// it, instead of `curl_slist_append`'s two allocations per line and a `curl_slist_free_all`
/// on every path a transfer can end by. Noncopyable: the block has one owner, and dropping it
/// is freeing it.
///
/// Curl's conventions live here and nowhere else:
/// - `Name;` sends a field with an empty value (a bare `Name:` would instead remove a field
///   curl adds itself);
/// - `Expect:` keeps curl from adding `Expect: 100-continue`, and `Accept:` (unless the
///   request carries an `Accept`) from adding `Accept: */*`: the lines end with these.
///
/// libcurl only reads the list, and only while the transfer it was given to runs: the
/// transfer keeps its `CurlHeaderList` until it is detached (`cancel()`).
///
/// Threading: made, read and dropped on one worker's thread.
struct CurlHeaderList: ~Copyable {
    /// The first node (there is always one: `Expect:`).
    let pointer: UnsafeMutablePointer<curl_slist>
    /// How many lines it holds.
    let count: Int

    init(_ lines: RequestHeaderLines) {
        let capacity = lines.count + 2
        let nodesSize = capacity * MemoryLayout<curl_slist>.stride
        // The lines' bytes are copied whole and each CR becomes the line's NUL (its LF stays,
        // unread, after it); the two directives take 8 bytes each.
        let textSize = lines.byteCount + 16
        let block = UnsafeMutableRawPointer.allocate(
            byteCount: nodesSize + textSize, alignment: MemoryLayout<curl_slist>.alignment)
        let nodes = block.bindMemory(to: curl_slist.self, capacity: capacity)
        let text = (block + nodesSize).bindMemory(to: UInt8.self, capacity: textSize)
        var made = 0
        func link(_ start: Int) {
            let data = UnsafeMutableRawPointer(text + start).assumingMemoryBound(to: CChar.self)
            (nodes + made).initialize(to: curl_slist(data: data, next: nodes + made + 1))
            made += 1
        }
        let sawAccept = lines.withBytes { bytes, ends -> Bool in
            if let source = bytes.baseAddress { text.update(from: source, count: bytes.count) }
            var sawAccept = false
            var start = 0
            for i in 0..<ends.count {
                let end = ends[i]
                text[end - 2] = 0
                if end - start > 8, text[start + 6] == 0x3A,
                    ASCII.equalsIgnoringCase(UnsafeBufferPointer(start: text + start, count: 6), "accept")
                {
                    sawAccept = true
                }
                // `Name:` is an empty value (the only colon is the last: a value that ends
                // in one follows the name's); curl's `Name;` sends it.
                if end - start > 2, text[end - 3] == 0x3A, memchr(text + start, 0x3A, end - 3 - start) == nil {
                    text[end - 3] = 0x3B
                }
                link(start)
                start = end
            }
            return sawAccept
        }
        var end = lines.byteCount
        func append(_ directive: StaticString) {
            (text + end).update(from: directive.utf8Start, count: directive.utf8CodeUnitCount)
            text[end + directive.utf8CodeUnitCount] = 0
            link(end)
            end += directive.utf8CodeUnitCount + 1
        }
        append("Expect:")
        if !sawAccept { append("Accept:") }
        nodes[made - 1].next = nil
        pointer = nodes
        count = made
    }

    deinit { UnsafeMutableRawPointer(pointer).deallocate() }

    /// The lines, as strings (for tests).
    var lines: [String] {
        var out: [String] = []
        var node: UnsafeMutablePointer<curl_slist>? = pointer
        while let n = node {
            out.append(String(cString: n.pointee.data))
            node = n.pointee.next
        }
        return out
    }
}
