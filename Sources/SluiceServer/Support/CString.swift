extension String {
    /// The text of a NUL-terminated C buffer filled by a C call (up to its first NUL).
    init(cBuffer: [CChar]) {
        self = String(decoding: cBuffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
