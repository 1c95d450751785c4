import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// The header lines a forwarded request carries upstream, as either transport sends them:
/// `Name: value\r\n` each (`Name:\r\n` for an empty value), in order, in one buffer — so the
/// native transport writes them with one copy (`UpstreamRequestEncoder`), and libcurl gets
/// them converted when a transfer starts (`CurlHeaderList`). It holds fields only: no
/// transport's directives (curl's `Expect:` and `Accept:` are the conversion's business), no
/// framing (`Content-Length`, `Transfer-Encoding`: the transport writes the body's own) and
/// no `Host` unless one was asked for (an `upstream:` override), which `carriesHost` says.
///
/// One allocation: the bytes and, after them, where each line ends, in a `ManagedBuffer`
/// whose header holds the counts. Built with a `Builder`, whose buffers a worker reuses for
/// every request; a value never changes once built, and the editing operations
/// (`replacing`, `appending`) make new ones.
///
/// Threading: built and read on one worker's thread.
struct RequestHeaderLines {
    private struct Counts {
        /// How many lines.
        var count: Int
        /// The lines' bytes, their CRLFs included.
        var byteCount: Int
        var carriesHost: Bool
    }

    /// The bytes (`byteCount`), then each line's end offset as an unaligned `UInt32` (`count`;
    /// a request head is far below 4 GiB).
    private let storage: ManagedBuffer<Counts, UInt8>

    /// Read through the header's pointer: `ManagedBuffer.header`, a class's stored property,
    /// would be checked for exclusive access on every read.
    private var counts: Counts { storage.withUnsafeMutablePointerToHeader { $0.pointee } }
    /// How many lines it holds.
    var count: Int { counts.count }
    /// The lines' bytes, their CRLFs included.
    var byteCount: Int { counts.byteCount }
    /// A `Host` line is among them (any case): the transport derives none from the target.
    var carriesHost: Bool { counts.carriesHost }

    private init(_ builder: Builder) {
        let byteCount = builder.bytes.count
        let count = builder.ends.count
        storage = .create(minimumCapacity: byteCount + count * MemoryLayout<UInt32>.size) { _ in
            Counts(count: count, byteCount: byteCount, carriesHost: builder.carriesHost)
        }
        storage.withUnsafeMutablePointerToElements { base in
            builder.bytes.withUnsafeBufferPointer {
                if let source = $0.baseAddress { base.update(from: source, count: $0.count) }
            }
            builder.ends.withUnsafeBytes {
                if let source = $0.baseAddress {
                    UnsafeMutableRawPointer(base + byteCount).copyMemory(from: source, byteCount: $0.count)
                }
            }
        }
    }

    /// Where each line ends in the lines' bytes, after its CRLF.
    struct LineEnds {
        fileprivate let base: UnsafeRawPointer
        let count: Int

        subscript(i: Int) -> Int {
            Int(base.loadUnaligned(fromByteOffset: i * MemoryLayout<UInt32>.size, as: UInt32.self))
        }
    }

    /// Calls `body` with every line's bytes at once, CRLFs included — the head's field
    /// section as it goes on the wire — and where each line ends in them.
    func withBytes<R>(_ body: (UnsafeBufferPointer<UInt8>, LineEnds) throws -> R) rethrows -> R {
        try storage.withUnsafeMutablePointers { header, base in
            let counts = header.pointee
            return try body(
                UnsafeBufferPointer(start: base, count: counts.byteCount),
                LineEnds(base: UnsafeRawPointer(base + counts.byteCount), count: counts.count))
        }
    }

    /// Calls `body` with each field's name and value in order (no CRLF; an empty value for a
    /// `Name:` line).
    func forEachField(
        _ body: (_ name: UnsafeBufferPointer<UInt8>, _ value: UnsafeBufferPointer<UInt8>) throws -> Void
    )
        rethrows
    {
        try withBytes { try Self.forEachField(in: $0, ending: $1, body) }
    }

    /// `forEachField` on lines' bytes as they are laid out (these lines', or a builder's
    /// before they are made: `Builder.withLines`).
    static func forEachField(
        in bytes: UnsafeBufferPointer<UInt8>, ending ends: LineEnds,
        _ body: (_ name: UnsafeBufferPointer<UInt8>, _ value: UnsafeBufferPointer<UInt8>) throws -> Void
    ) rethrows {
        var start = 0
        for i in 0..<ends.count {
            let end = ends[i]
            let line = UnsafeBufferPointer(rebasing: bytes[start..<end - 2])
            start = end
            // A name is a token, so the first colon ends it; the builder put one SP after it
            // before a value, none before an empty one.
            let colon = line.firstIndex(of: 0x3A) ?? line.count
            let valueStart = min(colon + 2, line.count)
            try body(UnsafeBufferPointer(rebasing: line[..<colon]), UnsafeBufferPointer(rebasing: line[valueStart...]))
        }
    }

    /// The lines, as strings without their CRLFs (for tests).
    var lines: [String] {
        var out: [String] = []
        out.reserveCapacity(count)
        forEachField { name, value in
            out.append(
                String(decoding: name, as: UTF8.self) + (value.isEmpty ? ":" : ": ") + String(decoding: value, as: UTF8.self))
        }
        return out
    }

    /// Collects lines; `makeLines()` copies them into a `RequestHeaderLines`. Reused:
    /// `reset()` keeps the buffers' capacity. A copy (a script's view of the lines) shares the
    /// buffers until either changes, as arrays do.
    struct Builder: Sendable {
        /// Where each line ends in `bytes`, its CRLF included.
        fileprivate var ends: [UInt32] = []
        /// The lines' bytes, a line written in one step (a line appended to an array took six
        /// appends). Declared between `ends` and `carriesHost` so that the builder stays within
        /// an existential's three words: a script's view (`any LuaHeaderLines`) holds it
        /// without a box on the heap.
        fileprivate var bytes: ByteRoom
        fileprivate var carriesHost = false

        init(capacity: Int = 1024, lines: Int = 32) {
            bytes = ByteRoom(capacity: capacity)
            ends.reserveCapacity(lines)
        }

        mutating func reset() {
            bytes.removeAll()
            if !ends.isEmpty { ends.removeAll(keepingCapacity: true) }
            carriesHost = false
        }

        /// `Name: value`, or `Name:` for an empty value, written in one step.
        mutating func append(name: some Collection<UInt8>, value: some Collection<UInt8>) {
            let n = name.count
            let v = value.count
            if n == 4, name.withContiguousStorageIfAvailable({ ASCII.equalsIgnoringCase($0, "host") }) ?? false {
                carriesHost = true
            }
            bytes.write(atMost: n + v + 4) { out in
                var k = Self.copy(name, to: out)
                out[k] = 0x3A
                k += 1
                if v != 0 {
                    out[k] = 0x20
                    k += 1
                    k += Self.copy(value, to: out + k)
                }
                out[k] = 0x0D
                out[k + 1] = 0x0A
                return k + 2
            }
            ends.append(UInt32(bytes.count))
        }

        /// Copies `part` to `out`, returning its length: in one copy when its bytes lie in
        /// memory (a `String`'s UTF-8: the edits' names and values, the request id), else
        /// byte by byte.
        @inline(__always)
        private static func copy(_ part: some Collection<UInt8>, to out: UnsafeMutablePointer<UInt8>) -> Int {
            if let n = part.withContiguousStorageIfAvailable({ source -> Int in
                if let from = source.baseAddress { ShortCopy.copy(out, from, source.count) }
                return source.count
            }) {
                return n
            }
            var k = 0
            for b in part {
                out[k] = b
                k += 1
            }
            return k
        }

        /// Lines `range` of `lines` as they are, in one copy.
        mutating func append(lines: RequestHeaderLines, _ range: Range<Int>) {
            guard !range.isEmpty else { return }
            if lines.carriesHost { carriesHost = true }
            lines.withBytes { source, sourceEnds in
                let start = range.lowerBound == 0 ? 0 : sourceEnds[range.lowerBound - 1]
                let offset = bytes.count - start
                bytes.append(
                    UnsafeRawBufferPointer(UnsafeBufferPointer(rebasing: source[start..<sourceEnds[range.upperBound - 1]])))
                for i in range { ends.append(UInt32(sourceEnds[i] + offset)) }
            }
        }

        /// How many lines it holds.
        var lineCount: Int { ends.count }

        /// Sets `carriesHost` from the lines it holds: after some were dropped, a `Host`
        /// among them may be gone (the transport then derives one from the target).
        mutating func recountHost() {
            var found = false
            withLines { bytes, ends in
                RequestHeaderLines.forEachField(in: bytes, ending: ends) { name, _ in
                    if !found, name.count == 4, ASCII.equalsIgnoringCase(name, "host") { found = true }
                }
            }
            carriesHost = found
        }

        /// Calls `body` with the lines' bytes as they are, CRLFs included, and where each
        /// ends (as `RequestHeaderLines.withBytes`), without making them.
        func withLines<R>(_ body: (UnsafeBufferPointer<UInt8>, LineEnds) -> R) -> R {
            bytes.withUnsafeBufferPointer { bytes in
                ends.withUnsafeBytes { ends in
                    // No line, no address: `LineEnds` never reads it then.
                    let base = ends.baseAddress ?? UnsafeRawPointer(bitPattern: MemoryLayout<UInt32>.alignment)!
                    return body(bytes, LineEnds(base: base, count: self.ends.count))
                }
            }
        }

        /// A whole `Name: value` line, as it is (Sluice's `Via`, made once per worker).
        mutating func append(line: [UInt8]) {
            if line.count > 4, line[4] == 0x3A,
                line.withUnsafeBufferPointer({ ASCII.equalsIgnoringCase(UnsafeBufferPointer(rebasing: $0[..<4]), "host") })
            {
                carriesHost = true
            }
            bytes.write(atMost: line.count + 2) { out in
                line.withUnsafeBufferPointer { if let from = $0.baseAddress { ShortCopy.copy(out, from, $0.count) } }
                out[line.count] = 0x0D
                out[line.count + 1] = 0x0A
                return line.count + 2
            }
            ends.append(UInt32(bytes.count))
        }

        func makeLines() -> RequestHeaderLines { RequestHeaderLines(self) }
    }

    /// These lines without the fields named in `removing` (lower-case), plus `adding` (a
    /// cache revalidation's validators, a resume's range).
    func replacing(_ removing: [String], adding: [(name: String, value: String)]) -> RequestHeaderLines {
        var builder = Builder(capacity: byteCount + 256, lines: count + adding.count)
        forEachField { name, value in
            if !removing.contains(where: { ASCII.equalsIgnoringCase(name, string: $0) }) {
                builder.append(name: name, value: value)
            }
        }
        for (name, value) in adding { builder.append(name: name.utf8, value: value.utf8) }
        return builder.makeLines()
    }

    /// These lines and one more (the rare `Host` of an `upstream:` override).
    func appending(name: String, value: String) -> RequestHeaderLines {
        replacing([], adding: [(name, value)])
    }
}
