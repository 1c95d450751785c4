import SluiceCore

/// `access.proxy_auth` (docs/configuration.md, "Proxy authentication"): on a forward-proxy
/// listener every absolute-form request and CONNECT must carry `Proxy-Authorization: Basic …`
/// for a user of the users file, or is answered `407` with `Proxy-Authenticate` and goes
/// nowhere. Gateway routes are not proxy requests and are not asked; requests inside an
/// intercepted CONNECT were authorized by the CONNECT. The field itself never travels
/// upstream (`ForwardedHeaders.isDroppedRequestField`). The user names the access-log line.
/// A peer's request (`fleet.cache`, `Exchange.fromPeer`) is not asked: its signature
/// authenticates it (docs/security.md, "Peers").
enum ProxyAuthStage: RequestStage {
    static var name: String { "proxy_auth" }

    static func enter(_ exchange: Exchange, _ services: any StageServices) -> StageVerdict {
        let client = exchange.client
        if client.interception != nil {
            exchange.summary.user = client.acceptedCredential?.user
            return .proceed
        }
        guard case .forward = client.mode, let verifier = exchange.pipeline.proxyAuth else { return .proceed }
        // A peer's request (`fleet.cache`) is authenticated by its signature (`PeerStage`).
        if exchange.fromPeer { return .proceed }
        let head = exchange.head
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
            // A keep-alive connection that repeats its accepted credential byte for byte is not
            // checked again (not even against the verifier's cache).
            if let accepted = client.acceptedCredential, accepted.verifier === verifier,
                ProxyAuthVerifier.sameCredential(accepted.value, value)
            {
                verdict = .user(accepted.user)
                return
            }
            verdict = verifier.verify(value)
            if case .user = verdict { matchedValue = Array(value) }
        }
        switch verdict {
        case .user(let user):
            if let matchedValue {
                client.acceptedCredential = .init(verifier: verifier, value: matchedValue, user: user)
            }
            exchange.summary.user = user
            return .proceed
        case .missing: return .respond(.proxyAuthenticationRequired(reason: .missing))
        case .invalid: return .respond(.proxyAuthenticationRequired(reason: .invalid))
        case .busy: return .respond(.proxyAuthenticationRequired(reason: .busy))
        }
    }
}
