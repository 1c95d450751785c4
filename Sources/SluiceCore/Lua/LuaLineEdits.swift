/// The scripts' edits of a request whose fields are still the forwarded request's lines
/// (`LuaRequestView.lines`): `req.headers:set`, `add` and `remove`, in order, as bytes in one
/// buffer — each edit its operation, its name's and its value's lengths, then their bytes. A
/// name is a token and keeps the script's case; a value is what `HTTPField` would keep
/// (visible ASCII, spaces and tabs only inside). The header methods check both before an
/// edit is recorded, so an edit needs no `HTTPField.Name` nor `String`: a `set` of lines
/// costs a scan of its bytes and a copy.
///
/// Threading: a value, made and read on the exchange's worker thread (`@unchecked Sendable`:
/// its buffer is copied before a change unless this value alone holds it).
public struct LuaLineEdits: @unchecked Sendable, Equatable {
    public enum Operation: UInt8, Sendable {
        /// Replace every field of the name by one with the value.
        case set
        /// Add a field, keeping any of the same name.
        case add
        /// Drop every field of the name (its value is empty).
        case remove
    }

    /// One edit's parts, valid inside `withEntries` only.
    public struct Entry {
        public let operation: Operation
        public let name: UnsafeBufferPointer<UInt8>
        public let value: UnsafeBufferPointer<UInt8>

        /// Whether the edit drops the fields of its name from the lines (a `set` or a `remove`).
        public var replaces: Bool { operation != .add }
    }

    /// Operation (1 byte), name length and value length (4 bytes each, unaligned), then the
    /// name's and the value's bytes, per edit.
    private static let headerSize = 9

    /// How many edits, and how many bytes they fill.
    private struct Counts {
        var edits: Int
        var bytes: Int
    }

    /// The edits' bytes: one allocation, made by the first edit (nil: none), copied before a
    /// change only when shared (a `fail_open` call edits a copy of the view).
    private var storage: ManagedBuffer<Counts, UInt8>?

    public init() {}

    /// The edits `edits` as bytes (tests; the engine records them one by one).
    public init(_ edits: [HeaderEdit]) {
        for edit in edits {
            switch edit {
            case .set(let name, let value): append(.set, name: Array(name.rawName.utf8), value: Array(value.utf8))
            case .add(let name, let value): append(.add, name: Array(name.rawName.utf8), value: Array(value.utf8))
            case .remove(let name): append(.remove, name: Array(name.rawName.utf8), value: [])
            }
        }
    }

    /// How many edits.
    public var count: Int { storage?.withUnsafeMutablePointerToHeader { $0.pointee.edits } ?? 0 }

    public var isEmpty: Bool { count == 0 }

    /// Forgets the edits, keeping the buffer when this value alone holds it: a worker hands
    /// one to every request's scripts (`LuaStateCache.spareLineEdits`), not a new one each.
    public mutating func removeAll() {
        guard isKnownUniquelyReferenced(&storage) else {
            storage = nil
            return
        }
        storage!.withUnsafeMutablePointerToHeader { $0.pointee = Counts(edits: 0, bytes: 0) }
    }

    /// Records an edit; `name` and `value` were checked by the caller.
    public mutating func append(_ operation: Operation, name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        let size = Self.headerSize + name.count + value.count
        let used = storage?.withUnsafeMutablePointerToHeader { $0.pointee.bytes } ?? 0
        if !isKnownUniquelyReferenced(&storage) || storage!.capacity < used + size {
            grow(to: max(128, (used + size) * 2), keeping: used)
        }
        storage!.withUnsafeMutablePointers { counts, base in
            let at = base + counts.pointee.bytes
            at.pointee = operation.rawValue
            UnsafeMutableRawPointer(at + 1).storeBytes(of: UInt32(truncatingIfNeeded: name.count).littleEndian, as: UInt32.self)
            UnsafeMutableRawPointer(at + 5).storeBytes(of: UInt32(truncatingIfNeeded: value.count).littleEndian, as: UInt32.self)
            if let source = name.baseAddress {
                UnsafeMutableRawPointer(at + Self.headerSize).copyMemory(from: source, byteCount: name.count)
            }
            if let source = value.baseAddress {
                UnsafeMutableRawPointer(at + Self.headerSize + name.count).copyMemory(from: source, byteCount: value.count)
            }
            counts.pointee.bytes += size
            counts.pointee.edits += 1
        }
    }

    /// A buffer of `capacity` bytes holding the first `used` of the present one.
    private mutating func grow(to capacity: Int, keeping used: Int) {
        let edits = count
        let fresh = ManagedBuffer<Counts, UInt8>.create(minimumCapacity: capacity) { _ in Counts(edits: edits, bytes: used) }
        if let storage, used > 0 {
            storage.withUnsafeMutablePointerToElements { old in
                fresh.withUnsafeMutablePointerToElements { $0.update(from: old, count: used) }
            }
        }
        storage = fresh
    }

    private mutating func append(_ operation: Operation, name: [UInt8], value: [UInt8]) {
        name.withUnsafeBytes { name in value.withUnsafeBytes { append(operation, name: name, value: $0) } }
    }

    /// Calls `body` with the edits in order, laid out in a temporary buffer (no allocation).
    public func withEntries(_ body: (UnsafeBufferPointer<Entry>) -> Void) {
        guard let storage else { return body(UnsafeBufferPointer(start: nil, count: 0)) }
        storage.withUnsafeMutablePointers { counts, base in
            let count = counts.pointee.edits
            withUnsafeTemporaryAllocation(of: Entry.self, capacity: max(count, 1)) { entries in
                var at = base
                for i in 0..<count {
                    let raw = UnsafeRawPointer(at)
                    let n = Int(UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: 1, as: UInt32.self)))
                    let v = Int(UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: 5, as: UInt32.self)))
                    let name = at + Self.headerSize
                    (entries.baseAddress! + i).initialize(
                        to: Entry(
                            operation: Operation(rawValue: at.pointee) ?? .add,
                            name: UnsafeBufferPointer(start: name, count: n),
                            value: UnsafeBufferPointer(start: name + n, count: v)))
                    at = name + n + v
                }
                body(UnsafeBufferPointer(rebasing: entries[..<count]))
                entries.baseAddress!.deinitialize(count: count)
            }
        }
    }

    public static func == (a: LuaLineEdits, b: LuaLineEdits) -> Bool {
        func bytes(_ edits: LuaLineEdits) -> [UInt8] {
            edits.storage?.withUnsafeMutablePointers { counts, base in
                Array(UnsafeBufferPointer(start: base, count: counts.pointee.bytes))
            } ?? []
        }
        return bytes(a) == bytes(b)
    }

    /// Whether an edit names `key` (ASCII, any case): a `get` of it must see the edits.
    public func touch(_ key: UnsafeRawBufferPointer) -> Bool {
        guard count > 0 else { return false }
        var found = false
        withEntries { found = $0.contains { Self.same($0.name, key) } }
        return found
    }

    /// Whether `a` and `b` are the same name, ASCII case-insensitively.
    @inline(__always)
    public static func same(_ a: UnsafeBufferPointer<UInt8>, _ b: UnsafeRawBufferPointer) -> Bool {
        guard a.count == b.count else { return false }
        for i in 0..<a.count where a[i] != b[i] {
            guard lower(a[i]) == lower(b[i]) else { return false }
        }
        return true
    }

    @inline(__always)
    private static func lower(_ b: UInt8) -> UInt8 {
        b >= UInt8(ascii: "A") && b <= UInt8(ascii: "Z") ? b | 0x20 : b
    }

    /// Whether `bytes` is a header name (an RFC 9110 token).
    public static func isName(_ bytes: UnsafeRawBufferPointer) -> Bool {
        guard !bytes.isEmpty else { return false }
        for b in bytes {
            // tchar of bytes 0x00-0x7F as two 64-bit masks: one shift and test a byte.
            let mask = b < 64 ? tcharLow : tcharHigh
            guard b < 128, mask >> UInt64(b & 63) & 1 == 1 else { return false }
        }
        return true
    }

    /// RFC 9110 tchar as bit masks, literals (no lazy global to check on each read):
    /// `!#$%&'*+-.` and the digits among bytes 0-63; the letters and `^_`|~` among 64-127
    /// (`LuaLineEditsTests` checks them against the definition).
    static let tcharLow: UInt64 = 0x03ff_6cfa_0000_0000
    static let tcharHigh: UInt64 = 0x57ff_ffff_c7ff_fffe

    /// Whether `bytes` is a value `HTTPField` keeps as it is: visible ASCII, with spaces and
    /// tabs only inside (nearly every value a script sets). Any other is checked by
    /// `HTTPField` (and refused, or legalized).
    public static func isPlainValue(_ bytes: UnsafeRawBufferPointer) -> Bool {
        guard let last = bytes.last else { return false }
        guard bytes[0] > 0x20, last > 0x20 else { return false }
        for b in bytes where b >= 0x7F || (b < 0x20 && b != 0x09) { return false }
        return true
    }
}
