import Glibc

/// Which member of the fleet owns a cache key, and which come next (`fleet.cache`;
/// docs/fleet.md, "One cache across the fleet"): weighted rendezvous hashing (highest random
/// weight, as Squid's CARP). Every member scores every key; the highest score owns it.
///
/// Why this rule: there is no ring to tune; every instance that knows the same members and
/// weights computes the same order without talking to the others; a member that leaves moves
/// only the keys it owned (each goes to its own next member), and one that joins takes only
/// the keys it now scores highest on; the order of the scores is the fallback order when the
/// owner does not answer.
///
/// The score of member `m` for key `k` is `-w(m) / ln(u)`, where `u` in (0, 1) is a hash of
/// the key and the member's address: the weighted form, under which a member owns a share of
/// the keys proportional to its weight. The hash is FNV-1a over the bytes, finished with
/// MurmurHash3's 64-bit mixer: fixed, so every process (and every version) computes the same
/// scores; Swift's `Hasher` is seeded per process and could not be used.
///
/// Threading: an immutable value; built when the members change and read by any worker.
public struct RendezvousOwners: Sendable, Equatable {
    /// A member: the address its peers reach it on (its identity) and its weight.
    public struct Member: Sendable, Equatable, Hashable {
        public let address: String
        public let weight: Double

        public init(address: String, weight: Double = 1) {
            self.address = address
            self.weight = weight
        }
    }

    /// The members in address order (one per address; the first given wins), each with the
    /// hash of its address that every key's hash is mixed with.
    public let members: [Member]
    private let seeds: [UInt64]

    public init(_ members: [Member]) {
        var seen = Set<String>()
        let unique = members.filter { $0.weight > 0 && seen.insert($0.address).inserted }
        self.members = unique.sorted { $0.address < $1.address }
        self.seeds = self.members.map { Self.mix(Self.fnv1a($0.address.utf8)) }
    }

    /// The members ranked for `key`, the owner first: the order a miss asks them in.
    public func ranked(_ key: String) -> [Member] {
        let keyHash = Self.fnv1a(key.utf8)
        let scored = members.indices.map { (index: $0, score: score(keyHash, $0)) }
        return scored.sorted { $0.score > $1.score || ($0.score == $1.score && $0.index < $1.index) }
            .map { members[$0.index] }
    }

    /// The member that owns `key`; nil without members.
    public func owner(of key: String) -> Member? {
        let keyHash = Self.fnv1a(key.utf8)
        var best: (index: Int, score: Double)?
        for index in members.indices {
            let s = score(keyHash, index)
            if best == nil || s > best!.score { best = (index, s) }
        }
        return best.map { members[$0.index] }
    }

    /// The share of the keys `address` owns (its weight over the sum of the weights); 0 for
    /// an address that is not a member.
    public func share(of address: String) -> Double {
        let total = members.reduce(0) { $0 + $1.weight }
        guard total > 0, let member = members.first(where: { $0.address == address }) else { return 0 }
        return member.weight / total
    }

    private func score(_ keyHash: UInt64, _ index: Int) -> Double {
        // 53 random bits, shifted off zero: u in (0, 1), so ln(u) < 0 and the score is > 0.
        let bits = Self.mix(keyHash ^ seeds[index]) >> 11
        let u = (Double(bits) + 0.5) / 9_007_199_254_740_992.0
        return -members[index].weight / log(u)
    }

    static func fnv1a<Bytes: Sequence>(_ bytes: Bytes) -> UInt64 where Bytes.Element == UInt8 {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in bytes {
            hash ^= UInt64(byte)
            hash = hash &* 0x0000_0100_0000_01b3
        }
        return hash
    }

    /// MurmurHash3's 64-bit finalizer: every input bit affects every output bit.
    static func mix(_ value: UInt64) -> UInt64 {
        var x = value
        x ^= x >> 33
        x = x &* 0xff51_afd7_ed55_8ccd
        x ^= x >> 33
        x = x &* 0xc4ce_b9fe_1a85_ec53
        x ^= x >> 33
        return x
    }
}
