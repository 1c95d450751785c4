import Synchronization

/// The members a cache miss on this instance asks before it goes to the origin itself
/// (`fleet.cache`; docs/fleet.md, "One cache across the fleet"): those ranked above this
/// instance for the key (`RendezvousOwners.ranked`), the owner first. The owner answers when it
/// is up; when it does not, the next by score; when the walk reaches this instance, this
/// instance fetches and stores as it would without a fleet. An instance that owns the key (it
/// is first) asks nobody.
///
/// Threading: a value, kept by one exchange on its worker's thread.
public struct PeerWalk: Sendable, Equatable {
    /// The addresses to ask, in order: every member ranked before `this`.
    public let peers: [String]
    /// How many of them were handed out (`next`).
    public private(set) var position = 0

    /// The walk for a key ranked `ranking`, asked by the member at `this` (its `advertise`
    /// address). A ranking without `this` (a member list that lacks it) walks every member.
    public init(ranking: [RendezvousOwners.Member], this: String) {
        peers = ranking.prefix { $0.address != this }.map(\.address)
    }

    /// This instance owns the key (or nobody ranks before it): nobody is asked.
    public var isEmpty: Bool { peers.isEmpty }

    /// The next member to ask, skipping those `isDown` says are marked down (each handed to
    /// `skipped`); nil when the walk reached this instance.
    public mutating func next(isDown: (String) -> Bool, skipped: (String) -> Void = { _ in }) -> String? {
        while position < peers.count {
            let peer = peers[position]
            position += 1
            if isDown(peer) {
                skipped(peer)
                continue
            }
            return peer
        }
        return nil
    }
}

/// The peers that did not answer lately (`fleet.cache`): a peer whose connection was refused,
/// failed or timed out is marked down for `downMilliseconds`, so the requests that follow skip
/// it without waiting for its connect timeout again; the first request after the mark ends
/// asks it again, and an answer clears the mark.
///
/// Threading: shared by every worker of the process, behind a `Mutex` (taken once per peer
/// asked, never on a path without `fleet.cache`). The clock is the caller's (monotonic ms).
public final class PeerDownMarks: Sendable {
    /// How long a peer that did not answer is skipped: `5,000` ms.
    public static let defaultDownMilliseconds = 5_000

    private let marks = Mutex<[String: Int]>([:])
    public let downMilliseconds: Int

    public init(downMilliseconds: Int = PeerDownMarks.defaultDownMilliseconds) {
        self.downMilliseconds = downMilliseconds
    }

    /// `peer` did not answer at `now`.
    public func markDown(_ peer: String, now: Int) {
        marks.withLock { $0[peer] = now + downMilliseconds }
    }

    /// `peer` answered: it is asked again at once.
    public func markUp(_ peer: String) {
        marks.withLock { m in
            if m[peer] != nil { m[peer] = nil }
        }
    }

    /// Whether `peer` is marked down at `now` (an ended mark is forgotten).
    public func isDown(_ peer: String, now: Int) -> Bool {
        marks.withLock { m in
            guard let until = m[peer] else { return false }
            if until > now { return true }
            m[peer] = nil
            return false
        }
    }

    /// The peers marked down at `now`, for `GET /fleet`.
    public func down(now: Int) -> [String] {
        marks.withLock { m in m.filter { $0.value > now }.map(\.key).sorted() }
    }
}
