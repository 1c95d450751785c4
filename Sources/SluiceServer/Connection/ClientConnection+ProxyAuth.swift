import COpenSSL
import SluiceCore

/// `access.proxy_auth` on a forward-proxy connection: every absolute-form request and CONNECT
/// must carry `Proxy-Authorization: Basic …` for a user of the users file, or is answered
/// `407` with `Proxy-Authenticate` and goes nowhere. Gateway routes are not proxy requests
/// and are not asked (docs/configuration.md, "Proxy authentication"). The field itself never
/// travels upstream (`ForwardedHeaders.isDroppedRequestField`).
extension ClientConnection {
    /// A credential this connection presented and had accepted: a keep-alive connection that
    /// repeats it byte for byte is not checked again (not even against the worker's cache).
    /// Holds the verifier that accepted it, compared by identity: a reload makes a new one
    /// (a new users file), and an identifier alone could match a new verifier that took the
    /// freed old one's address.
    struct AcceptedCredential {
        let verifier: ProxyAuthVerifier
        let value: [UInt8]
        let user: String
    }

    /// Checks the request's credentials when the exchange's snapshot has `proxy_auth`, and
    /// names the user in its access-log line; throws the `407` otherwise.
    func authenticate(_ head: HTTPRequestHead, _ exchange: Exchange) throws(ProxyError) {
        if interception != nil {
            // Requests inside an intercepted CONNECT: the CONNECT was the proxy request.
            exchange.summary.user = acceptedCredential?.user
            return
        }
        guard case .forward = mode, let verifier = exchange.pipeline.proxyAuth else { return }
        var verdict = ProxyAuthVerifier.Verdict.missing
        var matchedValue: [UInt8]?
        head.bytes.withUnsafeBufferPointer { buf in
            guard
                let field = head.fields.first(where: {
                    $0.name.count == 19
                        && ASCII.equalsIgnoringCase(UnsafeBufferPointer(rebasing: buf[$0.name]), "proxy-authorization")
                })
            else { return }
            let value = UnsafeRawBufferPointer(UnsafeBufferPointer(rebasing: buf[field.value]))
            if let accepted = acceptedCredential, accepted.verifier === verifier, accepted.value.count == value.count,
                accepted.value.withUnsafeBytes({ CRYPTO_memcmp($0.baseAddress, value.baseAddress, value.count) }) == 0
            {
                verdict = .user(accepted.user)
                return
            }
            verdict = verifier.verify(value)
            if case .user = verdict { matchedValue = Array(value) }
        }
        switch verdict {
        case .user(let user):
            if let matchedValue { acceptedCredential = AcceptedCredential(verifier: verifier, value: matchedValue, user: user) }
            exchange.summary.user = user
        case .missing: throw .proxyAuthenticationRequired(reason: .missing)
        case .invalid: throw .proxyAuthenticationRequired(reason: .invalid)
        case .busy: throw .proxyAuthenticationRequired(reason: .busy)
        }
    }
}
