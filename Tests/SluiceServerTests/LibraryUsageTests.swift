import HTTPTypes
import SluiceCore
import SluiceServer
import Synchronization
import Testing

#if canImport(Glibc)
    import Glibc
#endif

// The example from docs/library.md, run for real: a custom adapter and a custom monitor,
// the server in-process, a purpose-built upstream and a raw client on loopback.

/// Stamps every request with a header — a custom `RequestAdapter`.
struct StampAdapter: RequestAdapter {
    var name: String { "stamp" }
    func adapt(_ request: ProxyRequest, completion: @escaping (Result<ProxyRequest, AdaptationError>) -> Void) {
        var request = request
        request.headerFields[HTTPField.Name("X-Stamp")!] = "library-\(request.method)"
        completion(.success(request))
    }
}

/// Refuses requests to one path — shows a failing adapter.
struct GuardAdapter: RequestAdapter {
    var name: String { "guard" }
    func adapt(_ request: ProxyRequest, completion: @escaping (Result<ProxyRequest, AdaptationError>) -> Void) {
        if request.url.hasSuffix("/forbidden") {
            return completion(.failure(AdaptationError(adapter: name, reason: "path is not allowed")))
        }
        completion(.success(request))
    }
}

/// Records the pipeline's steps — a custom `EventMonitor`, thread-safe because every worker
/// shares it.
final class InspectorMonitor: EventMonitor, Sendable {
    let steps = Mutex<[String]>([])
    func handle(_ event: ProxyEvent) {
        let step: String
        switch event {
        case .requestReceived(_, _, let method, _, let policy): step = "received \(method) \(policy)"
        case .requestAdapted(_, let adapters): step = "adapted \(adapters.joined(separator: ","))"
        case .adaptationFailed(_, let error): step = "adaptation failed \(error.adapter)"
        case .tryStarted(_, let attempt, let request):
            step = "try \(attempt) \(request.headerFields[HTTPField.Name("X-Stamp")!] ?? "-")"
        case .metricsCollected(_, let attempt, let t): step = "metrics \(attempt) \(t.total > 0)"
        case .responseReceived(_, _, let status): step = "response \(status)"
        case .redirectFollowed: step = "redirect"
        case .finished(let s): step = "finished \(s.status) \(s.outcome.rawValue) out=\(s.bytesOut)"
        case .trustFailed(_, _, let evaluator, _): step = "trust failed \(evaluator)"
        case .tunnelOpened: step = "tunnel opened"
        case .tunnelClosed: step = "tunnel closed"
        case .configReloaded: step = "reloaded"
        case .cache: step = "cache"
        case .retrying, .retryStopped, .credentialRefreshed, .credentialRefreshFailed: step = "resilience"
        }
        steps.withLock { $0.append(step) }
    }
}

/// A one-connection-at-a-time upstream that answers every request with the request head it
/// received as its body.
final class EchoUpstream: @unchecked Sendable {
    // @unchecked: `fd` and `port` are set in init and never change; the thread only reads them.
    let fd: Int32
    let port: UInt16

    init() throws {
        let s = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var one: Int32 = 1
        setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, 4)
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        _ = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(s, $0, 16) } }
        listen(s, 16)
        var len = socklen_t(16)
        _ = withUnsafeMutablePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(s, $0, &len) }
        }
        fd = s
        port = UInt16(bigEndian: addr.sin_port)
        var thread = pthread_t()
        pthread_create(
            &thread, nil,
            { arg in
                let up = Unmanaged<EchoUpstream>.fromOpaque(arg!).takeRetainedValue()
                up.serve()
                return nil
            }, Unmanaged.passRetained(self).toOpaque())
        pthread_detach(thread)
    }

    func serve() {
        while true {
            let c = accept(fd, nil, nil)
            if c < 0 { return }
            var tv = timeval(tv_sec: 5, tv_usec: 0)
            setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
            let head = readHead(c)
            let response =
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: \(head.utf8.count)\r\nConnection: close\r\n\r\n"
                + head
            _ = response.withCString { send(c, $0, strlen($0), Int32(MSG_NOSIGNAL)) }
            close(c)
        }
    }
}

func readHead(_ fd: Int32) -> String {
    var data: [UInt8] = []
    var buf = [UInt8](repeating: 0, count: 4096)
    while !String(decoding: data, as: UTF8.self).contains("\r\n\r\n") {
        let n = recv(fd, &buf, buf.count, 0)
        if n <= 0 { break }
        data += buf[0..<n]
    }
    return String(decoding: data, as: UTF8.self)
}

/// Sends `request` to 127.0.0.1:`port` and reads until the server closes.
func exchange(port: UInt16, _ request: String) -> String {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var tv = timeval(tv_sec: 10, tv_usec: 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
    var addr = sockaddr_in()
    addr.sin_family = sa_family_t(AF_INET)
    addr.sin_port = port.bigEndian
    addr.sin_addr.s_addr = inet_addr("127.0.0.1")
    let rc = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, 16) } }
    guard rc == 0 else { return "" }
    _ = request.withCString { send(fd, $0, strlen($0), Int32(MSG_NOSIGNAL)) }
    var out: [UInt8] = []
    var buf = [UInt8](repeating: 0, count: 4096)
    while true {
        let n = recv(fd, &buf, buf.count, 0)
        if n <= 0 { break }
        out += buf[0..<n]
    }
    return String(decoding: out, as: UTF8.self)
}

/// A free loopback port (bound once to port 0, then released).
func freePort() -> UInt16 {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var addr = sockaddr_in()
    addr.sin_family = sa_family_t(AF_INET)
    addr.sin_addr.s_addr = inet_addr("127.0.0.1")
    _ = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, 16) } }
    var len = socklen_t(16)
    _ = withUnsafeMutablePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) } }
    return UInt16(bigEndian: addr.sin_port)
}

@Suite(.serialized) struct LibraryUsageTests {
    @Test func customAdapterAndMonitorInProcess() throws {
        let upstream = try EchoUpstream()
        let inspector = InspectorMonitor()
        let proxyPort = freePort()

        let policies = PolicyTable(entries: [
            PolicyEntry(name: "default", adapters: [StampAdapter(), GuardAdapter()])
        ])
        let configuration = SluiceConfiguration(
            server: ServerConfiguration(listen: ["127.0.0.1:\(proxyPort)"], workers: 1),
            pipeline: Pipeline(policies: policies, monitors: [SharedMonitorFactory(inspector, summary: "inspector")]))
        let server = ProxyServer(configuration: configuration)
        try server.start()
        defer {
            server.stop()
            server.wait()
        }

        let response = exchange(
            port: proxyPort,
            "GET http://127.0.0.1:\(upstream.port)/hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        #expect(response.hasPrefix("HTTP/1.1 200 OK\r\n"))
        #expect(response.contains("X-Stamp: library-GET\r\n"), "the upstream saw the adapter's header")
        #expect(response.contains("Via: 1.1 sluice-"))

        let refused = exchange(
            port: proxyPort,
            "GET http://127.0.0.1:\(upstream.port)/forbidden HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        #expect(refused.hasPrefix("HTTP/1.1 502 "))
        #expect(refused.contains("sluice: adapter guard failed: path is not allowed"))

        let steps = inspector.steps.withLock { $0 }
        let bodyLength = response.split(separator: "\r\n\r\n", maxSplits: 1).last.map { $0.utf8.count } ?? -1
        #expect(
            steps == [
                "received GET default",
                "adapted stamp,guard",
                "try 1 library-GET",
                "response 200",
                "metrics 1 true",
                "finished 200 ok out=\(bodyLength)",
                "received GET default",
                "adaptation failed guard",
                "finished 502 error out=0",
            ])
    }
}
