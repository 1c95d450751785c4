/// Bytes as lower-case hexadecimal, two digits each (digests in file and key names).
///
/// Written straight into the string's storage: a disk hit names its entry's files with two of
/// these (the key's digest and the body's generation), and the generic loop this replaces,
/// not specialized across modules, cost about 80 instructions a byte.
public enum Hex {
    public static func lowercase(_ bytes: some Sequence<UInt8>) -> String {
        if let text = bytes.withContiguousStorageIfAvailable({ lowercase(UnsafeRawBufferPointer($0)) }) {
            return text
        }
        return Array(bytes).withUnsafeBytes { lowercase($0) }
    }

    public static func lowercase(_ bytes: UnsafeRawBufferPointer) -> String {
        String(unsafeUninitializedCapacity: bytes.count * 2) { out in
            var at = 0
            for b in bytes {
                out[at] = digit(b >> 4)
                out[at + 1] = digit(b & 15)
                at += 2
            }
            return at
        }
    }

    /// The digit of a value 0...15.
    private static func digit(_ v: UInt8) -> UInt8 {
        v < 10 ? 48 + v : 87 + v
    }
}
