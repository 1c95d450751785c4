import SluiceCore
import Testing

@testable import SluiceServer

#if canImport(Glibc)
    import Glibc
#endif

/// `ConnectionLimits` (`limits.max_connections`, `limits.max_connections_per_client`) without
/// sockets: counted in at accept, out at close, refused beyond either limit, updated on reload.
@Suite struct ConnectionLimitsTests {
    private func key(_ a: UInt8, _ b: UInt8, _ c: UInt8, _ d: UInt8) -> ConnectionLimits.ClientKey {
        var sin = sockaddr_in()
        sin.sin_family = sa_family_t(AF_INET)
        sin.sin_addr.s_addr = UInt32(a) | UInt32(b) << 8 | UInt32(c) << 16 | UInt32(d) << 24
        return withUnsafePointer(to: &sin) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { ConnectionLimits.ClientKey($0)! }
        }
    }

    private func limits(max: Int?, perClient: Int?) -> ServerConfiguration.Limits {
        var l = ServerConfiguration.Limits()
        l.maxConnections = max
        l.maxConnectionsPerClient = perClient
        return l
    }

    @Test func totalLimitRefusesBeyondAndAdmitsAfterAClose() {
        let c = ConnectionLimits(limits(max: 2, perClient: nil))
        let a = key(127, 0, 0, 1)
        #expect(c.admit(a, describe: { "a" }) == nil)
        #expect(c.admit(a, describe: { "a" }) == nil)
        #expect(c.admit(a, describe: { "a" }) == .tooManyConnections(limit: 2))
        #expect(c.open.load(ordering: .relaxed) == 2)
        c.release(a)
        #expect(c.admit(a, describe: { "a" }) == nil)
        c.release(a)
        c.release(a)
        #expect(c.open.load(ordering: .relaxed) == 0 && c.trackedClients == 0)
    }

    @Test func perClientLimitCountsEachAddress() {
        let c = ConnectionLimits(limits(max: 100, perClient: 1))
        let one = key(127, 0, 0, 1)
        let two = key(127, 0, 0, 2)
        #expect(one != two)
        #expect(c.admit(one, describe: { "one" }) == nil)
        #expect(c.admit(one, describe: { "one" }) == .tooManyConnectionsFromClient(limit: 1))
        #expect(c.admit(two, describe: { "two" }) == nil)
        #expect(c.open.load(ordering: .relaxed) == 2 && c.trackedClients == 2)
        c.release(one)
        #expect(c.admit(one, describe: { "one" }) == nil)
        c.release(one)
        c.release(two)
        #expect(c.trackedClients == 0 && c.open.load(ordering: .relaxed) == 0)
    }

    @Test func reloadChangesBothLimits() {
        let c = ConnectionLimits(limits(max: 1, perClient: nil))
        let a = key(10, 0, 0, 1)
        #expect(c.admit(a, describe: { "a" }) == nil)
        #expect(c.admit(a, describe: { "a" }) != nil)
        c.update(limits(max: 3, perClient: 2))
        #expect(c.admit(a, describe: { "a" }) == nil)
        #expect(c.admit(a, describe: { "a" }) == .tooManyConnectionsFromClient(limit: 2))
        #expect(c.admitsUnknownAddress)
    }

    @Test func autoIsHalfTheOpenFileLimitAfterTheReserve() {
        var r = rlimit()
        getrlimit(Int32(RLIMIT_NOFILE.rawValue), &r)
        let soft = Int(min(UInt64(r.rlim_cur), 1 << 24))
        #expect(ConnectionLimits.automaticMaximum() == max(1, (soft - 64) / 2))
        #expect(ConnectionLimits.effectiveMaximum(limits(max: nil, perClient: nil)) == ConnectionLimits.automaticMaximum())
        #expect(ConnectionLimits.effectiveMaximum(limits(max: 7, perClient: nil)) == 7)
    }
}

extension ConnectionLimits {
    /// A connection whose address family has no key (neither IPv4 nor IPv6) is counted in the
    /// total only.
    fileprivate var admitsUnknownAddress: Bool {
        guard admit(nil, describe: { "?" }) == nil else { return false }
        release(nil)
        return true
    }
}
