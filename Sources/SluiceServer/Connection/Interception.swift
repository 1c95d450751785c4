import CLibEvent
import COpenSSL
import CShims
import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// Interception (`intercept: true`) of one CONNECT: Sluice answers it, becomes the TLS server
/// of the connection (a libevent OpenSSL bufferevent that takes the socket over) with a leaf
/// from the local CA, and from then on carries requests for that one `https` authority, which
/// run the full pipeline and go upstream through the session core with the host's trust.
///
/// This handler owns what is particular to interception — the switch from the plain socket to
/// TLS, the handshake's state, the mapping of the requests inside to their upstream target,
/// and an operator's words for a failed handshake. The `ClientConnection` keeps reading and
/// answering HTTP over whichever transport it has.
///
/// Threading: a value owned by its `ClientConnection`, used on the worker's thread only.
/// Lifetime across the C boundary: `handshake` is retained here for as long as OpenSSL's
/// certificate callback may run (the `SSL` object holds it unretained; both end with the
/// connection).
struct Interception {
    /// The CONNECT's authority: the only one the requests inside may name.
    let authority: RequestTarget
    let handshake: InterceptedHandshake
    /// The client finished its TLS handshake with Sluice.
    var established = false

    /// Answers the CONNECT on `fd` (nothing may wait in the plain socket's buffers: the caller
    /// checked) and starts Sluice's TLS server on it. Returns the handler and the TLS
    /// bufferevent that now owns `fd`; nil when the answer could not be written (the caller
    /// closes the connection). Throws when no TLS server can be made (nothing was sent).
    static func start(
        fd: Int32, target: RequestTarget, base: OpaquePointer,
        server: TLSInterception?
    ) throws(ProxyError) -> (Interception, OpaquePointer?)? {
        guard let server else {
            throw .tlsFailure(host: target.authority, reason: "interception is not available (no CA loaded)")
        }
        let handshake = InterceptedHandshake(host: target.host, interception: server)
        guard let ssl = server.makeSSL(for: handshake) else {
            throw .tlsFailure(host: target.authority, reason: "cannot start TLS: \(TLSObjects.lastError())")
        }
        let answer = ResponseEncoder.connectEstablished
        let sent = send(fd, answer.utf8Start, answer.utf8CodeUnitCount, Int32(MSG_NOSIGNAL))
        guard sent == answer.utf8CodeUnitCount else {
            SSL_free(ssl)
            return nil
        }
        // On failure libevent frees `ssl`, and the descriptor's fate is libevent's too.
        let bev = sluice_bufferevent_ssl_accept(base, fd, ssl)
        return (Interception(authority: target, handshake: handshake), bev)
    }

    /// The upstream target of a request inside: origin-form maps onto the CONNECT's authority;
    /// absolute-form must name that same authority.
    func target(for head: HTTPRequestHead) throws(ProxyError) -> RequestTarget {
        let host = authority.host.utf8.contains(0x3A) ? "[\(authority.host)]" : authority.host
        if head.bytes[head.targetRange.lowerBound] == UInt8(ascii: "/") {
            return try RequestTarget.absolute("https://\(host):\(authority.port)" + head.target)
        }
        let target = try RequestTarget.absolute(head.target)
        guard target.scheme == .https, target.host.lowercased() == authority.host.lowercased(),
            target.port == authority.port
        else {
            throw .badURL("this intercepted connection carries requests for \(authority.authority) only")
        }
        return target
    }

    /// Why the client's TLS handshake with Sluice failed, in words an operator can act on
    /// (`bev` is the TLS bufferevent, for OpenSSL's error).
    func handshakeFailure(_ bev: OpaquePointer?) -> String {
        let prefix = "interception of \(authority.authority) failed: "
        if let refusal = handshake.refusal { return prefix + refusal }
        var reason = ""
        if let bev {
            let code = sluice_bufferevent_ssl_error(bev)
            if code != 0 {
                reason = TLSObjects.describe(code)
                if let last = reason.split(separator: ":").last { reason = String(last) }
            }
        }
        if reason.contains("alert") {
            return prefix + "the client rejected Sluice's certificate (\(reason)); "
                + "does it trust the CA that 'sluice ca export' prints?"
        }
        if reason.isEmpty {
            return prefix + "the client closed the connection during the TLS handshake (it may not trust Sluice's CA)"
        }
        return prefix + "TLS handshake with the client: \(reason)"
    }
}
