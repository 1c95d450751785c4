#if canImport(Glibc)
import Glibc
#endif
import CLibEvent
import COpenSSL
import CShims
import SluiceCore

/// Interception (`intercept: true`): the CONNECT is answered, then Sluice becomes the TLS
/// server of the connection (a libevent OpenSSL bufferevent that takes the socket over) with a
/// leaf from the local CA, and reads the decrypted requests like any others: full pipeline,
/// session core, the host's trust evaluator upstream.
extension ClientConnection {
    func intercept(_ target: RequestTarget, _ exchange: Exchange) throws(ProxyError) {
        guard let interception = worker.interception.current else {
            throw .tlsFailure(host: target.authority, reason: "interception is not available (no CA loaded)")
        }
        // CONNECT is refused inside an intercepted connection, so this is the plain socket.
        guard case .socket(let socket) = transport else { throw .badURL("CONNECT inside an intercepted connection") }
        // The TLS bufferevent takes the socket over, so nothing may wait in the plain one: a
        // client that sent bytes before the CONNECT's answer is not speaking TLS to us (earlier
        // answers, still queued for the flush pass, are written now).
        socket.flush()
        guard evbuffer_get_length(clientInput) == 0, evbuffer_get_length(clientOutput) == 0 else {
            throw .malformedRequest("data after CONNECT before its answer")
        }
        let handshake = InterceptedHandshake(host: target.host, interception: interception)
        guard let ssl = interception.makeSSL(for: handshake) else {
            throw .tlsFailure(host: target.authority, reason: "cannot start TLS: \(TLSObjects.lastError())")
        }
        let fd = socket.fd
        let answer = ResponseEncoder.connectEstablished
        let sent = send(fd, answer.utf8Start, answer.utf8CodeUnitCount, Int32(MSG_NOSIGNAL))
        guard sent == answer.utf8CodeUnitCount else {
            SSL_free(ssl)
            Log.debug("\(peer): cannot answer the CONNECT to \(target.authority)")
            close()
            return
        }
        exchange.summary.status = 200
        exchange.end(.intercepted)
        self.exchange = nil
        currentHead = nil
        // Take the descriptor from the plain socket (without closing it), then give it to a TLS
        // bufferevent.
        _ = socket.detach()
        guard let tls = sluice_bufferevent_ssl_accept(worker.base, fd, ssl) else {
            // libevent freed `ssl`; the socket's fate is libevent's too. Forget the connection.
            Log.error("interception of \(target.authority): cannot create the TLS bufferevent")
            abandon()
            return
        }
        interceptedHandshake = handshake
        mode = .intercepted(target)
        parser = HTTPRequestParser(limits: .init(worker.config.limits))
        adoptTLS(tls)
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
        guard case .tls(let bev) = transport else { return }
        let code = sluice_bufferevent_ssl_error(bev)
        var reason = ""
        if code != 0 {
            reason = TLSObjects.describe(code)
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
