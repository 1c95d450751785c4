import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// A SHA-256 digest (32 bytes), the one checksum of the disk tier's files.
struct Digest32: Equatable {
    static let size = 32
    var bytes: [UInt8]

    init(bytes: [UInt8]) { self.bytes = bytes }

    init(of data: UnsafeRawBufferPointer) {
        bytes = Crypto.sha256(data)
    }

    init(of data: [UInt8]) {
        self = data.withUnsafeBytes { Digest32(of: $0) }
    }

    /// Whether `data` hashes to this digest (compared without allocating a second array).
    func matches(_ data: UnsafeRawBufferPointer) -> Bool {
        var md = (UInt64(0), UInt64(0), UInt64(0), UInt64(0))
        return withUnsafeMutableBytes(of: &md) { out -> Bool in
            Crypto.sha256(data, into: out.baseAddress!)
            return bytes.withUnsafeBytes { memcmp($0.baseAddress!, out.baseAddress!, Self.size) == 0 }
        }
    }

    var hex: String {
        Hex.lowercase(bytes)
    }
}

/// The record file of one disk-tier entry (`<name>.meta`): which body file holds the body,
/// its length and block checksums' digest, the cache key and the caller's metadata, sealed
/// by a SHA-256 over everything before it. Little-endian throughout; the layout is in
/// `DiskCacheTier`'s doc comment.
///
/// Threading: a value; built by a writer, decoded by a reader or the start-up scan.
struct DiskEntryRecord: Equatable {
    static let magic: [UInt8] = Array("SLDCMETA".utf8)
    static let version: UInt32 = 1
    static let fixedSize = 80
    /// The largest metadata a record holds (the cache's serialized response head): 1 MiB.
    static let maxMetadata = 1 << 20
    /// The largest key a record holds: 64 KiB.
    static let maxKey = 1 << 16
    /// Block sizes a record may name: 4 KiB to 1 GiB.
    static let blockSizes: ClosedRange<UInt32> = 4096...(1 << 30)
    /// The largest body a record may name (1 PiB): with the block sizes above, the body file's
    /// size and its trailer's length cannot overflow, whatever a record that passed its seal
    /// (a deliberately forged one) says.
    static let maxBody: UInt64 = 1 << 50

    var key: [UInt8]
    var metadata: [UInt8]
    var bodyLength: UInt64
    var blockSize: UInt32
    var generation: UInt64
    /// SHA-256 of the body file's trailer (the per-block SHA-256 list).
    var trailerDigest: Digest32

    var blockCount: Int { Self.blockCount(bodyLength: bodyLength, blockSize: blockSize) }
    /// The body file's size: the body, then one 32-byte digest per block.
    var bodyFileSize: UInt64 { bodyLength + UInt64(blockCount * Digest32.size) }

    /// Whether the record's key is `key`'s `variant` (`DiskCacheTier.entryKey`), compared
    /// without building that full key.
    func holds(key: String, variant: String) -> Bool {
        var key = key
        var variant = variant
        return key.withUTF8 { k in
            variant.withUTF8 { v in
                guard self.key.count == (v.isEmpty ? k.count : k.count + 1 + v.count) else { return false }
                return self.key.withUnsafeBufferPointer { r in
                    r[0..<k.count].elementsEqual(k) && (v.isEmpty || (r[k.count] == 0 && r[(k.count + 1)...].elementsEqual(v)))
                }
            }
        }
    }

    static func blockCount(bodyLength: UInt64, blockSize: UInt32) -> Int {
        Int((bodyLength + UInt64(blockSize) - 1) / UInt64(blockSize))
    }

    func encoded() -> [UInt8] {
        var out = [UInt8]()
        out.reserveCapacity(Self.fixedSize + key.count + metadata.count + Digest32.size)
        out += Self.magic
        Self.put(Self.version, &out)
        Self.put(UInt32(0), &out)  // flags
        Self.put(UInt32(key.count), &out)
        Self.put(UInt32(metadata.count), &out)
        Self.put(bodyLength, &out)
        Self.put(blockSize, &out)
        Self.put(UInt32(0), &out)  // reserved
        Self.put(generation, &out)
        out += trailerDigest.bytes
        out += key
        out += metadata
        out += Digest32(of: out).bytes
        return out
    }

    /// Decodes and verifies a whole record file; nil for anything but an intact version-1
    /// record (wrong magic or version, lengths that disagree with the file's size, a bad seal).
    static func decode(_ bytes: [UInt8]) -> DiskEntryRecord? {
        guard bytes.count >= fixedSize + Digest32.size, Array(bytes[0..<8]) == magic,
            get32(bytes, 8) == version
        else { return nil }
        let keyLength = Int(get32(bytes, 16))
        let metadataLength = Int(get32(bytes, 20))
        guard keyLength <= maxKey, metadataLength <= maxMetadata,
            bytes.count == fixedSize + keyLength + metadataLength + Digest32.size
        else { return nil }
        let sealAt = bytes.count - Digest32.size
        let sealed = bytes.withUnsafeBytes {
            Digest32(bytes: Array(bytes[sealAt...])).matches(UnsafeRawBufferPointer(rebasing: $0[0..<sealAt]))
        }
        guard sealed else { return nil }
        let blockSize = get32(bytes, 32)
        guard blockSizes.contains(blockSize), get64(bytes, 24) <= maxBody else { return nil }
        return DiskEntryRecord(
            key: Array(bytes[fixedSize..<fixedSize + keyLength]),
            metadata: Array(bytes[fixedSize + keyLength..<sealAt]),
            bodyLength: get64(bytes, 24), blockSize: blockSize, generation: get64(bytes, 40),
            trailerDigest: Digest32(bytes: Array(bytes[48..<80])))
    }

    /// The fixed header's claim of the whole record file's size (for reading it in one go).
    static func expectedSize(header: [UInt8]) -> Int? {
        guard header.count >= fixedSize, Array(header[0..<8]) == magic, get32(header, 8) == version else { return nil }
        let keyLength = Int(get32(header, 16))
        let metadataLength = Int(get32(header, 20))
        guard keyLength <= maxKey, metadataLength <= maxMetadata else { return nil }
        return fixedSize + keyLength + metadataLength + Digest32.size
    }

    private static func put(_ v: UInt32, _ out: inout [UInt8]) {
        for i in 0..<4 { out.append(UInt8(truncatingIfNeeded: v >> (8 * UInt32(i)))) }
    }

    private static func put(_ v: UInt64, _ out: inout [UInt8]) {
        for i in 0..<8 { out.append(UInt8(truncatingIfNeeded: v >> (8 * UInt64(i)))) }
    }

    private static func get32(_ b: [UInt8], _ at: Int) -> UInt32 {
        (0..<4).reduce(UInt32(0)) { $0 | UInt32(b[at + $1]) << (8 * UInt32($1)) }
    }

    private static func get64(_ b: [UInt8], _ at: Int) -> UInt64 {
        (0..<8).reduce(UInt64(0)) { $0 | UInt64(b[at + $1]) << (8 * UInt64($1)) }
    }
}

/// The disk tier's file names inside its directory. An entry named `N` (the SHA-256 of its
/// key, 64 hex digits) is `N.meta` plus `N.G.body` (`G`: the 16-hex-digit generation of the
/// write that made it); a write in progress is `N.G.body.tmp` and `N.G.meta.tmp`.
enum DiskEntryNames {
    static func name(forKey key: String) -> String { Digest32(of: Array(key.utf8)).hex }
    static func record(_ name: String) -> String { name + ".meta" }
    static func body(_ name: String, _ generation: UInt64) -> String { "\(name).\(hex16(generation)).body" }
    static func bodyTemporary(_ name: String, _ generation: UInt64) -> String { body(name, generation) + ".tmp" }
    static func recordTemporary(_ name: String, _ generation: UInt64) -> String { "\(name).\(hex16(generation)).meta.tmp" }

    static func hex16(_ v: UInt64) -> String {
        withUnsafeBytes(of: v.bigEndian) { Hex.lowercase($0) }
    }

    /// What a directory entry is, by its name alone.
    enum Kind: Equatable {
        case record(name: String)
        case body(name: String, generation: UInt64)
        case temporary
        case foreign
    }

    static func classify(_ file: String) -> Kind {
        if file.hasSuffix(".tmp") { return isOurs(file) ? .temporary : .foreign }
        let parts = file.split(separator: ".", omittingEmptySubsequences: false)
        if parts.count == 2, parts[1] == "meta", isName(parts[0]) { return .record(name: String(parts[0])) }
        if parts.count == 3, parts[2] == "body", isName(parts[0]), parts[1].count == 16,
            let g = UInt64(parts[1], radix: 16)
        {
            return .body(name: String(parts[0]), generation: g)
        }
        return .foreign
    }

    private static func isOurs(_ file: String) -> Bool {
        guard let first = file.split(separator: ".").first else { return false }
        return isName(first)
    }

    private static func isName(_ s: Substring) -> Bool {
        s.utf8.count == 64 && s.utf8.allSatisfy { ($0 >= 48 && $0 <= 57) || ($0 >= 97 && $0 <= 102) }
    }
}
