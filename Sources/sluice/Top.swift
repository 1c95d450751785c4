import ArgumentParser
import SluiceCore

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

#if canImport(Glibc)
    import Glibc
#endif

struct Top: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show a running Sluice's numbers in the terminal, refreshed every second; q quits.",
        discussion: """
            Reads the admin API (GET /dashboard/data) of a running Sluice: requests, errors and \
            retries per second, upstream latency percentiles, requests in flight and client \
            connections, and one row per host, busiest first. The admin token comes from \
            --token-file or the SLUICE_ADMIN_TOKEN environment variable (never from the command \
            line, where other users could read it). The numbers need the metrics monitor.
            """)

    @Option(name: .long, help: "The admin listener, HOST:PORT (admin.listen).")
    var admin = "127.0.0.1:9901"

    @Option(name: .long, help: "A file holding the admin token (else SLUICE_ADMIN_TOKEN).")
    var tokenFile: String?

    @Option(name: .long, help: "Seconds between refreshes.")
    var interval: Double = 1

    @Flag(name: .long, help: "Print one screen (after one interval, so that rates show) and exit.")
    var once = false

    func validate() throws {
        guard interval >= 0.2, interval <= 60 else { throw ValidationError("--interval must be 0.2 to 60 seconds") }
        guard AdminAddress(admin) != nil else { throw ValidationError("--admin must be HOST:PORT, e.g. 127.0.0.1:9901") }
    }

    func run() throws {
        let address = AdminAddress(admin)!
        var token = ProcessInfo.processInfo.environment["SLUICE_ADMIN_TOKEN"]
        if let tokenFile {
            guard let text = try? String(contentsOfFile: tokenFile, encoding: .utf8) else {
                printError("sluice top: cannot read --token-file \(tokenFile)")
                throw ExitCode(1)
            }
            token = text.trimmingWhitespace()
        }
        let client = AdminClient(address: address, token: token)
        if once {
            let first = try client.sampleOrExit()
            usleep(UInt32(interval * 1_000_000))
            let second = try client.sampleOrExit()
            let screen = TopScreen(source: admin, sample: second, previous: first)
            print(screen.render(width: 200, height: 1000, clock: Self.clock()).joined(separator: "\n"))
            return
        }
        let terminal = Terminal()
        defer { terminal.restore() }
        var previous: TopScreen.Sample?
        var message: String?
        repeat {
            switch client.sample() {
            case .success(let sample):
                let screen = TopScreen(source: admin, sample: sample, previous: previous)
                previous = sample
                message = nil
                terminal.draw(screen.render(width: terminal.columns, height: terminal.rows, clock: Self.clock()))
            case .failure(.unauthorized):
                terminal.restore()
                printError("sluice top: the admin API at \(admin) refused the token (set SLUICE_ADMIN_TOKEN or --token-file)")
                throw ExitCode(1)
            case .failure(let error):
                message = "sluice top — cannot read \(admin): \(error) — retrying (q quits)"
                terminal.draw([message!])
            }
        } while !terminal.waitForQuit(seconds: interval)
    }

    static func clock() -> String {
        var now = time(nil)
        var parts = tm()
        localtime_r(&now, &parts)
        func two(_ n: Int32) -> String { n < 10 ? "0\(n)" : "\(n)" }
        return "\(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec))"
    }
}

/// `HOST:PORT` or `[v6]:PORT`.
struct AdminAddress {
    let host: String
    let port: UInt16
    init?(_ text: String) {
        guard let colon = text.lastIndex(of: ":"), let port = UInt16(text[text.index(after: colon)...]), port > 0 else {
            return nil
        }
        var host = String(text[..<colon])
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        guard !host.isEmpty else { return nil }
        self.host = host
        self.port = port
    }
}

/// A blocking HTTP/1.1 GET of the admin API, with a deadline (`sluice top` has nothing else
/// to do meanwhile).
struct AdminClient {
    enum Failure: Error, CustomStringConvertible {
        case unauthorized
        case unreachable(String)
        case badAnswer(String)
        var description: String {
            switch self {
            case .unauthorized: return "401 (the admin token)"
            case .unreachable(let why): return why
            case .badAnswer(let why): return why
            }
        }
    }

    let address: AdminAddress
    let token: String?
    static let timeoutMilliseconds: Int32 = 3000

    func sample() -> Result<TopScreen.Sample, Failure> {
        switch get("/dashboard/data") {
        case .failure(let failure): return .failure(failure)
        case .success((let status, let body)):
            if status == 401 { return .failure(.unauthorized) }
            guard status == 200 else { return .failure(.badAnswer("HTTP \(status)")) }
            do {
                return .success(try JSONDecoder().decode(TopScreen.Sample.self, from: Data(body)))
            } catch {
                return .failure(.badAnswer("not the dashboard's data: \(error)"))
            }
        }
    }

    func sampleOrExit() throws -> TopScreen.Sample {
        switch sample() {
        case .success(let sample): return sample
        case .failure(.unauthorized):
            printError(
                "sluice top: the admin API at \(address.host):\(address.port) refused the token (set SLUICE_ADMIN_TOKEN or --token-file)"
            )
            throw ExitCode(1)
        case .failure(let failure):
            printError("sluice top: cannot read \(address.host):\(address.port): \(failure)")
            throw ExitCode(1)
        }
    }

    private func get(_ path: String) -> Result<(Int, [UInt8]), Failure> {
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var list: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(address.host, String(address.port), &hints, &list) == 0, list != nil else {
            return .failure(.unreachable("cannot resolve \(address.host)"))
        }
        defer { freeaddrinfo(list) }
        // Every address in turn (`localhost` may give ::1 first, the listener 127.0.0.1).
        var fd: Int32 = -1
        var why = "no address"
        var next = list
        while let info = next {
            next = info.pointee.ai_next
            let candidate = socket(info.pointee.ai_family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            guard candidate >= 0 else { continue }
            var timeout = timeval(tv_sec: Int(Self.timeoutMilliseconds / 1000), tv_usec: 0)
            setsockopt(candidate, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
            setsockopt(candidate, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
            if connect(candidate, info.pointee.ai_addr, info.pointee.ai_addrlen) == 0 {
                fd = candidate
                break
            }
            // A connect that timed out (SO_SNDTIMEO) reports EINPROGRESS.
            why = errno == EINPROGRESS ? "no answer within 3 s" : String(cString: strerror(errno))
            close(candidate)
        }
        guard fd >= 0 else { return .failure(.unreachable(why)) }
        defer { close(fd) }
        var request = "GET \(path) HTTP/1.1\r\nHost: \(address.host)\r\nConnection: close\r\nAccept: application/json\r\n"
        if let token, !token.isEmpty { request += "Authorization: Bearer \(token)\r\n" }
        request += "\r\n"
        let sent = request.utf8.withContiguousStorageIfAvailable { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        guard let sent, sent == request.utf8.count else { return .failure(.unreachable("cannot send the request")) }
        var answer: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        while answer.count < 16 << 20 {
            let n = recv(fd, &buffer, buffer.count, 0)
            if n > 0 {
                answer += buffer[..<n]
            } else if n == 0 {
                break
            } else {
                return .failure(.unreachable(errno == EAGAIN ? "no answer within 3 s" : String(cString: strerror(errno))))
            }
        }
        return Self.parse(answer)
    }

    /// Status and body of a `Connection: close` response (Content-Length, chunked or closed).
    static func parse(_ answer: [UInt8]) -> Result<(Int, [UInt8]), Failure> {
        guard let end = answer.firstRange(of: Array("\r\n\r\n".utf8)) else { return .failure(.badAnswer("incomplete response")) }
        let head = String(decoding: answer[..<end.lowerBound], as: UTF8.self)
        let lines = head.split(separator: "\r\n")
        guard let statusLine = lines.first, statusLine.hasPrefix("HTTP/1."),
            let status = Int(statusLine.split(separator: " ").dropFirst().first ?? "")
        else { return .failure(.badAnswer("not an HTTP response")) }
        var body = Array(answer[end.upperBound...])
        let fields = lines.dropFirst().map { $0.lowercased() }
        if fields.contains(where: { $0.hasPrefix("transfer-encoding:") && $0.contains("chunked") }) {
            var decoded: [UInt8] = []
            var rest = body[...]
            while let lineEnd = rest.firstRange(of: Array("\r\n".utf8)),
                let size = Int(
                    String(decoding: rest[..<lineEnd.lowerBound], as: UTF8.self).split(separator: ";").first ?? "", radix: 16),
                size > 0, rest.count >= lineEnd.upperBound - rest.startIndex + size
            {
                let start = lineEnd.upperBound
                decoded += rest[start..<start + size]
                rest = rest[min(rest.endIndex, start + size + 2)...]
            }
            body = decoded
        } else if let field = fields.first(where: { $0.hasPrefix("content-length:") }),
            let length = Int(field.dropFirst("content-length:".count).trimmingWhitespace()), length <= body.count
        {
            body = Array(body[..<length])
        }
        return .success((status, body))
    }
}

/// The terminal while `sluice top` runs: the alternate screen, no cursor, keys read one by
/// one without echo; `restore()` puts it back (also when stdout is not a terminal: then
/// screens are printed one after another).
final class Terminal {
    private var raw = false
    private var alternate = false
    private let isTTY = isatty(1) == 1

    /// The settings to put back, for the signal handler too (it runs on this one thread's
    /// behalf and only restores and exits).
    nonisolated(unsafe) private static var saved = termios()
    nonisolated(unsafe) private static var restoreOnSignal = false

    init() {
        if isatty(0) == 1, tcgetattr(0, &Self.saved) == 0 {
            var t = Self.saved
            t.c_lflag &= ~tcflag_t(ICANON | ECHO | ISIG)
            raw = tcsetattr(0, TCSANOW, &t) == 0
        }
        if isTTY {
            write("\u{1B}[?1049h\u{1B}[?25l")
            alternate = true
        }
        // SIGTERM, SIGHUP, SIGQUIT, or SIGPIPE (`sluice top | head`): the terminal is given
        // back before the process ends (tcsetattr and write are async-signal-safe).
        Self.restoreOnSignal = raw || alternate
        for signalNumber in [SIGTERM, SIGHUP, SIGQUIT, SIGPIPE] {
            signal(signalNumber) { received in
                if Terminal.restoreOnSignal {
                    tcsetattr(0, TCSANOW, &Terminal.saved)
                    let text: StaticString = "\u{1B}[?25h\u{1B}[?1049l"
                    _ = Glibc.write(1, text.utf8Start, text.utf8CodeUnitCount)
                }
                _exit(128 + received)
            }
        }
    }

    /// Gives the terminal back; safe to call more than once.
    func restore() {
        if raw {
            tcsetattr(0, TCSANOW, &Self.saved)
            raw = false
        }
        if alternate {
            write("\u{1B}[?25h\u{1B}[?1049l")
            alternate = false
        }
        Self.restoreOnSignal = false
    }

    var columns: Int { size.columns }
    var rows: Int { size.rows }

    private var size: (columns: Int, rows: Int) {
        var w = winsize()
        guard isTTY, ioctl(1, UInt(TIOCGWINSZ), &w) == 0, w.ws_col > 0, w.ws_row > 0 else { return (120, 40) }
        return (Int(w.ws_col), Int(w.ws_row))
    }

    func draw(_ lines: [String]) {
        if isTTY {
            write("\u{1B}[H\u{1B}[2J" + lines.joined(separator: "\r\n"))
        } else {
            write(lines.joined(separator: "\n") + "\n\n")
        }
    }

    /// Standard input can still send keys (false once it ended: then only the time passes).
    private var keysOpen = true

    /// Waits up to `seconds` for a key: true when it was q, Q or Ctrl-C.
    func waitForQuit(seconds: Double) -> Bool {
        var deadline = timespec()
        clock_gettime(CLOCK_MONOTONIC, &deadline)
        let end = Double(deadline.tv_sec) + Double(deadline.tv_nsec) / 1e9 + seconds
        while true {
            var now = timespec()
            clock_gettime(CLOCK_MONOTONIC, &now)
            let left = end - (Double(now.tv_sec) + Double(now.tv_nsec) / 1e9)
            if left <= 0 { return false }
            var p = pollfd(fd: keysOpen ? 0 : -1, events: Int16(POLLIN), revents: 0)
            let r = poll(&p, 1, Int32(left * 1000) + 1)
            if r < 0 && errno == EINTR { continue }
            guard r > 0 else { return false }
            var byte: UInt8 = 0
            let n = read(0, &byte, 1)
            if n == 0 { keysOpen = false }  // no more keys: wait out the interval
            if n <= 0 { continue }
            if byte == UInt8(ascii: "q") || byte == UInt8(ascii: "Q") || byte == 3 { return true }
        }
    }

    private func write(_ text: String) {
        var text = text
        text.withUTF8 { buffer in
            var offset = 0
            while offset < buffer.count {
                let n = Glibc.write(1, buffer.baseAddress! + offset, buffer.count - offset)
                if n <= 0 { return }
                offset += n
            }
        }
    }
}
