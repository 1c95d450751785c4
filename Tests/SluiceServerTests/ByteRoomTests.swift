import Testing

@testable import SluiceServer

/// `ByteRoom`: bytes appended and written in place, room made from none and grown, nothing
/// written for an empty piece, and a copy that keeps its bytes while the original is emptied
/// and written again.
@Suite struct ByteRoomTests {
    private func text(_ room: ByteRoom) -> String { String(decoding: room.bytes, as: UTF8.self) }

    @Test func appendsAndWritesGrowFromNoRoom() {
        var room = ByteRoom()
        Array("".utf8).withUnsafeBytes { room.append($0) }
        #expect(room.count == 0 && room.bytes.isEmpty)
        let long = String(repeating: "x", count: 700)
        Array(long.utf8).withUnsafeBytes { room.append($0) }
        room.write(atMost: 4) { out in
            out[0] = 0x21
            return 1
        }
        #expect(room.count == 701 && text(room) == long + "!")
        #expect(room.withUnsafeBufferPointer { $0.count } == 701)
    }

    @Test func aCopyKeepsItsBytes() {
        var room = ByteRoom(capacity: 8)
        Array("first".utf8).withUnsafeBytes { room.append($0) }
        let kept = room
        room.removeAll()
        Array("second".utf8).withUnsafeBytes { room.append($0) }
        #expect(text(kept) == "first" && text(room) == "second")
        #expect(MemoryLayout<ByteRoom>.size <= 12)
    }
}
