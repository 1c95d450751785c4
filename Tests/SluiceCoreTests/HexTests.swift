import Testing

@testable import SluiceCore

/// `Hex.lowercase` over contiguous and non-contiguous bytes.
@Suite struct HexTests {
    @Test func bytesBecomeTwoLowerCaseDigitsEach() {
        let bytes: [UInt8] = [0x00, 0x0f, 0x10, 0xa5, 0xff, 0x9a]
        #expect(Hex.lowercase(bytes) == "000f10a5ff9a")
        #expect(Hex.lowercase(bytes[2...]) == "10a5ff9a")
        #expect(Hex.lowercase(bytes.lazy.map { $0 }) == "000f10a5ff9a")
        #expect(Hex.lowercase([UInt8]()) == "")
        #expect(Hex.lowercase(Array(0...255)).count == 512)
    }
}
