import CCurl

#if canImport(Glibc)
    import Glibc
#endif

/// A request's header lines as libcurl reads them (`CURLOPT_HTTPHEADER`): a `curl_slist`
/// whose nodes and bytes are one allocation owned by this object and freed with it, instead
/// of `curl_slist_append`'s two allocations per line and a `curl_slist_free_all` on every
/// path a request can end by.
///
/// libcurl only reads the list, and only while the transfer it was given to runs: the
/// transfer keeps its `HeaderList` (through its `UpstreamRequest`) until it is detached.
/// Built with a `HeaderList.Builder`, whose buffers a worker reuses for every request.
///
/// Threading: built and used on one worker's thread.
final class HeaderList {
    /// The first node; nil for an empty list.
    let pointer: UnsafeMutablePointer<curl_slist>?
    private let block: UnsafeMutableRawPointer?
    /// How many lines it holds.
    let count: Int
    /// The lines' bytes, their NULs included.
    let byteCount: Int

    private init(_ builder: Builder) {
        count = builder.ends.count
        byteCount = builder.bytes.count
        guard count > 0 else {
            pointer = nil
            block = nil
            return
        }
        let nodesSize = count * MemoryLayout<curl_slist>.stride
        let block = UnsafeMutableRawPointer.allocate(
            byteCount: nodesSize + builder.bytes.count,
            alignment: MemoryLayout<curl_slist>.alignment)
        builder.bytes.withUnsafeBytes { bytes in
            (block + nodesSize).copyMemory(from: bytes.baseAddress!, byteCount: bytes.count)
        }
        let text = (block + nodesSize).bindMemory(to: CChar.self, capacity: builder.bytes.count)
        let nodes = block.bindMemory(to: curl_slist.self, capacity: count)
        var start = 0
        for i in 0..<count {
            nodes[i] = curl_slist(data: text + start, next: i + 1 < count ? nodes + i + 1 : nil)
            start = builder.ends[i]
        }
        self.block = block
        pointer = nodes
    }

    deinit { block?.deallocate() }

    /// The lines, as strings (for tests).
    var lines: [String] {
        var out: [String] = []
        var node = pointer
        while let n = node {
            out.append(String(cString: n.pointee.data))
            node = n.pointee.next
        }
        return out
    }

    /// Collects lines as NUL-terminated bytes; `makeList()` copies them into a `HeaderList`.
    /// Reused: `reset()` keeps the buffers' capacity.
    struct Builder {
        fileprivate var bytes: [UInt8] = []
        /// Where each line ends in `bytes`, its NUL included.
        fileprivate var ends: [Int] = []

        init() {
            bytes.reserveCapacity(1024)
            ends.reserveCapacity(32)
        }

        mutating func reset() {
            bytes.removeAll(keepingCapacity: true)
            ends.removeAll(keepingCapacity: true)
        }

        /// `Name: value`, or curl's `Name;` for an empty value (a bare `Name:` would remove
        /// a field curl adds itself instead of sending an empty one).
        mutating func append(name: some Collection<UInt8>, value: some Collection<UInt8>) {
            bytes.append(contentsOf: name)
            if value.isEmpty {
                bytes.append(0x3B)
            } else {
                bytes.append(0x3A)
                bytes.append(0x20)
                bytes.append(contentsOf: value)
            }
            endLine()
        }

        /// A whole line as curl takes it (`Expect:` removes curl's own `Expect`).
        mutating func append(line: StaticString) {
            bytes.append(contentsOf: UnsafeBufferPointer(start: line.utf8Start, count: line.utf8CodeUnitCount))
            endLine()
        }

        mutating func append(line: [UInt8]) {
            bytes.append(contentsOf: line)
            endLine()
        }

        private mutating func endLine() {
            bytes.append(0)
            ends.append(bytes.count)
        }

        func makeList() -> HeaderList { HeaderList(self) }
    }

    /// This list without the fields named in `removing` (lower-case), plus `adding` (a cache
    /// revalidation: the client's validators replaced by the stored response's).
    func replacing(_ removing: [String], adding: [(name: String, value: String)]) -> HeaderList {
        var builder = Builder()
        var node = pointer
        while let n = node {
            let line = Array(
                UnsafeBufferPointer(
                    start: UnsafeRawPointer(n.pointee.data).assumingMemoryBound(to: UInt8.self),
                    count: strlen(n.pointee.data)))
            node = n.pointee.next
            if let colon = line.firstIndex(of: UInt8(ascii: ":")),
                line.withUnsafeBufferPointer({ buf in
                    removing.contains { ASCII.equalsIgnoringCase(UnsafeBufferPointer(rebasing: buf[..<colon]), $0) }
                })
            {
                continue
            }
            builder.append(line: line)
        }
        for (name, value) in adding { builder.append(name: name.utf8, value: value.utf8) }
        return builder.makeList()
    }

    /// This list with one more line (the rare `Host` of an `upstream:` override).
    func appending(name: String, value: String) -> HeaderList {
        var builder = Builder()
        var node = pointer
        while let n = node {
            builder.append(
                line: Array(
                    UnsafeBufferPointer(
                        start: UnsafeRawPointer(n.pointee.data).assumingMemoryBound(to: UInt8.self),
                        count: strlen(n.pointee.data))))
            node = n.pointee.next
        }
        builder.append(name: name.utf8, value: value.utf8)
        return builder.makeList()
    }
}
