import COpenSSL
import CShims
import SluiceCore
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// Sluice's TLS server for intercepted CONNECTs: one `SSL_CTX` for the process whose
/// certificate callback picks, per handshake, a leaf for the client's SNI name, signed by
/// the local CA and cached (all leaves share one key, made at start).
///
/// Threading: shared by every worker. `SSL_new` on a configured `SSL_CTX` is thread-safe;
/// the leaf cache is behind a mutex; the callback runs on the worker driving the handshake.
final class TLSInterception: @unchecked Sendable {
    /// Leaves are valid this long, and re-issued when less than a day is left.
    static let leafValidDays = 30
    /// At most this many leaves are kept (oldest dropped first).
    static let maxCachedLeaves = 1000

    private final class Leaf: @unchecked Sendable {  // immutable; X509 is only read once issued
        let certificate: OpaquePointer
        let expires: Int
        init(certificate: OpaquePointer, expires: Int) {
            self.certificate = certificate
            self.expires = expires
        }
        deinit { X509_free(certificate) }
    }

    let ca: LocalCA
    /// `ca`'s certificate as PEM, encoded once: what a `sluice.http` through an interception
    /// trusts (`WorkerLuaHost`).
    let caPEM: String
    private let context: OpaquePointer
    private let leafKey: OpaquePointer
    private let leaves = Mutex<[String: Leaf]>([:])

    init(ca: LocalCA) throws(ServerError) {
        self.ca = ca
        caPEM = ca.certificatePEM
        guard let key = TLSObjects.generateKey() else {
            throw .startup("cannot generate the leaf key: \(TLSObjects.lastError())")
        }
        guard let ctx = SSL_CTX_new(TLS_server_method()) else {
            EVP_PKEY_free(key)
            throw .startup("cannot create the interception TLS context: \(TLSObjects.lastError())")
        }
        leafKey = key
        context = ctx
        sluice_ssl_ctx_server_defaults(ctx)
        SSL_CTX_set_cert_cb(
            ctx,
            { ssl, _ in
                guard let ssl, let raw = SSL_get_ex_data(ssl, 0) else { return 0 }
                return Unmanaged<InterceptedHandshake>.fromOpaque(raw).takeUnretainedValue().chooseCertificate(ssl)
            }, nil)
    }

    deinit {
        SSL_CTX_free(context)
        EVP_PKEY_free(leafKey)
    }

    /// A server-side `SSL` for one client connection; `handshake` answers its certificate
    /// callback and must outlive it.
    func makeSSL(for handshake: InterceptedHandshake) -> OpaquePointer? {
        guard let ssl = SSL_new(context) else { return nil }
        SSL_set_ex_data(ssl, 0, Unmanaged.passUnretained(handshake).toOpaque())
        return ssl
    }

    /// Puts the leaf for `name` and the shared key on `ssl`.
    func useLeaf(for name: String, on ssl: OpaquePointer) -> Bool {
        guard let leaf = leaf(for: name) else {
            Log.error("interception: cannot issue a certificate for \(name): \(TLSObjects.lastError())")
            return false
        }
        // The leaf may leave the cache (another worker refreshing it) while it is used here.
        return withExtendedLifetime(leaf) {
            SSL_use_certificate(ssl, leaf.certificate) == 1 && SSL_use_PrivateKey(ssl, leafKey) == 1
        }
    }

    /// The cached leaf for `name`, or a new one. Signed under the cache's lock, so that
    /// handshakes racing for a new name all get the same certificate.
    private func leaf(for name: String) -> Leaf? {
        let now = Int(time(nil))
        return leaves.withLock { cache -> Leaf? in
            if let cached = cache[name], cached.expires - now > 86400 { return cached }
            let isAddress = IPNetwork.parseAddress(name) != nil
            guard
                let cert = TLSObjects.makeCertificate(
                    subject: name, publicKey: leafKey, issuer: ca.certificate, signingKey: ca.key,
                    validDays: Self.leafValidDays,
                    extensions: [
                        (NID_basic_constraints, "critical,CA:FALSE"),
                        (NID_key_usage, "critical,digitalSignature,keyEncipherment"),
                        (NID_ext_key_usage, "serverAuth"),
                        (NID_subject_alt_name, (isAddress ? "IP:" : "DNS:") + name),
                        (NID_subject_key_identifier, "hash"), (NID_authority_key_identifier, "keyid:always"),
                    ])
            else {
                return nil
            }
            let leaf = Leaf(certificate: cert, expires: now + Self.leafValidDays * 86400 - 3600)
            if cache.count >= Self.maxCachedLeaves, let oldest = cache.min(by: { $0.value.expires < $1.value.expires })?.key {
                cache[oldest] = nil
            }
            cache[name] = leaf
            return leaf
        }
    }
}

/// One intercepted connection's handshake: the CONNECT host it may present a leaf for, and
/// what went wrong when it refused one. Owned by the `ClientConnection`.
final class InterceptedHandshake {
    let host: String
    unowned let interception: TLSInterception
    /// Set when the handshake was refused on Sluice's side (an SNI for another host).
    var refusal: String?

    init(host: String, interception: TLSInterception) {
        self.host = host
        self.interception = interception
    }

    /// OpenSSL's certificate callback: the SNI name must be the CONNECT host (a client must
    /// not get a certificate for a name whose traffic goes elsewhere); no SNI means the host.
    func chooseCertificate(_ ssl: OpaquePointer) -> Int32 {
        var name = host
        if let sni = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name) {
            let requested = String(cString: sni)
            guard requested.lowercased() == host.lowercased() else {
                refusal = "the client asked for '\(requested)' (SNI) in a CONNECT to \(host)"
                return 0
            }
            name = requested.lowercased()
        }
        return interception.useLeaf(for: name, on: ssl) ? 1 : 0
    }
}

/// Where workers find the interception server: empty until a configuration that intercepts
/// is loaded, then set once. Shared by every thread.
final class InterceptionSlot: Sendable {
    private let value = Mutex<TLSInterception?>(nil)
    var current: TLSInterception? { value.withLock { $0 } }
    func set(_ interception: TLSInterception) { value.withLock { $0 = interception } }
}
