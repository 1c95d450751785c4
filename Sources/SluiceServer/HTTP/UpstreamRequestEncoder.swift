import CLibEvent

#if canImport(Glibc)
    import Glibc
#endif

/// The request head the native transport writes to an origin (RFC 9112 §3): request line in
/// origin form (absolute form to a peer of the fleet, which is a proxy), the forwarded fields,
/// `Host`, and the body's framing. The fields are the request's `RequestHeaderLines`, already
/// in wire form, copied whole; the libcurl transport converts the same lines
/// (`CurlHeaderList`), so both transports forward exactly the same fields.
///
/// `Host` comes from the target (as curl derives it), unless the lines carry one (the
/// `upstream:` override's virtual host). Framing fields never come from the lines
/// (`ForwardedHeaders` drops them): `Content-Length` or `Transfer-Encoding: chunked` is
/// written here from the request's `Body`.
///
/// Threading: a namespace of pure functions; the output buffer belongs to the caller's thread.
enum UpstreamRequestEncoder {
    /// Appends the head to `output`, written into one extent reserved there (an upper bound
    /// of its size, then plain copies): the head is a handful of pieces, and an `evbuffer_add`
    /// for each cost more than the copying.
    ///
    /// `request` is read only; it is `inout` so that a caller's stored property is read where
    /// it lies: passed by value, a class's `UpstreamRequest` was copied for the call and
    /// destroyed after it (a retain and a release per field, ~350 instructions a request).
    static func writeHead(_ request: inout UpstreamRequest, into output: OpaquePointer, absoluteForm: Bool = false) {
        var method = request.method
        var host = request.target.host
        // Everything but the header lines is bounded by the method, the URL, the host and
        // 128 bytes (" HTTP/1.1", "Host: [", "]:65535", the framing field, the CRLFs).
        let bound = method.utf8.count + request.target.url.utf8.count + host.utf8.count + request.headers.byteCount + 128
        var extent = iovec()
        guard evbuffer_reserve_space(output, bound, &extent, 1) >= 1 else { return }
        var w = Writer(base: extent.iov_base.assumingMemoryBound(to: UInt8.self))
        method.withUTF8 { w.put($0) }
        w.put(" ")
        // (The absolute form's branch is taken inside the origin form's walk: one copy of the URL,
        // retained once, as before the fleet's peers needed it.)
        request.target.withOriginForm(orAbsolute: absoluteForm) { w.put($0.assumingMemoryBound(to: UInt8.self)) }
        w.put(" HTTP/1.1\r\n")
        request.headers.withBytes { bytes, _ in w.put(bytes) }
        if !request.headers.carriesHost {
            w.put("Host: ")
            let bracketed = host.withUTF8 { h in h.baseAddress.map { memchr($0, 0x3A, h.count) != nil } ?? false }
            if bracketed { w.put("[") }
            host.withUTF8 { w.put($0) }
            if bracketed { w.put("]") }
            let target = request.target
            if target.port != (target.scheme == .https ? 443 : 80) {
                w.put(":")
                w.putDecimal(target.port)
            }
            w.put("\r\n")
        }
        switch request.body {
        case .none:
            break
        case .length(let n):
            w.put("Content-Length: ")
            w.putDecimal(Int(n))
            w.put("\r\n")
        case .streamed:
            w.put("Transfer-Encoding: chunked\r\n")
        }
        w.put("\r\n")
        extent.iov_len = w.count
        evbuffer_commit_space(output, &extent, 1)
    }

    /// Copies into the reserved extent (its bound is the caller's).
    private struct Writer {
        let base: UnsafeMutablePointer<UInt8>
        var count = 0

        mutating func put(_ bytes: UnsafeBufferPointer<UInt8>) {
            guard let source = bytes.baseAddress else { return }
            (base + count).update(from: source, count: bytes.count)
            count += bytes.count
        }

        mutating func put(_ text: StaticString) {
            (base + count).update(from: text.utf8Start, count: text.utf8CodeUnitCount)
            count += text.utf8CodeUnitCount
        }

        mutating func putDecimal(_ value: Int) {
            var n = UInt64(max(0, value))
            var digits = 1
            var rest = n / 10
            while rest > 0 {
                digits += 1
                rest /= 10
            }
            for i in stride(from: digits - 1, through: 0, by: -1) {
                base[count + i] = UInt8(0x30 + n % 10)
                n /= 10
            }
            count += digits
        }
    }
}
