#if canImport(Glibc)
import Glibc
#endif
import CLibEvent
import COpenSSL
import CShims
import SluiceCore

/// Interception (`intercept: true`): the CONNECT is answered, then Sluice becomes the TLS
/// server of the connection (libevent's OpenSSL filter over the client's bufferevent) with a
/// leaf from the local CA, and reads the decrypted requests like any others: full pipeline,
/// session core, the host's trust evaluator upstream.
extension ClientConnection {
    func intercept(_ target: RequestTarget, _ exchange: Exchange) throws(ProxyError) {
        guard let interception = worker.interception.current else {
            throw .tlsFailure(host: target.authority, reason: "interception is not available (no CA loaded)")
        }
        let handshake = InterceptedHandshake(host: target.host, interception: interception)
        guard let ssl = interception.makeSSL(for: handshake) else {
            throw .tlsFailure(host: target.authority, reason: "cannot start TLS: \(TLSObjects.lastError())")
        }
        // The answer goes out in the clear, ahead of everything the TLS filter will write.
        evbuffer_add(clientOutput, "HTTP/1.1 200 Connection established\r\n\r\n", 39)
        exchange.summary.status = 200
        exchange.end(.intercepted)
        self.exchange = nil
        currentHead = nil
        guard let filter = sluice_bufferevent_ssl_accept(worker.base, bev, ssl) else {
            SSL_free(ssl)
            closeAfterFlush()
            return
        }
        bev = filter
        interceptedHandshake = handshake
        mode = .intercepted(target)
        parser = HTTPRequestParser(limits: .init(worker.config.limits))
        attachCallbacks()
        state = .awaitingHead
        armTimer(.header)  // the handshake and the first request head, within the header timeout
    }

    /// The upstream target of a request inside an intercepted connection: origin-form maps
    /// onto the CONNECT's authority; absolute-form must name that same authority.
    func interceptedTarget(_ head: HTTPRequestHead, _ tunnel: RequestTarget) throws(ProxyError) -> RequestTarget {
        let host = tunnel.host.contains(":") ? "[\(tunnel.host)]" : tunnel.host
        if head.bytes[head.targetRange.lowerBound] == UInt8(ascii: "/") {
            return try RequestTarget.absolute("https://\(host):\(tunnel.port)" + head.target)
        }
        let target = try RequestTarget.absolute(head.target)
        guard target.scheme == .https, target.host.lowercased() == tunnel.host.lowercased(), target.port == tunnel.port else {
            throw .badURL("this intercepted connection carries requests for \(tunnel.authority) only")
        }
        return target
    }

    /// The client's TLS handshake with Sluice failed: say why, in words an operator can act on.
    func logInterceptionFailure() {
        guard let handshake = interceptedHandshake else { return }
        let authority: String
        if case .intercepted(let t) = mode { authority = t.authority } else { authority = handshake.host }
        if let refusal = handshake.refusal {
            Log.warning("interception of \(authority) failed: \(refusal)")
            return
        }
        let code = sluice_bufferevent_ssl_error(bev)
        var reason = ""
        if code != 0 {
            var buf = [CChar](repeating: 0, count: 256)
            ERR_error_string_n(code, &buf, buf.count)
            reason = String(decoding: buf.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            if let last = reason.split(separator: ":").last { reason = String(last) }
        }
        if reason.contains("alert") {
            Log.warning("interception of \(authority) failed: the client rejected Sluice's certificate (\(reason)); "
                + "does it trust the CA that 'sluice ca export' prints?")
        } else if reason.isEmpty {
            Log.warning("interception of \(authority) failed: the client closed the connection during the TLS handshake "
                + "(it may not trust Sluice's CA)")
        } else {
            Log.warning("interception of \(authority) failed: TLS handshake with the client: \(reason)")
        }
    }
}
