import Synchronization

/// The signature on a request one instance of the fleet sends another (`fleet.cache`;
/// docs/fleet.md, "One cache across the fleet"; docs/security.md, "Peers"): the field
/// `Sluice-Peer: id=ADDRESS, t=SECONDS, n=NONCE, sig=HEX`, where `sig` is the HMAC-SHA256,
/// under the fleet's secret, of the request line as the owner receives it (`GET
/// http://origin/path HTTP/1.1`), the sender's Unix time, a random nonce and the sender's
/// `advertise` address, each on a line of its own.
///
/// What the owner checks: the field parses, the MAC matches (the secret, the request line,
/// the time and the sender), the time lies within `maximumSkew` of its own clock, and the
/// nonce was not seen within that window (`PeerReplayGuard`). A request that fails any of
/// these is refused, never forwarded.
///
/// Threading: immutable; any worker signs and verifies with one value (the key copies its
/// precomputed states per MAC).
public struct PeerSignature: Sendable {
    /// The field's name: `Sluice-Peer`.
    public static let fieldName = "Sluice-Peer"
    /// How far a peer's clock and the way over may put its time from ours: `30` seconds.
    public static let maximumSkew: Int64 = 30

    /// What a verification found.
    public enum Verdict: Sendable, Equatable {
        /// Signed by a member that knows the secret, within the window, not seen before.
        case valid(sender: String)
        /// No field.
        case unsigned
        /// A field that does not parse, or whose MAC does not match.
        case forged
        /// A time further than `maximumSkew` from ours.
        case stale
        /// A nonce seen already within the window.
        case replayed
    }

    private let key: Crypto.HMACKey

    public init(secret: Secret) {
        key = Crypto.HMACKey(Array(secret.value.utf8))
    }

    /// The field's value for a request `method url HTTP/1.1` sent by `sender` at `now` (Unix
    /// seconds) with `nonce` (random per request: `Crypto.randomBytes`).
    public func fieldValue(method: String, url: String, sender: String, now: Int64, nonce: UInt64) -> String {
        let n = Hex.lowercase(Self.bytes(nonce))
        let sig = Hex.lowercase(mac(method: method, url: url, sender: sender, time: now, nonce: n))
        return "id=\(sender), t=\(now), n=\(n), sig=\(sig)"
    }

    /// Checks `value` (nil: the request had no field) for the request `method url` at `now`;
    /// a valid nonce is recorded in `replays`.
    public func verify(
        _ value: String?, method: String, url: String, now: Int64, replays: PeerReplayGuard
    ) -> Verdict {
        guard let value else { return .unsigned }
        var fields: [Substring: Substring] = [:]
        for part in value.split(separator: ",") {
            let item = part.drop { $0 == " " }
            guard let eq = item.firstIndex(of: "=") else { return .forged }
            fields[item[..<eq]] = item[item.index(after: eq)...].prefix { $0 != " " }
        }
        guard let sender = fields["id"], let timeText = fields["t"], let time = Int64(timeText),
            let nonce = fields["n"], nonce.utf8.count == 16, let sig = fields["sig"], sig.utf8.count == 64
        else { return .forged }
        let expected = Hex.lowercase(mac(method: method, url: url, sender: String(sender), time: time, nonce: String(nonce)))
        guard Self.constantTimeEqual(Array(expected.utf8), Array(sig.utf8)) else { return .forged }
        guard abs(now - time) <= Self.maximumSkew else { return .stale }
        guard replays.admit(String(nonce), until: time + Self.maximumSkew, now: now) else { return .replayed }
        return .valid(sender: String(sender))
    }

    private func mac(method: String, url: String, sender: String, time: Int64, nonce: String) -> [UInt8] {
        key.mac(Array("\(method) \(url) HTTP/1.1\n\(time)\n\(nonce)\n\(sender)".utf8))
    }

    private static func bytes(_ value: UInt64) -> [UInt8] {
        (0..<8).map { UInt8(truncatingIfNeeded: value >> (56 - 8 * $0)) }
    }

    private static func constantTimeEqual(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        guard a.count == b.count else { return false }
        var difference: UInt8 = 0
        for i in a.indices { difference |= a[i] ^ b[i] }
        return difference == 0
    }
}

/// The nonces of the peer requests accepted within the last `PeerSignature.maximumSkew`
/// (twice over: a nonce is kept until its request's time plus the skew), so that a request
/// recorded on the way and sent again is refused. Bounded: at most `capacity` nonces; when it
/// is full, the oldest go first (a replay of one of them would still be refused by its age
/// within seconds).
///
/// Threading: shared by every worker of the process, behind a `Mutex` (taken once per peer
/// request, never on another path).
public final class PeerReplayGuard: Sendable {
    /// The most nonces kept: `65,536` (at 2,000 peer requests a second, 30 s of them).
    public static let defaultCapacity = 65_536

    private struct State {
        var expiries: [String: Int64] = [:]
        var order: [(nonce: String, until: Int64)] = []
        var head = 0
    }
    private let state = Mutex(State())
    private let capacity: Int

    public init(capacity: Int = PeerReplayGuard.defaultCapacity) {
        self.capacity = capacity
    }

    /// Records `nonce` (kept until `until`, Unix seconds); false when it is kept already.
    public func admit(_ nonce: String, until: Int64, now: Int64) -> Bool {
        state.withLock { s in
            while s.head < s.order.count, s.order[s.head].until < now || s.order.count - s.head >= capacity {
                let old = s.order[s.head]
                if s.expiries[old.nonce] == old.until { s.expiries[old.nonce] = nil }
                s.head += 1
            }
            if s.head > 1024 && s.head * 2 > s.order.count {
                s.order.removeFirst(s.head)
                s.head = 0
            }
            if let kept = s.expiries[nonce], kept >= now { return false }
            s.expiries[nonce] = until
            s.order.append((nonce, until))
            return true
        }
    }
}
