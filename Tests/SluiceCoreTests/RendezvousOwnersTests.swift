import Testing

@testable import SluiceCore

/// `RendezvousOwners`: the same order in every process, minimal movement when a member
/// leaves or joins, shares proportional to the weights, and the ranking as the fallback order.
@Suite struct RendezvousOwnersTests {
    static let three = [
        RendezvousOwners.Member(address: "10.0.0.1:3128"), RendezvousOwners.Member(address: "10.0.0.2:3128"),
        RendezvousOwners.Member(address: "10.0.0.3:3128"),
    ]
    static let keys = (0..<6000).map { "http://origin.test/object/\($0)?v=1" }

    @Test func theOrderDependsOnlyOnTheMembersNotOnTheirOrderOrTheProcess() {
        let a = RendezvousOwners(Self.three)
        let b = RendezvousOwners(Self.three.reversed())
        for key in Self.keys.prefix(500) {
            #expect(a.ranked(key) == b.ranked(key))
            #expect(a.owner(of: key) == a.ranked(key).first)
        }
        // Fixed hashes (not Swift's per-process seed): these owners hold in every process.
        #expect(RendezvousOwners.fnv1a("a".utf8) == 0xaf63_dc4c_8601_ec8c)
        let owners = Self.keys.prefix(4).map { a.owner(of: $0)!.address }
        #expect(owners == Self.keys.prefix(4).map { RendezvousOwners(Self.three).owner(of: $0)!.address })
        #expect(RendezvousOwners([]).owner(of: "x") == nil && RendezvousOwners([]).ranked("x").isEmpty)
    }

    @Test func removingAMemberMovesOnlyItsKeysToTheirNextMember() {
        let all = RendezvousOwners(Self.three)
        let fewer = RendezvousOwners(Array(Self.three.prefix(2)))
        var moved = 0
        for key in Self.keys {
            let ranking = all.ranked(key)
            if ranking[0] == Self.three[2] {
                moved += 1
                #expect(fewer.owner(of: key) == ranking[1])
            } else {
                #expect(fewer.owner(of: key) == ranking[0])
            }
        }
        #expect(abs(Double(moved) / Double(Self.keys.count) - 1.0 / 3.0) < 0.03)
        // A member that joins takes keys only from the others, never shuffles theirs.
        let four = RendezvousOwners(Self.three + [RendezvousOwners.Member(address: "10.0.0.4:3128")])
        for key in Self.keys {
            let owner = four.owner(of: key)!
            #expect(owner.address == "10.0.0.4:3128" || owner == all.owner(of: key))
        }
    }

    @Test func sharesFollowTheWeights() {
        let members = [
            RendezvousOwners.Member(address: "[fd00::1]:3128", weight: 1),
            RendezvousOwners.Member(address: "[fd00::2]:3128", weight: 2),
            RendezvousOwners.Member(address: "[fd00::3]:3128", weight: 3),
        ]
        let owners = RendezvousOwners(members)
        var counts: [String: Int] = [:]
        for key in Self.keys { counts[owners.owner(of: key)!.address, default: 0] += 1 }
        for member in members {
            let expected = owners.share(of: member.address)
            #expect(abs(expected - member.weight / 6) < 1e-12)
            #expect(abs(Double(counts[member.address] ?? 0) / Double(Self.keys.count) - expected) < 0.03)
        }
        #expect(owners.share(of: "10.9.9.9:1") == 0)
        let even = RendezvousOwners(Self.three)
        counts = [:]
        for key in Self.keys { counts[even.owner(of: key)!.address, default: 0] += 1 }
        #expect(counts.values.allSatisfy { abs(Double($0) / Double(Self.keys.count) - 1.0 / 3.0) < 0.03 })
    }

    @Test func theRankingIsTheFallbackOrder() {
        let owners = RendezvousOwners(Self.three)
        for key in Self.keys.prefix(300) {
            let ranking = owners.ranked(key)
            #expect(Set(ranking) == Set(Self.three) && ranking.count == 3)
            // Without the owner, the next is the one ranked second; without both, the third.
            let rest = RendezvousOwners(Self.three.filter { $0 != ranking[0] })
            #expect(rest.ranked(key) == Array(ranking.dropFirst()))
            #expect(RendezvousOwners([ranking[2]]).owner(of: key) == ranking[2])
        }
        // A duplicated address counts once; a weight of 0 is no member.
        let dup = RendezvousOwners(Self.three + [RendezvousOwners.Member(address: "10.0.0.1:3128", weight: 9)])
        #expect(dup.members.count == 3 && dup.members[0].weight == 1)
        #expect(RendezvousOwners([RendezvousOwners.Member(address: "10.0.0.1:1", weight: 0)]).members.isEmpty)
    }
}
