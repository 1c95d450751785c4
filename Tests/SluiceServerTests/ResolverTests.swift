import CLibEvent
import SluiceCore
import Testing

@testable import SluiceServer

#if canImport(Glibc)
    import Glibc
#endif

/// A tiny UDP DNS responder on 127.0.0.1 (an ephemeral port), run by an event on the test's
/// loop: A and AAAA answers with a chosen TTL for the names in `records` (an empty answer,
/// NODATA, for a type the record lacks), NXDOMAIN for every other name, nothing at all for
/// the names in `silent`. It records every question it gets.
final class TestDNSServer {
    struct Record {
        var ttl: UInt32
        var v4: [String] = []
        var v6: [String] = []
    }

    let fd: Int32
    let port: UInt16
    private var event: OpaquePointer?
    var records: [String: Record] = [:]
    var silent: Set<String> = []
    private(set) var questions: [(name: String, type: UInt16)] = []

    static let typeA: UInt16 = 1
    static let typeAAAA: UInt16 = 28

    /// A socket bound to 127.0.0.1 with an ephemeral port; `answering: false` leaves it unread
    /// (a nameserver that never answers).
    init(base: OpaquePointer, answering: Bool = true) {
        let fd = socket(AF_INET, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        precondition(fd >= 0)
        var sin = sockaddr_in()
        sin.sin_family = sa_family_t(AF_INET)
        sin.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafePointer(to: &sin) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) }
        }
        precondition(bound == 0)
        _ = withUnsafeMutablePointer(to: &sin) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        self.fd = fd
        port = UInt16(bigEndian: sin.sin_port)
        guard answering else { return }
        event = event_new(
            base, fd, Int16(EV_READ | EV_PERSIST),
            { _, _, arg in
                Unmanaged<TestDNSServer>.fromOpaque(arg!).takeUnretainedValue().readable()
            }, Unmanaged.passUnretained(self).toOpaque())
        event_add(event, nil)
    }

    var address: String { "127.0.0.1:\(port)" }

    func count(_ name: String, _ type: UInt16) -> Int {
        questions.filter { $0.name == name && $0.type == type }.count
    }

    func close() {
        if let event { event_free(event) }
        event = nil
        _ = Glibc.close(fd)
    }

    private func readable() {
        var packet = [UInt8](repeating: 0, count: 1500)
        while true {
            var from = sockaddr_storage()
            var fromLength = socklen_t(MemoryLayout<sockaddr_storage>.size)
            let n = packet.withUnsafeMutableBytes { buffer in
                withUnsafeMutablePointer(to: &from) {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                        recvfrom(fd, buffer.baseAddress, buffer.count, 0, $0, &fromLength)
                    }
                }
            }
            guard n > 0 else { return }
            guard let reply = answer(Array(packet[0..<n])) else { continue }
            _ = reply.withUnsafeBytes { bytes in
                withUnsafePointer(to: &from) {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                        sendto(fd, bytes.baseAddress, bytes.count, 0, $0, fromLength)
                    }
                }
            }
        }
    }

    private func answer(_ query: [UInt8]) -> [UInt8]? {
        guard query.count >= 12, query[4] == 0, query[5] == 1 else { return nil }
        var i = 12
        var labels: [String] = []
        while i < query.count {
            let length = Int(query[i])
            i += 1
            if length == 0 { break }
            guard length < 64, i + length <= query.count else { return nil }
            labels.append(String(decoding: query[i..<(i + length)], as: UTF8.self))
            i += length
        }
        guard i + 4 <= query.count else { return nil }
        let type = UInt16(query[i]) << 8 | UInt16(query[i + 1])
        let questionEnd = i + 4
        let name = labels.joined(separator: ".").lowercased()
        questions.append((name, type))
        if silent.contains(name) { return nil }
        let record = records[name]
        var rdatas: [[UInt8]] = []
        if let record, type == Self.typeA {
            for text in record.v4 {
                var a = in_addr()
                inet_pton(AF_INET, text, &a)
                rdatas.append(withUnsafeBytes(of: &a) { Array($0) })
            }
        } else if let record, type == Self.typeAAAA {
            for text in record.v6 {
                var a = in6_addr()
                inet_pton(AF_INET6, text, &a)
                rdatas.append(withUnsafeBytes(of: &a) { Array($0) })
            }
        }
        let rcode: UInt8 = record == nil ? 3 : 0
        var reply: [UInt8] = [query[0], query[1], 0x81, 0x80 | rcode, 0, 1, 0, UInt8(rdatas.count), 0, 0, 0, 0]
        reply += query[12..<questionEnd]
        let ttl = record?.ttl ?? 0
        for rdata in rdatas {
            reply += [0xC0, 0x0C, UInt8(type >> 8), UInt8(type & 0xFF), 0, 1]
            reply += [UInt8(ttl >> 24), UInt8((ttl >> 16) & 0xFF), UInt8((ttl >> 8) & 0xFF), UInt8(ttl & 0xFF)]
            reply += [0, UInt8(rdata.count)] + rdata
        }
        return reply
    }
}

/// `Resolver`: answers known at once, queries to a responder on loopback, the TTL cache with
/// an injected clock, shared queries, cancellation, timeouts. No traffic leaves 127.0.0.1.
@Suite struct ResolverTests {
    final class Clock {
        var now = 1000.0
    }

    /// What the completions received, in order.
    final class Outcomes {
        var results: [Result<Resolver.Addresses, Resolver.Failure>] = []
        var count: Int { results.count }
        var addresses: [String] {
            results.map { if case .success(let a) = $0 { a.description } else { "failure" } }
        }
        var failures: [String] {
            results.map { if case .failure(let f) = $0 { f.reason } else { "success" } }
        }
        func record(_ result: Result<Resolver.Addresses, Resolver.Failure>) { results.append(result) }
    }

    /// An event loop, a responder and a resolver that queries only that responder (and reads
    /// no hosts file), with a clock the test moves.
    final class Fixture {
        let base: OpaquePointer
        let server: TestDNSServer
        let clock = Clock()
        let resolver: Resolver

        init(records: [String: TestDNSServer.Record] = [:], answering: Bool = true, cacheLimit: Int = 4096) {
            base = event_base_new()!
            server = TestDNSServer(base: base, answering: answering)
            server.records = records
            let clock = clock
            resolver = Resolver(
                base: base, nameservers: [server.address], hostsFile: "/nonexistent/hosts",
                cacheLimit: cacheLimit, now: { clock.now })
        }

        /// Resolves and runs the loop until the completion came (at most `seconds`).
        @discardableResult
        func resolve(_ host: String, port: Int = 80, seconds: Double = 5) -> Result<Resolver.Addresses, Resolver.Failure>? {
            let outcomes = Outcomes()
            _ = resolver.resolve(host: host, port: port) { outcomes.record($0) }
            spin(seconds: seconds) { outcomes.count > 0 }
            return outcomes.results.first
        }

        /// Runs the loop until `done` or `seconds` have passed; never longer.
        func spin(seconds: Double = 5, until done: () -> Bool) {
            ResolverTests.spin(base, seconds: seconds, until: done)
        }

        func close() {
            resolver.shutdown()
            server.close()
            event_base_free(base)
        }
    }

    /// Runs `base` until `done` or `seconds` have passed (a 5 ms tick bounds each pass).
    static func spin(_ base: OpaquePointer, seconds: Double, until done: () -> Bool) {
        let tick = event_new(base, -1, Int16(EV_PERSIST), { _, _, _ in }, nil)
        var tv = timeval(tv_sec: 0, tv_usec: 5_000)
        event_add(tick, &tv)
        let deadline = Resolver.monotonic() + seconds
        while !done() && Resolver.monotonic() < deadline { _ = event_base_loop(base, EVLOOP_ONCE) }
        event_free(tick)
    }

    private func text(_ r: Result<Resolver.Addresses, Resolver.Failure>?) -> String {
        switch r {
        case .success(let a)?: a.description
        case .failure(let f)?: "failure: \(f.reason)"
        case nil: "no answer"
        }
    }

    /// Writes `contents` to a new temporary file; returns its path.
    private func temporaryFile(_ contents: String) -> String {
        var template = Array("/tmp/sluice-resolver-XXXXXX".utf8CString)
        let fd = mkstemp(&template)
        precondition(fd >= 0)
        _ = contents.utf8CString.withUnsafeBytes { write(fd, $0.baseAddress, $0.count - 1) }
        _ = Glibc.close(fd)
        return String(decoding: template.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    @Test func literalsAndLocalhostAreAnsweredWithoutAQuery() {
        let f = Fixture()
        defer { f.close() }
        let r = f.resolver
        #expect(r.cached(host: "127.0.0.1", port: 80)?.description == "127.0.0.1:80")
        // Asked again (the remembered answer), then for another port and another host.
        #expect(r.cached(host: "127.0.0.1", port: 80)?.description == "127.0.0.1:80")
        #expect(r.cached(host: "127.0.0.1", port: 81)?.description == "127.0.0.1:81")
        #expect(r.cached(host: "127.0.0.2", port: 81)?.description == "127.0.0.2:81")
        #expect(r.cached(host: "10.0.0.7", port: 8080)?.description == "10.0.0.7:8080")
        #expect(r.cached(host: "127.1", port: 80)?.description == "127.0.0.1:80")
        #expect(r.cached(host: "::1", port: 443)?.description == "[::1]:443")
        #expect(r.cached(host: "[::1]", port: 443)?.description == "[::1]:443")
        #expect(r.cached(host: "[2001:db8::5]", port: 1)?.description == "[2001:db8::5]:1")
        let zoned = r.cached(host: "[fe80::1%1]", port: 80)
        #expect(zoned?.description == "[fe80::1]:80")
        #expect(zoned.map { a in withUnsafeBytes(of: a.list[0]) { $0.load(fromByteOffset: 24, as: UInt32.self) } } == 1)
        let loopback = "127.0.0.1:8080, [::1]:8080"
        #expect(r.cached(host: "localhost", port: 8080)?.description == loopback)
        #expect(r.cached(host: "LocalHost.", port: 8080)?.description == loopback)
        #expect(r.cached(host: "api.localhost", port: 8080)?.description == loopback)
        #expect(r.cached(host: "a.b.LOCALHOST", port: 8080)?.description == loopback)
        for name in ["example.test", "1.2.3.4.5", "[::1", "::g", "localhost.example", "notlocalhost", ""] {
            #expect(r.cached(host: name, port: 80) == nil, "\(name)")
        }
        // resolve answers them too, from the next loop pass (never inside the call).
        let outcomes = Outcomes()
        _ = r.resolve(host: "x.localhost", port: 3128) { outcomes.record($0) }
        _ = r.resolve(host: "[::1]", port: 80) { outcomes.record($0) }
        #expect(outcomes.count == 0)
        f.spin { outcomes.count == 2 }
        #expect(outcomes.addresses == ["127.0.0.1:3128, [::1]:3128", "[::1]:80"])
        #expect(f.server.questions.isEmpty)
        #expect(r.cachedNameCount == 0)
    }

    @Test func hostsFileNamesAreAnsweredWithoutAQuery() {
        let path = temporaryFile(
            """
            # comment
            10.1.2.3\tMyHost.test alias   # trailing comment
            ::2 myhost.test
            not-an-address other.test

            192.0.2.1 localhost
            10.9.9.9 dotted.test.
            """)
        defer { unlink(path) }
        let base = event_base_new()!
        defer { event_base_free(base) }
        let r = Resolver(base: base, nameservers: [], hostsFile: path)
        defer { r.shutdown() }
        #expect(r.cached(host: "myhost.test", port: 80)?.description == "10.1.2.3:80, [::2]:80")
        #expect(r.cached(host: "ALIAS", port: 81)?.description == "10.1.2.3:81")
        #expect(r.cached(host: "dotted.test", port: 80)?.description == "10.9.9.9:80")
        #expect(r.cached(host: "other.test", port: 80) == nil)
        // localhost stays loopback, whatever the file says.
        #expect(r.cached(host: "localhost", port: 80)?.description == "127.0.0.1:80, [::1]:80")
    }

    @Test func defaultConfigurationAnswersLiteralsWithoutTraffic() {
        // /etc/resolv.conf's nameserver gets a socket but no packet: nothing here queries.
        let base = event_base_new()!
        defer { event_base_free(base) }
        let r = Resolver(base: base)
        defer { r.shutdown() }
        #expect(r.cached(host: "127.0.0.1", port: 80)?.description == "127.0.0.1:80")
        #expect(r.cached(host: "localhost", port: 80)?.description == "127.0.0.1:80, [::1]:80")
        #expect(r.cached(host: "nonexistent.invalid", port: 80) == nil)
    }

    @Test func anAnswerResolvesAndIsCachedForItsTTL() {
        let f = Fixture(records: ["www.example.test": .init(ttl: 30, v4: ["192.0.2.10", "192.0.2.11"], v6: ["2001:db8::1"])])
        defer { f.close() }
        #expect(f.resolver.cached(host: "www.example.test", port: 80) == nil)
        let first = f.resolve("www.example.test")
        #expect(text(first) == "192.0.2.10:80, 192.0.2.11:80, [2001:db8::1]:80")
        #expect(f.server.count("www.example.test", TestDNSServer.typeA) == 1)
        #expect(f.server.count("www.example.test", TestDNSServer.typeAAAA) == 1)
        // Cached, per port, any case.
        #expect(
            f.resolver.cached(host: "WWW.Example.TEST", port: 8080)?.description
                == "192.0.2.10:8080, 192.0.2.11:8080, [2001:db8::1]:8080")
        f.clock.now += 29
        #expect(f.resolver.cached(host: "www.example.test", port: 80) != nil)
        #expect(text(f.resolve("www.example.test", port: 81)) == "192.0.2.10:81, 192.0.2.11:81, [2001:db8::1]:81")
        #expect(f.server.questions.count == 2)
        // Expired: asked again.
        f.clock.now += 1.5
        #expect(f.resolver.cached(host: "www.example.test", port: 80) == nil)
        #expect(text(f.resolve("www.example.test")) == "192.0.2.10:80, 192.0.2.11:80, [2001:db8::1]:80")
        #expect(f.server.count("www.example.test", TestDNSServer.typeA) == 2)
    }

    @Test func anIPv4OnlyNameResolvesDespiteNoAAAA() {
        let f = Fixture(records: ["v4only.test": .init(ttl: 60, v4: ["192.0.2.4"])])
        defer { f.close() }
        #expect(text(f.resolve("v4only.test", port: 8000)) == "192.0.2.4:8000")
        #expect(f.resolver.cached(host: "v4only.test", port: 80)?.description == "192.0.2.4:80")
    }

    @Test func ttlsAreClampedToOneSecondAndFiveMinutes() {
        let f = Fixture(records: [
            "zero.test": .init(ttl: 0, v4: ["192.0.2.1"]),
            "day.test": .init(ttl: 86400, v4: ["192.0.2.2"]),
        ])
        defer { f.close() }
        #expect(text(f.resolve("zero.test")) == "192.0.2.1:80")
        #expect(text(f.resolve("day.test")) == "192.0.2.2:80")
        f.clock.now += 0.9
        #expect(f.resolver.cached(host: "zero.test", port: 80) != nil)
        f.clock.now += 0.2
        #expect(f.resolver.cached(host: "zero.test", port: 80) == nil)
        f.clock.now += 298.8
        #expect(f.resolver.cached(host: "day.test", port: 80) != nil)
        f.clock.now += 0.2
        #expect(f.resolver.cached(host: "day.test", port: 80) == nil)
    }

    @Test func nxdomainFailsNamingTheHostAndIsCachedForFiveSeconds() {
        let f = Fixture()
        defer { f.close() }
        #expect(text(f.resolve("nowhere.test")) == "failure: could not resolve host nowhere.test (NXDOMAIN)")
        #expect(f.server.questions.count == 2)
        #expect(f.resolver.cached(host: "nowhere.test", port: 80) == nil)
        // Answered from the cache (from the next loop pass), with the caller's spelling.
        #expect(text(f.resolve("NoWhere.test")) == "failure: could not resolve host NoWhere.test (NXDOMAIN)")
        #expect(f.server.questions.count == 2)
        f.clock.now += 5.1
        #expect(text(f.resolve("nowhere.test")) == "failure: could not resolve host nowhere.test (NXDOMAIN)")
        #expect(f.server.questions.count == 4)
    }

    @Test func aNameWithoutAddressRecordsFails() {
        let f = Fixture(records: ["empty.test": .init(ttl: 60)])
        defer { f.close() }
        #expect(text(f.resolve("empty.test")) == "failure: could not resolve host empty.test (no address records)")
        #expect(text(f.resolve("empty.test")) == "failure: could not resolve host empty.test (no address records)")
        #expect(f.server.questions.count == 2)
    }

    @Test func invalidNamesFailWithoutAQuery() {
        let f = Fixture()
        defer { f.close() }
        #expect(f.resolver.cached(host: "nonexistent.invalid", port: 80) == nil)
        #expect(text(f.resolve("nonexistent.invalid")) == "failure: could not resolve host nonexistent.invalid (NXDOMAIN)")
        #expect(text(f.resolve("Invalid.")) == "failure: could not resolve host Invalid. (NXDOMAIN)")
        #expect(text(f.resolve("bad name.test")) == "failure: could not resolve host bad name.test (not a valid host name)")
        #expect(text(f.resolve("a..test")) == "failure: could not resolve host a..test (not a valid host name)")
        #expect(text(f.resolve(String(repeating: "a", count: 64) + ".test")).hasSuffix("(not a valid host name)"))
        #expect(text(f.resolve("")) == "failure: could not resolve host  (not a valid host name)")
        #expect(f.server.questions.isEmpty)
    }

    @Test func concurrentResolvesOfOneNameShareOneQuery() {
        let f = Fixture(records: ["shared.test": .init(ttl: 60, v4: ["192.0.2.7"])])
        defer { f.close() }
        let outcomes = Outcomes()
        _ = f.resolver.resolve(host: "shared.test", port: 80) { outcomes.record($0) }
        _ = f.resolver.resolve(host: "SHARED.test", port: 81) { outcomes.record($0) }
        _ = f.resolver.resolve(host: "shared.test", port: 82) { outcomes.record($0) }
        f.spin { outcomes.count == 3 }
        #expect(outcomes.addresses == ["192.0.2.7:80", "192.0.2.7:81", "192.0.2.7:82"])
        #expect(f.server.count("shared.test", TestDNSServer.typeA) == 1)
        #expect(f.server.count("shared.test", TestDNSServer.typeAAAA) == 1)
    }

    @Test func cancelSuppressesTheCompletionButNotTheSharedQuery() {
        let f = Fixture(records: ["c.test": .init(ttl: 60, v4: ["192.0.2.8"]), "lone.test": .init(ttl: 60, v4: ["192.0.2.9"])])
        defer { f.close() }
        let cancelled = Outcomes()
        let kept = Outcomes()
        let first = f.resolver.resolve(host: "c.test", port: 80) { cancelled.record($0) }
        _ = f.resolver.resolve(host: "c.test", port: 80) { kept.record($0) }
        first.cancel()
        f.spin { kept.count == 1 }
        #expect(kept.addresses == ["192.0.2.8:80"])
        // Every waiter gone: the query still ends, and fills the cache.
        let lone = f.resolver.resolve(host: "lone.test", port: 80) { cancelled.record($0) }
        lone.cancel()
        f.spin { f.resolver.cached(host: "lone.test", port: 80) != nil }
        #expect(f.resolver.cached(host: "lone.test", port: 80)?.description == "192.0.2.9:80")
        // Answers known at once are delivered later, so they can be cancelled too.
        let literal = f.resolver.resolve(host: "127.0.0.1", port: 80) { cancelled.record($0) }
        literal.cancel()
        literal.cancel()
        f.spin(seconds: 0.05) { false }
        #expect(cancelled.count == 0)
    }

    @Test func aNameserverThatNeverAnswersGivesATimeout() {
        let f = Fixture(answering: false)
        defer { f.close() }
        #expect(f.resolver.setOption("timeout:", "0.3"))
        #expect(f.resolver.setOption("attempts:", "1"))
        let started = Resolver.monotonic()
        let result = f.resolve("slow.test", seconds: 5)
        let elapsed = Resolver.monotonic() - started
        #expect(text(result) == "failure: DNS timeout for slow.test")
        #expect(elapsed >= 0.25 && elapsed < 3, "\(elapsed) s")
        // Not cached: a timeout may be passing.
        #expect(f.resolver.cachedNameCount == 0)
    }

    @Test func withoutAUsableNameserverLookupsFailClearly() {
        let base = event_base_new()!
        defer { event_base_free(base) }
        let conf = temporaryFile("search example.test\noptions timeout:1\n")
        defer { unlink(conf) }
        let noNameserver = Resolver(base: base, resolvConf: conf, hostsFile: "/nonexistent/hosts")
        let missingFile = Resolver(base: base, resolvConf: "/nonexistent/resolv.conf", hostsFile: "/nonexistent/hosts")
        let badList = Resolver(base: base, nameservers: ["not an address"], hostsFile: "/nonexistent/hosts")
        defer {
            noNameserver.shutdown()
            missingFile.shutdown()
            badList.shutdown()
        }
        #expect(noNameserver.nameserverCount == 0 && missingFile.nameserverCount == 0 && badList.nameserverCount == 0)
        let outcomes = Outcomes()
        _ = noNameserver.resolve(host: "a.test", port: 80) { outcomes.record($0) }
        _ = missingFile.resolve(host: "b.test", port: 80) { outcomes.record($0) }
        _ = badList.resolve(host: "c.test", port: 80) { outcomes.record($0) }
        Self.spin(base, seconds: 5) { outcomes.count == 3 }
        #expect(
            outcomes.failures == [
                "could not resolve host a.test: no usable nameserver in \(conf)",
                "could not resolve host b.test: cannot read /nonexistent/resolv.conf",
                "could not resolve host c.test: no usable nameserver among [\"not an address\"]",
            ])
        // Literals and localhost still work.
        #expect(noNameserver.cached(host: "localhost", port: 80) != nil)
    }

    @Test func theCacheIsBoundedAndEvictsTheOldest() {
        let f = Fixture(
            records: [
                "a.test": .init(ttl: 60, v4: ["192.0.2.1"]),
                "b.test": .init(ttl: 60, v4: ["192.0.2.2"]),
                "c.test": .init(ttl: 60, v4: ["192.0.2.3"]),
            ],
            cacheLimit: 2)
        defer { f.close() }
        for name in ["a.test", "b.test", "c.test"] { #expect(text(f.resolve(name)).hasPrefix("192.0.2.")) }
        #expect(f.resolver.cachedNameCount == 2)
        #expect(f.resolver.cached(host: "a.test", port: 80) == nil)
        #expect(f.resolver.cached(host: "b.test", port: 80) != nil)
        #expect(f.resolver.cached(host: "c.test", port: 80) != nil)
        // Refreshing a name many times keeps the bound (and the order list compacts).
        for _ in 0..<20 {
            f.clock.now += 61
            #expect(text(f.resolve("b.test")) == "192.0.2.2:80")
        }
        #expect(f.resolver.cachedNameCount <= 2)
    }

    @Test func shutdownWithAQueryInFlightCallsNothing() {
        let f = Fixture(answering: false)
        let outcomes = Outcomes()
        _ = f.resolver.resolve(host: "pending.test", port: 80) { outcomes.record($0) }
        _ = f.resolver.resolve(host: "127.0.0.1", port: 80) { outcomes.record($0) }
        f.spin(seconds: 0.05) { f.server.questions.count == 2 }
        f.close()
        #expect(outcomes.count <= 1)
    }
}

/// `access.deny` on a name's addresses before a native try connects: the allowed ones, in
/// order; the resolver's own list when none is denied.
@Suite struct AllowedAddressesTests {
    private func list(_ texts: [String]) -> [sockaddr_storage] { texts.map { Resolver.literal($0)! } }

    private func texts(_ list: [sockaddr_storage]) -> [String] {
        list.map { storage in
            var s = storage
            return withUnsafePointer(to: &s) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { SocketAddress.describe($0) }
            }
        }
    }

    @Test func deniedAddressesAreLeftOutInOrder() {
        let addresses = list(["127.0.0.9", "127.0.0.1", "::1", "169.254.169.254"])
        let deny = ["127.0.0.9/32", "169.254.0.0/16"].map { IPNetwork($0)! }
        #expect(texts(NativeUpstreamTransfer.allowed(addresses, deny: deny)) == texts(list(["127.0.0.1", "::1"])))
        let v6Only = NativeUpstreamTransfer.allowed(addresses, deny: ["127.0.0.0/8", "169.254.0.0/16"].map { IPNetwork($0)! })
        #expect(texts(v6Only) == texts(list(["::1"])))
        #expect(NativeUpstreamTransfer.allowed(addresses, deny: ["0.0.0.0/0", "::/0"].map { IPNetwork($0)! }).isEmpty)
    }

    @Test func noneDeniedIsTheListItself() {
        let addresses = list(["127.0.0.1", "::1"])
        let allowed = NativeUpstreamTransfer.allowed(addresses, deny: [IPNetwork("169.254.0.0/16")!])
        #expect(texts(allowed) == texts(addresses))
        // The same storage: no copy was made.
        #expect(allowed.withUnsafeBufferPointer { $0.baseAddress } == addresses.withUnsafeBufferPointer { $0.baseAddress })
    }
}
