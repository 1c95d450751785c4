import SluiceCore

/// What kind of listener accepted a connection.
enum ListenerMode {
    /// A forward proxy: absolute-form requests and CONNECT.
    case forward
    /// A gateway route: origin-form requests appended to its upstream base URL.
    case route(ServerConfiguration.Route)
    /// The peer listener (`fleet.cache.listen`): absolute-form requests signed by another
    /// instance of the fleet only (`PeerStage`); no CONNECT, no proxy authentication.
    case peer
}

/// The client connection a request came on, as the stages see it: who it is, what kind of
/// listener took it, and what it established for the requests that follow on it (an accepted
/// proxy credential, an interception).
///
/// Threading: owned by its `ClientConnection`; read and changed on the worker's thread only.
final class RequestClient {
    /// The client's address and port, `ip:port` or `[ip]:port` (logs, the access log).
    let peer: String
    /// The client's address alone, `1.2.3.4` or `::1` (`rate_limit` with `key: client`).
    let address: String
    let mode: ListenerMode
    /// On a route listener: what the upstream is told about this client (`Forwarded.swift`).
    let forwarding: ForwardingFields?
    /// Set once the connection is an intercepted CONNECT (Sluice is its TLS server): its
    /// requests go to the CONNECT's authority only.
    var interception: Interception?
    /// The `Proxy-Authorization` this connection last had accepted (`ProxyAuthStage`).
    var acceptedCredential: AcceptedCredential?

    init(peer: String, address: String, mode: ListenerMode, forwarding: ForwardingFields?) {
        self.peer = peer
        self.address = address
        self.mode = mode
        self.forwarding = forwarding
    }

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
}
