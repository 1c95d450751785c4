#if canImport(Glibc)
import Glibc
#endif
import CCurl
import CLibEvent
import SluiceCore

/// The request head the native transport writes to an origin (RFC 9112 §3): request line in
/// origin form, `Host`, the forwarded fields, and the body's framing. Its input is the same
/// `HeaderList` the libcurl transport hands to curl, so both transports forward exactly the
/// same fields; the two conventions of curl's list are read the way curl reads them:
/// - `Name:` with nothing after the colon removes a field curl would add itself (`Accept:`,
///   `Expect:`): the native transport adds neither, so the line is skipped;
/// - `Name;` sends the field with an empty value.
///
/// `Host` comes from the target (as curl derives it), unless the list carries one (the
/// `upstream:` override's virtual host). Framing fields never come from the list
/// (`ForwardedHeaders` drops them): `Content-Length` or `Transfer-Encoding: chunked` is
/// written here from the request's `Body`.
///
/// Threading: a namespace of pure functions; the output buffer belongs to the caller's thread.
enum UpstreamRequestEncoder {
    /// Appends the head to `output`.
    static func writeHead(_ request: UpstreamRequest, into output: OpaquePointer) {
        var method = request.method
        method.withUTF8 { _ = evbuffer_add(output, $0.baseAddress, $0.count) }
        evbuffer_add(output, " ", 1)
        request.target.withOriginForm { _ = evbuffer_add(output, $0.baseAddress, $0.count) }
        evbuffer_add(output, " HTTP/1.1\r\n", 11)
        var sawHost = false
        var node = request.headers.pointer
        while let n = node {
            node = n.pointee.next
            let text = UnsafeRawPointer(n.pointee.data).assumingMemoryBound(to: UInt8.self)
            let count = strlen(n.pointee.data)
            guard count > 0 else { continue }
            let bytes = UnsafeBufferPointer(start: text, count: count)
            if bytes[count - 1] == 0x3A {
                continue  // `Name:` — curl's "do not add this field"
            }
            if bytes[count - 1] == 0x3B, !bytes.contains(0x3A) {
                evbuffer_add(output, text, count - 1)  // `Name;` — an empty value
                evbuffer_add(output, ":\r\n", 3)
                continue
            }
            if count > 5, bytes[4] == 0x3A, ASCII.equalsIgnoringCase(UnsafeBufferPointer(rebasing: bytes[0..<4]), "host") {
                sawHost = true
            }
            evbuffer_add(output, text, count)
            evbuffer_add(output, "\r\n", 2)
        }
        if !sawHost {
            evbuffer_add(output, "Host: ", 6)
            writeHostField(request.target, into: output)
            evbuffer_add(output, "\r\n", 2)
        }
        switch request.body {
        case .none:
            break
        case .length(let n):
            evbuffer_add(output, "Content-Length: ", 16)
            writeDecimal(Int(n), into: output)
            evbuffer_add(output, "\r\n", 2)
        case .streamed:
            evbuffer_add(output, "Transfer-Encoding: chunked\r\n", 28)
        }
        evbuffer_add(output, "\r\n", 2)
    }

    /// `Host` as libcurl derives it from the URL — the host (an IPv6 literal in brackets), with
    /// the port unless it is the scheme's default — written straight into `output`.
    private static func writeHostField(_ target: RequestTarget, into output: OpaquePointer) {
        var host = target.host
        let bracketed = host.utf8.contains(0x3A)
        if bracketed { evbuffer_add(output, "[", 1) }
        host.withUTF8 { _ = evbuffer_add(output, $0.baseAddress, $0.count) }
        if bracketed { evbuffer_add(output, "]", 1) }
        if target.port != (target.scheme == .https ? 443 : 80) {
            evbuffer_add(output, ":", 1)
            writeDecimal(target.port, into: output)
        }
    }

    private static func writeDecimal(_ value: Int, into output: OpaquePointer) {
        var digits: (UInt64, UInt64, UInt64) = (0, 0, 0)  // 24 bytes: any Int64
        withUnsafeMutableBytes(of: &digits) { raw in
            var n = UInt64(max(0, value))
            var i = raw.count
            repeat {
                i -= 1
                raw[i] = UInt8(0x30 + n % 10)
                n /= 10
            } while n > 0
            _ = evbuffer_add(output, raw.baseAddress! + i, raw.count - i)
        }
    }
}
