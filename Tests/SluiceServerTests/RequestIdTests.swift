import Testing

@testable import SluiceServer

/// `Worker.requestId`: the worker's prefix and the id in lowercase hex, as
/// `prefix + String(id, radix: 16)` writes them, at every digit count.
@Suite struct RequestIdTests {
    @Test func theIdIsLowercaseHexAfterThePrefix() {
        var ids: [UInt64] = [0, 1, 9, 10, 15, 16, 0xff, 0x100, 0xdead_beef, 1 << 48 | 42, .max]
        for shift in 0..<64 { ids.append(1 << UInt64(shift)) }
        for shift in 1..<64 { ids.append((1 << UInt64(shift)) - 1) }
        for prefix in ["", "ab12cd34-", "a-prefix-longer-than-a-small-string-"] {
            for id in ids {
                #expect(Worker.requestId(prefix: prefix, id) == prefix + String(id, radix: 16))
            }
        }
    }
}
