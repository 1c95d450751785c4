import CLibEvent
import FuzzSupport

@testable import SluiceServer

/// Fuzz target: an upstream's response head as libcurl delivers it, line by line, through
/// `ResponseHeadCollector` (status line, interim heads, obs-fold) and
/// `ResponseEncoder.forwardedHead` (the checks, and the head re-framed for the client).
/// The input's first byte picks the client side (HEAD or not, HTTP/1.0 or 1.1, keep-alive);
/// the rest is cut into lines after each LF.
///
/// Checks, beyond "no crash, no hang": whatever the upstream sent, a head Sluice writes is
/// well-formed HTTP/1.1 — a status line of three digits, then `name: value` lines with token
/// names and no CR, LF or NUL inside a value, ending at the one empty line; it fits the space
/// the encoder reserved for it; no hop-by-hop field gets through; the framing it returns is the
/// framing it wrote (one `Transfer-Encoding: chunked` or `Content-Length`s that all agree or
/// neither, never both); and `Connection: close` is there exactly when the connection ends.
@main
enum ResponseHeadFuzzer {
    static let via = Array("Via: 1.1 sluice\r\n".utf8)

    static func main() {
        FuzzDriver.run { data, count in ResponseHeadFuzzer.testOneInput(FuzzDriver.bytes(data, count)) }
    }

    /// One input: returns 0, or traps on a finding.
    static func testOneInput(_ raw: UnsafeRawBufferPointer) -> Int32 {
        guard let selector = raw.first else { return 0 }
        let isHead = selector & 1 != 0
        let minor = Int(selector >> 1 & 1)
        let keepAlive = selector & 4 != 0
        var collector = ResponseHeadCollector()
        var complete = false
        var start = 1
        while start < raw.count, !complete {
            let end = raw[start...].firstIndex(of: 10).map { $0 + 1 } ?? raw.count
            complete = collector.add(UnsafeRawBufferPointer(rebasing: raw[start..<end]))
            start = end
        }
        _ = collector.value("content-length")
        _ = collector.value("location")
        let output = evbuffer_new()!
        defer { evbuffer_free(output) }
        let framing: ResponseEncoder.Framing
        do {
            framing = try ResponseEncoder.forwardedHead(
                collector, isHeadRequest: isHead, clientMinorVersion: minor,
                keepAlive: keepAlive, viaLine: via, into: output)
        } catch {
            fuzzCheck(evbuffer_get_length(output) == 0, "bytes written for a refused head")
            return 0
        }
        let n = evbuffer_get_length(output)
        var text = [UInt8](repeating: 0, count: n)
        text.withUnsafeMutableBytes { _ = evbuffer_remove(output, $0.baseAddress, n) }
        let bound = 96 + max(collector.reason.count, 40) + collector.lines.count + 4 * collector.lineCount + via.count
        fuzzCheck(n <= bound, "wrote \(n) bytes into \(bound) reserved")
        check(text, framing: framing, status: collector.status, isHead: isHead, minor: minor, keepAlive: keepAlive)
        return 0
    }

    static func check(_ b: [UInt8], framing: ResponseEncoder.Framing, status: Int, isHead: Bool, minor: Int, keepAlive: Bool) {
        var lines: [ArraySlice<UInt8>] = []
        var i = 0
        while i < b.count {
            guard let cr = b[i...].firstIndex(of: 13) else { return fuzzCheck(false, "a line without CRLF") }
            fuzzCheck(cr + 1 < b.count && b[cr + 1] == 10, "bare CR")
            fuzzCheck(!b[i..<cr].contains(10) && !b[i..<cr].contains(0), "LF or NUL inside a line")
            lines.append(b[i..<cr])
            i = cr + 2
        }
        fuzzCheck(lines.last?.isEmpty == true && lines.dropLast().allSatisfy { !$0.isEmpty }, "not one empty line at the end")
        let statusLine = Array(lines[0])
        fuzzCheck(
            statusLine.count >= 13 && statusLine[0..<9] == ArraySlice("HTTP/1.1 ".utf8)
                && statusLine[9..<12].allSatisfy { $0 >= 0x30 && $0 <= 0x39 } && statusLine[12] == 0x20,
            "bad status line")
        fuzzCheck(Int(String(decoding: statusLine[9..<12], as: UTF8.self)) == status, "status changed")
        var names: [String: [String]] = [:]
        for line in lines.dropFirst().dropLast() {
            guard let colon = line.firstIndex(of: 0x3A) else { return fuzzCheck(false, "field line without a colon") }
            fuzzCheck(
                colon > line.startIndex && line[line.startIndex..<colon].allSatisfy(RequestHeadToken.isToken),
                "field name is not a token")
            fuzzCheck(line[(colon + 1)...].first == 0x20, "no space after the colon")
            let name = String(decoding: line[line.startIndex..<colon], as: UTF8.self).lowercased()
            let value = String(decoding: line[(colon + 1)...], as: UTF8.self).trimmingSpaces
            names[name, default: []].append(value)
        }
        for hop in ["te", "trailer", "upgrade", "keep-alive", "proxy-connection"] {
            fuzzCheck(names[hop] == nil, "hop-by-hop field \(hop) forwarded")
        }
        let close = !keepAlive || framing == .close
        fuzzCheck(names["connection"] == (close ? ["close"] : nil), "Connection is \(names["connection"] ?? [])")
        fuzzCheck(
            names["transfer-encoding"] == (framing == .chunked ? ["chunked"] : nil),
            "Transfer-Encoding is \(names["transfer-encoding"] ?? []) for \(framing)")
        let lengths = Set(
            (names["content-length"] ?? []).flatMap { $0.split(separator: ",") }
                .map { UInt64(String($0).trimmingSpaces) })
        switch framing {
        case .chunked, .close: fuzzCheck(lengths.isEmpty, "Content-Length with \(framing) framing")
        case .length: fuzzCheck(lengths.count == 1, "Content-Length values \(lengths) for length framing")
        case .none: fuzzCheck(isHead || status < 200 || status == 204 || status == 304, "no body for \(status)")
        }
        if framing == .chunked { fuzzCheck(minor == 1, "chunked to an HTTP/1.0 client") }
    }
}

enum RequestHeadToken {
    static func isToken(_ c: UInt8) -> Bool {
        switch c {
        case 0x30...0x39, 0x41...0x5A, 0x61...0x7A: return true
        default: return Array("!#$%&'*+-.^_`|~".utf8).contains(c)
        }
    }
}

extension String {
    var trimmingSpaces: String {
        var s = Substring(self)
        while s.first == " " || s.first == "\t" { s = s.dropFirst() }
        while s.last == " " || s.last == "\t" { s = s.dropLast() }
        return String(s)
    }
}
