import Testing

@testable import SluiceCore

/// `PeerWalk` and `PeerDownMarks` (`fleet.cache`): a miss asks the members ranked above this
/// instance, owner first, skipping those marked down, and stops at this instance; a mark
/// lasts its time on the caller's clock. The ranking vectors are the ones the e2e tests'
/// Python twin of `RendezvousOwners` is checked against (Tests/e2e/test_fleet_hop.py).
@Suite struct PeerWalkTests {
    static let three = ["10.0.0.1:3128", "10.0.0.2:3128", "10.0.0.3:3128"].map { RendezvousOwners.Member(address: $0) }

    @Test func knownRankingsHoldInEveryImplementation() {
        let owners = RendezvousOwners(Self.three)
        let expected: [(String, [String])] = [
            ("http://origin.test/object/0?v=1", ["10.0.0.2:3128", "10.0.0.3:3128", "10.0.0.1:3128"]),
            ("http://origin.test/object/1?v=1", ["10.0.0.3:3128", "10.0.0.1:3128", "10.0.0.2:3128"]),
            ("http://origin.test/object/2?v=1", ["10.0.0.1:3128", "10.0.0.2:3128", "10.0.0.3:3128"]),
            ("http://origin.test/object/5?v=1", ["10.0.0.2:3128", "10.0.0.1:3128", "10.0.0.3:3128"]),
        ]
        for (key, ranking) in expected { #expect(owners.ranked(key).map(\.address) == ranking, "\(key)") }
        let weighted = RendezvousOwners([
            .init(address: "[fd00::1]:3128", weight: 1), .init(address: "[fd00::2]:3128", weight: 2),
            .init(address: "[fd00::3]:3128", weight: 3),
        ])
        #expect(
            weighted.ranked("http://origin.test/w/0").map(\.address) == ["[fd00::2]:3128", "[fd00::1]:3128", "[fd00::3]:3128"])
        #expect(
            weighted.ranked("http://origin.test/w/1").map(\.address) == ["[fd00::3]:3128", "[fd00::2]:3128", "[fd00::1]:3128"])
    }

    @Test func theWalkAsksThoseRankedAboveThisInstanceOwnerFirst() {
        let ranking = RendezvousOwners(Self.three).ranked("http://origin.test/object/0?v=1")  // 2, 3, 1
        var fromThird = PeerWalk(ranking: ranking, this: "10.0.0.1:3128")
        #expect(fromThird.peers == ["10.0.0.2:3128", "10.0.0.3:3128"])
        #expect(fromThird.next(isDown: { _ in false }) == "10.0.0.2:3128")
        #expect(fromThird.next(isDown: { _ in false }) == "10.0.0.3:3128")
        #expect(fromThird.next(isDown: { _ in false }) == nil)
        #expect(fromThird.next(isDown: { _ in false }) == nil)
        #expect(PeerWalk(ranking: ranking, this: "10.0.0.3:3128").peers == ["10.0.0.2:3128"])
        // The owner asks nobody.
        #expect(PeerWalk(ranking: ranking, this: "10.0.0.2:3128").isEmpty)
        // A ranking without this instance: every member is asked.
        #expect(PeerWalk(ranking: ranking, this: "10.0.0.9:3128").peers.count == 3)
    }

    @Test func theWalkSkipsMembersMarkedDown() {
        let ranking = RendezvousOwners(Self.three).ranked("http://origin.test/object/0?v=1")
        var walk = PeerWalk(ranking: ranking, this: "10.0.0.1:3128")
        var skipped: [String] = []
        #expect(walk.next(isDown: { $0 == "10.0.0.2:3128" }, skipped: { skipped.append($0) }) == "10.0.0.3:3128")
        #expect(skipped == ["10.0.0.2:3128"])
        var allDown = PeerWalk(ranking: ranking, this: "10.0.0.1:3128")
        #expect(allDown.next(isDown: { _ in true }, skipped: { skipped.append($0) }) == nil)
        #expect(skipped == ["10.0.0.2:3128", "10.0.0.2:3128", "10.0.0.3:3128"])
    }

    @Test func aDownMarkLastsItsTimeAndAnAnswerClearsIt() {
        let marks = PeerDownMarks(downMilliseconds: 5_000)
        #expect(!marks.isDown("10.0.0.2:3128", now: 1_000))
        marks.markDown("10.0.0.2:3128", now: 1_000)
        #expect(marks.isDown("10.0.0.2:3128", now: 1_000))
        #expect(marks.isDown("10.0.0.2:3128", now: 5_999))
        #expect(marks.down(now: 2_000) == ["10.0.0.2:3128"])
        #expect(!marks.isDown("10.0.0.3:3128", now: 2_000))
        #expect(!marks.isDown("10.0.0.2:3128", now: 6_000))
        #expect(marks.down(now: 6_000).isEmpty)
        marks.markDown("10.0.0.2:3128", now: 7_000)
        marks.markUp("10.0.0.2:3128")
        #expect(!marks.isDown("10.0.0.2:3128", now: 7_001))
        #expect(PeerDownMarks().downMilliseconds == PeerDownMarks.defaultDownMilliseconds)
    }
}
