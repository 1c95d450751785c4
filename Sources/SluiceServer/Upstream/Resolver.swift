import CLibEvent

#if canImport(Glibc)
    import Glibc
#endif

/// One worker's DNS: host names to socket addresses on the worker's own event loop, through
/// libevent's evdns, with a per-worker cache that honours the answers' TTLs.
///
/// - **Answered at once** (`cached`, no query, no callback): IP literals (IPv4 in every form
///   `inet_aton` takes, as libcurl's URL parser normalizes them; IPv6 with or without
///   brackets, with a `%zone`), `localhost` and `*.localhost` (RFC 6761: 127.0.0.1 and ::1,
///   whatever the hosts file says, as libcurl does), the names in the hosts file (read once,
///   at init), and cached answers whose TTL has not run out.
/// - **Queried** (`resolve`): A and AAAA in parallel (`evdns_base_resolve_ipv4`/`ipv6`, so the
///   answer's TTL is known), to the nameservers of `/etc/resolv.conf` (with its `search`,
///   `domain` and `options`) or to the ones given at init. The result lists the IPv4
///   addresses first, then the IPv6 ones, and comes once both queries have ended (as
///   glibc's `getaddrinfo` waits for both). An answer is cached for its TTL, clamped to
///   1…300 s; a name that does not exist (NXDOMAIN) or has no address record, for 5 s.
///   Timeouts and other failures are not cached. Concurrent lookups of one name share one
///   pair of queries. Names under `.invalid` fail at once without a query (RFC 6761).
/// - The cache holds at most `cacheLimit` names; beyond that the oldest entry goes.
///
/// Threading: created before its worker starts or on the worker's thread, then owned by the
/// worker's event-loop thread; every method and callback runs there.
///
/// Lifetimes across the C boundary: evdns gets each in-flight `Query` unretained; `inflight`
/// owns it until both of its callbacks have run (evdns calls each request's callback exactly
/// once, from a deferred callback of the loop). The resolver outlives its evdns base and its
/// delivery event, both freed in `shutdown()`, which runs once the loop has ended for good:
/// it drops the pending requests without their callbacks (`evdns_base_free(_, 0)`), and a
/// callback evdns had already scheduled can only run if the loop runs again, which it must not.
final class Resolver {
    /// A resolved address list (IPv4 and IPv6 `sockaddr_storage` values with the port set),
    /// in the order to try.
    struct Addresses: CustomStringConvertible {
        let list: [sockaddr_storage]
        /// `127.0.0.1:80, [::1]:80`.
        var description: String {
            list.map { ss in
                var ss = ss
                return withUnsafePointer(to: &ss) {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { SocketAddress.describe($0) }
                }
            }.joined(separator: ", ")
        }
    }

    /// Why a name could not be resolved, in words for a log line or a 502's body.
    struct Failure: Error, CustomStringConvertible {
        let reason: String
        var description: String { reason }
    }

    /// One caller's wait for `resolve`: `cancel()` guarantees its completion is never called.
    final class Lookup {
        fileprivate let host: String
        fileprivate let port: UInt16
        fileprivate var completion: ((Result<Addresses, Failure>) -> Void)?

        fileprivate init(host: String, port: UInt16, completion: @escaping (Result<Addresses, Failure>) -> Void) {
            self.host = host
            self.port = port
            self.completion = completion
        }

        /// The caller went away: its completion will not be called. A query other lookups
        /// share goes on for them (and fills the cache).
        func cancel() { completion = nil }

        /// Calls the completion unless cancelled; at most once.
        fileprivate func complete(_ result: Result<Addresses, Failure>) {
            guard let completion else { return }
            self.completion = nil
            completion(result)
        }
    }

    /// What went wrong, kept in the cache and worded per caller (with the caller's host).
    private enum FailureKind {
        case noSuchName
        case noAddressRecords
        case timeout
        case invalidName
        case unusable(String)
        case other(String)

        func failure(host: String) -> Failure {
            switch self {
            case .noSuchName: Failure(reason: "could not resolve host \(host) (NXDOMAIN)")
            case .noAddressRecords: Failure(reason: "could not resolve host \(host) (no address records)")
            case .timeout: Failure(reason: "DNS timeout for \(host)")
            case .invalidName: Failure(reason: "could not resolve host \(host) (not a valid host name)")
            case .unusable(let why): Failure(reason: "could not resolve host \(host): \(why)")
            case .other(let why): Failure(reason: "could not resolve host \(host) (\(why))")
            }
        }
    }

    private enum Answer {
        case addresses([sockaddr_storage])
        case failure(FailureKind)
    }

    private struct Entry {
        var answer: Answer
        var expires: Double
        var stamp: UInt64
    }

    /// The A and AAAA queries for one name, and the lookups waiting for them.
    private final class Query {
        unowned(unsafe) let resolver: Resolver
        let key: String
        var waiters: [Lookup] = []
        var pending = 0
        var v4: [sockaddr_storage] = []
        var v6: [sockaddr_storage] = []
        /// The smallest TTL of the answers that carried addresses.
        var ttl: Int32 = .max
        /// The evdns error of each query that failed (`DNS_ERR_*`).
        var errors: [Int32] = []

        init(resolver: Resolver, key: String) {
            self.resolver = resolver
            self.key = key
        }
    }

    /// How long an answer stays cached: its TTL within these bounds; a failure that the DNS
    /// answered (no such name, no address record) `negativeTTL`.
    static let minimumTTL = 1.0
    static let maximumTTL = 300.0
    static let negativeTTL = 5.0

    private let base: OpaquePointer
    private var dns: OpaquePointer?
    /// Why no query can be sent (no usable nameserver), or nil.
    private let unusable: String?
    private let now: () -> Double
    private let cacheLimit: Int
    private let hosts: [String: [sockaddr_storage]]
    private var cache: [String: Entry] = [:]
    /// Cache keys in insertion order, with the stamp of that insertion: a key whose entry
    /// has since been replaced or removed is skipped (and dropped when the list is compacted).
    private var order: [(key: String, stamp: UInt64)] = []
    private var orderHead = 0
    private var stamp: UInt64 = 0
    private var inflight: [String: Query] = [:]
    /// Results for lookups answered without a query, delivered on the next loop pass.
    private var deliveries: [(Lookup, Result<Addresses, Failure>)] = []
    private var deliveryEvent: LoopWake<Resolver>!
    private var isShutDown = false
    /// The last answer `cached` gave without DNS, for its host and port: a literal or a
    /// hosts-file name never changes its answer (the hosts file is read once), and most
    /// requests ask for the host the one before asked for (parsing a literal and making the
    /// list cost ~900 instructions a request).
    private var lastFixed: (host: String, port: UInt16, addresses: Addresses)?

    /// - `nameservers`: nil for those of `resolvConf` (with its search list and options);
    ///   otherwise exactly these (`"127.0.0.1"`, `"127.0.0.1:5353"`, `"[::1]:53"`), nothing
    ///   read from `resolvConf`.
    /// - `hostsFile`: read once, here.
    /// - `now`: monotonic seconds, for the cache's expiry.
    /// With no usable nameserver, every query fails at once (`Failure` saying so).
    init(
        base: OpaquePointer, nameservers: [String]? = nil, resolvConf: String = "/etc/resolv.conf",
        hostsFile: String = "/etc/hosts", cacheLimit: Int = 4096,
        now: @escaping () -> Double = Resolver.monotonic
    ) {
        self.base = base
        self.now = now
        self.cacheLimit = max(1, cacheLimit)
        hosts = Self.readHosts(hostsFile)
        // evdns's own messages ("Nameserver … has failed") go to Sluice's log, not to
        // standard error. Process-wide; set by each worker's resolver as it is built (on the
        // main thread), always to the same function.
        evdns_set_log_fn { isWarning, message in
            guard let message else { return }
            let text = "dns: " + String(cString: message)
            if isWarning != 0 { Log.warning(text) } else { Log.debug(text) }
        }
        // Not keeping the loop alive while no query is in flight (the nameservers' read
        // events are armed only then).
        let dns = evdns_base_new(base, EVDNS_BASE_DISABLE_WHEN_INACTIVE)
        self.dns = dns
        if let dns {
            var problem: String?
            if let nameservers {
                for server in nameservers { _ = evdns_base_nameserver_ip_add(dns, server) }
                problem = "no usable nameserver among \(nameservers)"
            } else {
                // DNS_OPTIONS_ALL without the hosts file (read here, for `cached`), and no
                // 127.0.0.1 fallback when the file names no nameserver.
                let flags = DNS_OPTION_NAMESERVERS | DNS_OPTION_SEARCH | DNS_OPTION_MISC | DNS_OPTION_NAMESERVERS_NO_DEFAULT
                let status = evdns_base_resolv_conf_parse(dns, flags, resolvConf)
                problem = status == 0 || status == 6 ? "no usable nameserver in \(resolvConf)" : "cannot read \(resolvConf)"
            }
            unusable = evdns_base_count_nameservers(dns) > 0 ? nil : problem
        } else {
            unusable = "the DNS resolver could not be created"
        }
        deliveryEvent = LoopWake(on: base, owner: self) { $0.deliver() }
    }

    /// Monotonic seconds (`CLOCK_MONOTONIC`).
    static func monotonic() -> Double {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }

    /// The nameservers queries go to (0: every query fails at once).
    var nameserverCount: Int {
        guard let dns else { return 0 }
        return Int(evdns_base_count_nameservers(dns))
    }

    /// Sets an evdns option (`"timeout:"` seconds, `"attempts:"`, `"ndots:"`, `"max-timeouts:"`,
    /// `"randomize-case:"`…, as in resolv.conf's `options`). False if evdns refused it.
    @discardableResult
    func setOption(_ name: String, _ value: String) -> Bool {
        guard let dns else { return false }
        return evdns_base_set_option(dns, name, value) == 0
    }

    /// Answers at once, without a callback, when it can: `host` is an IP literal (v4, or v6
    /// with or without brackets), `localhost` or a `*.localhost` name, a name of the hosts
    /// file, or a name whose cached answer has not expired. Otherwise nil (also for a cached
    /// failure: `resolve` reports it).
    func cached(host: String, port: Int) -> Addresses? {
        let port = UInt16(clamping: port)
        if let last = lastFixed, last.port == port, last.host == host { return last.addresses }
        if let fixed = fixedAnswer(host) {
            let addresses = Addresses(list: Self.withPort(fixed, port))
            lastFixed = (host, port, addresses)
            return addresses
        }
        guard case .addresses(let list)? = cachedAnswer(Self.key(host)) else { return nil }
        return Addresses(list: Self.withPort(list, port))
    }

    /// Resolves `host` asynchronously, calling `completion` once on the loop thread (never
    /// from inside this call, even when the answer is known at once), unless the returned
    /// lookup is cancelled first. After `shutdown()` the completion is never called.
    func resolve(host: String, port: Int, _ completion: @escaping (Result<Addresses, Failure>) -> Void) -> Lookup {
        let lookup = Lookup(host: host, port: UInt16(clamping: port), completion: completion)
        guard !isShutDown else { return lookup }
        if let fixed = fixedAnswer(host) {
            deliverSoon(lookup, .success(Addresses(list: Self.withPort(fixed, lookup.port))))
            return lookup
        }
        let key = Self.key(host)
        switch cachedAnswer(key) {
        case .addresses(let list)?:
            deliverSoon(lookup, .success(Addresses(list: Self.withPort(list, lookup.port))))
            return lookup
        case .failure(let kind)?:
            deliverSoon(lookup, .failure(kind.failure(host: host)))
            return lookup
        case nil:
            break
        }
        if let query = inflight[key] {
            query.waiters.append(lookup)
            return lookup
        }
        let name = key.hasSuffix(".") ? String(key.dropLast()) : key
        if name == "invalid" || name.hasSuffix(".invalid") {
            deliverSoon(lookup, .failure(FailureKind.noSuchName.failure(host: host)))
            return lookup
        }
        guard Self.isValidName(name) else {
            deliverSoon(lookup, .failure(FailureKind.invalidName.failure(host: host)))
            return lookup
        }
        guard let dns, unusable == nil else {
            deliverSoon(lookup, .failure(FailureKind.unusable(unusable ?? "no resolver").failure(host: host)))
            return lookup
        }
        let query = Query(resolver: self, key: key)
        query.waiters.append(lookup)
        let arg = Unmanaged.passUnretained(query).toOpaque()
        // Each callback runs from a deferred callback of the loop, never inside these calls.
        if evdns_base_resolve_ipv4(
            dns, key, 0,
            { result, _, count, ttl, addresses, arg in
                let query = Unmanaged<Query>.fromOpaque(arg!).takeUnretainedValue()
                query.resolver.answered(query, family: AF_INET, result: result, count: count, ttl: ttl, addresses: addresses)
            }, arg) != nil
        {
            query.pending += 1
        }
        if evdns_base_resolve_ipv6(
            dns, key, 0,
            { result, _, count, ttl, addresses, arg in
                let query = Unmanaged<Query>.fromOpaque(arg!).takeUnretainedValue()
                query.resolver.answered(query, family: AF_INET6, result: result, count: count, ttl: ttl, addresses: addresses)
            }, arg) != nil
        {
            query.pending += 1
        }
        if query.pending == 0 {
            deliverSoon(lookup, .failure(FailureKind.other("evdns refused the query").failure(host: host)))
        } else {
            inflight[key] = query
        }
        return lookup
    }

    /// Frees the evdns base and the delivery event; called once, when the worker's loop has
    /// ended for good (it must not run again). Pending completions are not called.
    func shutdown() {
        guard !isShutDown else { return }
        isShutDown = true
        if let dns { evdns_base_free(dns, 0) }
        dns = nil
        deliveryEvent = nil
        inflight.removeAll()
        deliveries.removeAll()
    }

    // MARK: answers

    private func answered(
        _ query: Query, family: Int32, result: Int32, count: Int32, ttl: Int32,
        addresses: UnsafeMutableRawPointer?
    ) {
        query.pending -= 1
        if result == DNS_ERR_NONE, let addresses, count > 0 {
            for i in 0..<Int(count) {
                if family == AF_INET {
                    let addr = in_addr(s_addr: addresses.loadUnaligned(fromByteOffset: i * 4, as: UInt32.self))
                    query.v4.append(Self.storage(v4: addr))
                } else {
                    let addr = addresses.loadUnaligned(fromByteOffset: i * 16, as: in6_addr.self)
                    query.v6.append(Self.storage(v6: addr))
                }
            }
            query.ttl = min(query.ttl, ttl)
        } else {
            query.errors.append(result == DNS_ERR_NONE ? DNS_ERR_NODATA : result)
        }
        guard query.pending == 0, !isShutDown else { return }
        // Both ended: the cache and `inflight` are up to date before any completion runs (a
        // completion may resolve again, or cancel other lookups).
        if inflight[query.key] === query { inflight[query.key] = nil }
        let list = query.v4 + query.v6
        if !list.isEmpty {
            let seconds = min(max(Double(max(query.ttl, 0)), Self.minimumTTL), Self.maximumTTL)
            store(query.key, .addresses(list), for: seconds)
            for lookup in query.waiters {
                lookup.complete(.success(Addresses(list: Self.withPort(list, lookup.port))))
            }
            return
        }
        let kind = Self.failureKind(query.errors)
        switch kind {
        case .noSuchName, .noAddressRecords: store(query.key, .failure(kind), for: Self.negativeTTL)
        default: break
        }
        for lookup in query.waiters { lookup.complete(.failure(kind.failure(host: lookup.host))) }
    }

    /// The failure of a name neither of whose queries found an address.
    private static func failureKind(_ errors: [Int32]) -> FailureKind {
        if errors.contains(DNS_ERR_NOTEXIST) { return .noSuchName }
        if errors.contains(DNS_ERR_TIMEOUT) || errors.contains(DNS_ERR_SERVERFAILED) { return .timeout }
        if let other = errors.first(where: { $0 != DNS_ERR_NODATA }) {
            return .other(String(cString: evdns_err_to_string(other)))
        }
        return .noAddressRecords
    }

    private func deliverSoon(_ lookup: Lookup, _ result: Result<Addresses, Failure>) {
        deliveries.append((lookup, result))
        if deliveries.count == 1 { deliveryEvent.activate() }
    }

    private func deliver() {
        let batch = deliveries
        deliveries.removeAll()
        for (lookup, result) in batch {
            guard !isShutDown else { return }
            lookup.complete(result)
        }
    }

    // MARK: cache

    private func cachedAnswer(_ key: String) -> Answer? {
        guard let entry = cache[key] else { return nil }
        if entry.expires <= now() {
            cache[key] = nil
            return nil
        }
        return entry.answer
    }

    private func store(_ key: String, _ answer: Answer, for seconds: Double) {
        stamp &+= 1
        cache[key] = Entry(answer: answer, expires: now() + seconds, stamp: stamp)
        order.append((key, stamp))
        while cache.count > cacheLimit && orderHead < order.count {
            let oldest = order[orderHead]
            orderHead += 1
            if cache[oldest.key]?.stamp == oldest.stamp { cache[oldest.key] = nil }
        }
        // Keys replaced or expired since leave stale places behind: compact now and then.
        if order.count - orderHead > 2 * cacheLimit || (orderHead > 1024 && orderHead * 2 > order.count) {
            order = order[orderHead...].filter { cache[$0.key]?.stamp == $0.stamp }
            orderHead = 0
        }
    }

    /// The names in the cache (for tests).
    var cachedNameCount: Int { cache.count }

    // MARK: names and addresses

    /// The cache key of a host name: lower case (DNS names are case-insensitive).
    private static func key(_ host: String) -> String {
        String(decoding: host.utf8.map { $0 >= 0x41 && $0 <= 0x5A ? $0 | 0x20 : $0 }, as: UTF8.self)
    }

    /// Port-less addresses known without DNS: an IP literal, localhost, a hosts-file name.
    private func fixedAnswer(_ host: String) -> [sockaddr_storage]? {
        if let literal = Self.literal(host) { return [literal] }
        var name = Self.key(host)
        if name.hasSuffix(".") { name.removeLast() }
        if name == "localhost" || name.hasSuffix(".localhost") { return Self.loopback }
        return hosts[name]
    }

    private static let loopback: [sockaddr_storage] = {
        var v4 = in_addr()
        var v6 = in6_addr()
        inet_pton(AF_INET, "127.0.0.1", &v4)
        inet_pton(AF_INET6, "::1", &v6)
        return [storage(v4: v4), storage(v6: v6)]
    }()

    /// `host` as an IP address: IPv4 (dotted quad, or any form `inet_aton` takes: `127.1`,
    /// `0x7f.0.0.1`, `2130706433`), or IPv6, with or without brackets, with an optional
    /// `%zone` (an interface name or index; `%25zone` as written in URLs).
    static func literal(_ host: String) -> sockaddr_storage? {
        var text = Substring(host)
        // The first byte read directly, and the host handed to `inet_pton` as it is: every
        // forwarded request asks (a `hasPrefix` and a C string made from a `Substring` cost
        // 1.2k instructions a request).
        if host.utf8.first == 0x5B {  // "["
            guard text.hasSuffix("]"), text.count > 2 else { return nil }
            text = text.dropFirst().dropLast()
        } else {
            var v4 = in_addr()
            if host.withCString({ inet_pton(AF_INET, $0, &v4) }) == 1 { return storage(v4: v4) }
            let numeric =
                !text.isEmpty
                && text.utf8.allSatisfy {
                    ($0 >= 0x30 && $0 <= 0x39) || $0 == 0x2E || $0 == 0x78 || $0 == 0x58
                        || ($0 >= 0x61 && $0 <= 0x66) || ($0 >= 0x41 && $0 <= 0x46)
                }
            if numeric, inet_aton(String(text), &v4) != 0 { return storage(v4: v4) }
        }
        guard text.utf8.contains(0x3A) else { return nil }
        var zone: UInt32 = 0
        if let percent = text.firstIndex(of: "%") {
            let name = String(text[text.index(after: percent)...])
            text = text[..<percent]
            guard let index = zoneIndex(name) else { return nil }
            zone = index
        }
        var v6 = in6_addr()
        guard inet_pton(AF_INET6, String(text), &v6) == 1 else { return nil }
        var ss = storage(v6: v6)
        withUnsafeMutableBytes(of: &ss) {
            $0.storeBytes(of: zone, toByteOffset: MemoryLayout<sockaddr_in6>.offset(of: \.sin6_scope_id)!, as: UInt32.self)
        }
        return ss
    }

    private static func zoneIndex(_ zone: String) -> UInt32? {
        guard !zone.isEmpty else { return nil }
        if let number = UInt32(zone) { return number }
        let index = if_nametoindex(zone)
        if index != 0 { return index }
        if zone.hasPrefix("25"), zone.count > 2 { return zoneIndex(String(zone.dropFirst(2))) }
        return nil
    }

    /// A DNS host name: labels of letters, digits, `-` and `_`, 1…63 bytes each, 253 in all.
    private static func isValidName(_ name: String) -> Bool {
        let bytes = Array(name.utf8)
        guard !bytes.isEmpty, bytes.count <= 253 else { return false }
        var label = 0
        for b in bytes {
            if b == 0x2E {
                if label == 0 { return false }
                label = 0
                continue
            }
            let ok = (b >= 0x61 && b <= 0x7A) || (b >= 0x30 && b <= 0x39) || b == 0x2D || b == 0x5F
            guard ok else { return false }
            label += 1
            if label > 63 { return false }
        }
        return label > 0
    }

    static func storage(v4: in_addr) -> sockaddr_storage {
        var sin = sockaddr_in()
        sin.sin_family = sa_family_t(AF_INET)
        sin.sin_addr = v4
        var ss = sockaddr_storage()
        withUnsafeMutableBytes(of: &ss) { $0.storeBytes(of: sin, as: sockaddr_in.self) }
        return ss
    }

    static func storage(v6: in6_addr) -> sockaddr_storage {
        var sin6 = sockaddr_in6()
        sin6.sin6_family = sa_family_t(AF_INET6)
        sin6.sin6_addr = v6
        var ss = sockaddr_storage()
        withUnsafeMutableBytes(of: &ss) { $0.storeBytes(of: sin6, as: sockaddr_in6.self) }
        return ss
    }

    /// The addresses with `port` set (network order).
    private static func withPort(_ list: [sockaddr_storage], _ port: UInt16) -> [sockaddr_storage] {
        let v4Offset = MemoryLayout<sockaddr_in>.offset(of: \.sin_port)!
        let v6Offset = MemoryLayout<sockaddr_in6>.offset(of: \.sin6_port)!
        return list.map { ss in
            var ss = ss
            let offset = Int32(ss.ss_family) == AF_INET ? v4Offset : v6Offset
            withUnsafeMutableBytes(of: &ss) { $0.storeBytes(of: port.bigEndian, toByteOffset: offset, as: UInt16.self) }
            return ss
        }
    }

    // MARK: hosts file

    /// Name → addresses (IPv4 first, then IPv6, each in file order) of a hosts file; empty if
    /// it cannot be read.
    private static func readHosts(_ path: String) -> [String: [sockaddr_storage]] {
        guard let text = readFile(path) else { return [:] }
        return parseHosts(text)
    }

    static func parseHosts(_ text: String) -> [String: [sockaddr_storage]] {
        var v4: [String: [sockaddr_storage]] = [:]
        var v6: [String: [sockaddr_storage]] = [:]
        var seen: Set<String> = []
        for rawLine in text.split(separator: "\n", omittingEmptySubsequences: true) {
            let line = rawLine.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
            let fields = line.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\r" })
            guard fields.count >= 2, !fields[0].hasPrefix("["), let address = literal(String(fields[0])) else { continue }
            let text = String(fields[0])
            for field in fields.dropFirst() {
                var name = key(String(field))
                if name.hasSuffix(".") { name.removeLast() }
                guard !name.isEmpty, seen.insert(name + " " + text).inserted else { continue }
                if Int32(address.ss_family) == AF_INET {
                    v4[name, default: []].append(address)
                } else {
                    v6[name, default: []].append(address)
                }
            }
        }
        var table = v4
        for (name, list) in v6 { table[name, default: []].append(contentsOf: list) }
        return table
    }

    private static func readFile(_ path: String) -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var out: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16384)
        while true {
            let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n < 0 { return nil }
            if n == 0 { break }
            out += chunk[0..<n]
            if out.count > 4 << 20 { return nil }
        }
        return String(decoding: out, as: UTF8.self)
    }
}
