import SluiceCore
import Testing

@testable import SluiceServer

/// The fleet's pieces that need no Redis: the protocol's encoding, the scripts' names, and how
/// many places a try asks for at once.
@Suite struct FleetTests {
    @Test func commandsAreEncodedAsArraysOfBulkStrings() {
        var command = RESPCommand(count: 4)
        command.append("EVALSHA")
        command.append("ab")
        command.append(encoded: RESPCommand.word("é"))
        command.append(Int64(-1_234_567))
        let expected = "*4\r\n$7\r\nEVALSHA\r\n$2\r\nab\r\n$2\r\né\r\n$8\r\n-1234567\r\n"
        #expect(String(decoding: command.bytes, as: UTF8.self) == expected)
    }

    @Test func scriptsAreNamedByTheSHA1OfTheirText() {
        // Redis names a script by the SHA-1 of its text (what EVALSHA sends).
        #expect(RedisScript("return 1").sha == "e0e1f9fabfc9d4800c877a703b823ac0578ff8db")
        let names = [FleetScripts.acquire, FleetScripts.hold, FleetScripts.heartbeat].map(\.sha)
        #expect(Set(names).count == 3 && names.allSatisfy { $0.count == 40 })
    }

    @Test func aLeaseIsAQuarterOfTheSmallestBurstAtMost32() {
        func size(_ bursts: Int...) -> Int {
            Fleet.leaseSize(bursts.map { RateLimit(requests: 100, periodMilliseconds: 1000, burst: $0) })
        }
        #expect(size(1) == 1 && size(5) == 1 && size(7) == 1, "a tight limit: every try asks")
        #expect(size(8) == 2 && size(100) == 25 && size(100_000) == 32)
        #expect(size(100_000, 12) == 3, "the tightest limit decides")
        #expect(Fleet.leaseSize([]) == 1)
    }
}
