import Testing

@testable import SluiceCore

/// `FleetMembership` and `FleetCacheReload`: the members from the heartbeat's answer, this
/// instance always among them, three missed heartbeats to be alone, reloads that reweigh.
@Suite struct FleetMembershipTests {
    static let me = "10.0.0.1:3128"

    static func settings(weight: Double = 1, peers: [FleetCacheSettings.Peer] = []) -> FleetCacheSettings {
        var s = FleetCacheSettings(advertise: me, secret: Secret("peer-secret-0123456789"))
        s.weight = weight
        s.peers = peers
        return s
    }

    @Test func theHeartbeatsAnswerParsesAndSkipsWhatDoesNotParse() {
        let flat = [
            "10.0.0.2:3128 2", "1764300000123", "10.0.0.3:3128 0.5", "1764300000200", "garbled", "1",
            "10.0.0.4:3128 0", "5", "10.0.0.5:3128 1", "not a time", "10.0.0.6:3128 1",
        ]
        #expect(
            FleetMembership.beats(flat) == [
                .init(address: "10.0.0.2:3128", weight: 2, at: 1_764_300_000_123),
                .init(address: "10.0.0.3:3128", weight: 0.5, at: 1_764_300_000_200),
            ])
        #expect(FleetMembership.weightText(2) == "2" && FleetMembership.weightText(0.5) == "0.5")
        #expect(FleetMembership(Self.settings(weight: 3), redis: true).heartbeatEntry == "10.0.0.1:3128 3")
    }

    @Test func membersComeFromTheHeartbeatWithThisInstanceAlwaysOne() {
        var m = FleetMembership(Self.settings(), redis: true)
        #expect(m.source == .redis && m.state == .waiting && m.members.map(\.address) == [Self.me])
        // An answer without this instance (it cannot be, but) still has it; duplicates count once.
        let beats: [FleetMembership.Beat] = [
            .init(address: "10.0.0.3:3128", weight: 2, at: 90), .init(address: "10.0.0.2:3128", weight: 1, at: 95),
            .init(address: "10.0.0.2:3128", weight: 5, at: 96),
        ]
        var changed = m.heard(beats, now: 100)
        #expect(changed && m.state == .heartbeat)
        #expect(m.members.map(\.address) == [Self.me, "10.0.0.2:3128", "10.0.0.3:3128"])
        #expect(m.share(of: Self.me) == 0.25 && m.share(of: "10.0.0.3:3128") == 0.5 && m.share(of: "10.9.9.9:1") == 0)
        #expect(m.members.map(\.aliveSince) == [100, 95, 90], "each member's first beat heard")
        // The same members again: no change of owners; alive-since kept, last seen moves.
        changed = m.heard(beats.map { .init(address: $0.address, weight: $0.weight, at: $0.at + 100) }, now: 200)
        #expect(!changed)
        #expect(m.members.first { $0.address == "10.0.0.3:3128" }?.aliveSince == 90)
        #expect(m.members.first { $0.address == "10.0.0.3:3128" }?.lastSeen == 190)
        // One leaves, one joins: the owners change.
        changed = m.heard([.init(address: "10.0.0.4:3128", weight: 1, at: 300)], now: 300)
        #expect(changed && m.members.map(\.address) == [Self.me, "10.0.0.4:3128"])
        #expect(m.members.first { $0.address == "10.0.0.4:3128" }?.aliveSince == 300)
    }

    @Test func threeMissedHeartbeatsLeaveThisInstanceAloneUntilRedisAnswers() {
        var m = FleetMembership(Self.settings(), redis: true)
        let other = [FleetMembership.Beat(address: "10.0.0.2:3128", weight: 1, at: 1)]
        var changes = [m.missed()]
        #expect(changes == [false] && m.state == .waiting, "before any answer it is alone already")
        _ = m.heard(other, now: 1)
        changes = [m.missed(), m.missed()]
        #expect(changes == [false, false] && m.members.count == 2, "the members last heard still count")
        changes = [m.missed()]
        #expect(changes == [true] && m.state == .alone && m.members.map(\.address) == [Self.me])
        changes = [m.missed()]
        #expect(changes == [false] && m.state == .alone)
        changes = [m.heard(other, now: 9)]
        #expect(changes == [true] && m.state == .heartbeat)
        #expect(m.members.map(\.aliveSince) == [9, 1], "a new run of heartbeats")
        // An answer resets the count.
        changes = [m.missed(), m.missed(), m.heard(other, now: 10), m.missed(), m.missed()]
        #expect(changes == [false, false, false, false, false] && m.state == .heartbeat)
    }

    @Test func aStaticListIsFixedAndAReloadReweighs() {
        var m = FleetMembership(
            Self.settings(peers: [.init(address: "10.0.0.2:3128", weight: 3), .init(address: Self.me)]), redis: true)
        #expect(m.source == .static && m.state == .static && m.members.count == 2 && m.share(of: Self.me) == 0.25)
        var changes = [m.heard([], now: 1), m.missed()]
        #expect(changes == [false, false] && m.members.count == 2, "Redis is not asked")
        changes = [m.reload(Self.settings(weight: 1, peers: [.init(address: "10.0.0.2:3128", weight: 1)]))]
        #expect(changes == [true] && m.share(of: Self.me) == 0.5)
        var r = FleetMembership(Self.settings(), redis: true)
        _ = r.heard([.init(address: "10.0.0.2:3128", weight: 1, at: 1)], now: 1)
        changes = [r.reload(Self.settings(weight: 3)), r.reload(Self.settings(weight: 3))]
        #expect(changes == [true, false] && r.share(of: Self.me) == 0.75 && r.heartbeatEntry == "10.0.0.1:3128 3")
        #expect(r.members.first { $0.address == Self.me }?.aliveSince == 1, "a reload is not a new run")
    }

    @Test func aReloadAppliesTheWeightAndListAndSaysWhatWaitsForARestart() {
        let running = Self.settings()
        var new = Self.settings(weight: 2)
        new.listen = "10.0.0.1:3129"
        new.advertise = "10.0.0.9:3128"
        new.secret = Secret("another-secret-0123456789")
        let reload = FleetCacheReload(running: running, new: new)
        #expect(reload.applied?.weight == 2 && reload.applied?.advertise == Self.me && reload.applied?.listen == nil)
        #expect(reload.applied?.secret == running.secret && reload.comparable == running)
        let text = reload.restartNeeded.joined(separator: "\n")
        #expect(reload.restartNeeded.count == 3 && text.contains("fleet.cache.listen") && text.contains("advertise"))
        #expect(!text.contains("another-secret"))
        // From Redis to a static list: the list waits for a restart, the weight does not.
        let toStatic = FleetCacheReload(running: running, new: Self.settings(weight: 2, peers: [.init(address: "10.0.0.2:1")]))
        #expect(toStatic.applied?.peers == [] && toStatic.applied?.weight == 2 && toStatic.restartNeeded.count == 1)
        // Adding or removing fleet.cache: the running state stays, the comparison tells.
        #expect(FleetCacheReload(running: nil, new: new) == FleetCacheReload(running: nil, new: new))
        #expect(
            FleetCacheReload(running: nil, new: new).applied == nil && FleetCacheReload(running: nil, new: new).comparable == new)
        #expect(FleetCacheReload(running: running, new: nil).applied == running)
        #expect(FleetCacheReload(running: running, new: nil).comparable == nil)
    }
}
