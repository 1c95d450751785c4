import COpenSSL
import CShims
import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// The native transport's TLS client settings for one host's trust: an `SSL_CTX` made from a
/// `ServerTrust`, the client certificate and the process's CA file, and the `SSL` of each
/// connection made from it (docs/architecture.md, "Two transports").
///
/// The trust evaluators are one implementation for both transports: what libcurl enforces for
/// its handles — the chain against the CA file, the host name — is OpenSSL's own verification
/// here (`SSL_VERIFY_PEER`, `SSL_set1_host`); what Sluice checks itself — CRLs and pins — is
/// the same certificate-verify callback (`UpstreamTLS.verify`), installed the same way; a
/// failed handshake is named by the same reasons (`UpstreamTLS.reason(verifyResult:)`). OCSP
/// stapling stays libcurl's (`UpstreamEngine.choose` sends such tries there).
///
/// Sessions are not resumed, so every connection's handshake runs the evaluator; connections
/// are pooled per context (`UpstreamAddressKey`), so a connection verified under one trust is
/// never reused under another, and a reload closes the idle ones and makes new contexts
/// (`NativeUpstreamPool.closeIdleTLSConnections`).
///
/// Threading: a context is made and used on one worker's thread (`NativeTLSContexts`); the
/// verify callback runs on that thread during a handshake, reading the immutable trust.
final class NativeTLSContext {
    let context: OpaquePointer
    let trust: ServerTrust
    /// `tls.ca_file` when the context was made (used when the trust names none).
    let defaultCAFile: String?
    /// The host name is checked after the handshake (`validateHost` without `validateChain`:
    /// OpenSSL checks the name only as part of chain verification).
    let checksHostAfterHandshake: Bool

    /// Nil with the reason when OpenSSL refused a setting (a CA file or client certificate
    /// that cannot be read).
    static func make(
        trust: ServerTrust, clientCertificate: ClientCertificate?, defaultCAFile: String?
    ) -> Result<
        NativeTLSContext, NativeTLSSetupFailure
    > {
        guard let ctx = SSL_CTX_new(TLS_client_method()) else { return .failure(.init("SSL_CTX_new failed")) }
        sluice_ssl_ctx_client_defaults(ctx)
        let r = trust.requirements
        if !r.insecure {
            let loaded: Int32
            if let ca = r.caFile ?? defaultCAFile {
                loaded = SSL_CTX_load_verify_locations(ctx, ca, nil)
            } else if sluice_curl_cainfo() != nil || sluice_curl_capath() != nil {
                // The system's anchors as libcurl finds them (its built-in bundle and
                // directory), so that both transports trust the same CAs.
                loaded = SSL_CTX_load_verify_locations(ctx, sluice_curl_cainfo(), sluice_curl_capath())
            } else {
                loaded = SSL_CTX_set_default_verify_paths(ctx)
            }
            // As libcurl does by default: a trusted intermediate in the CA file is an anchor.
            X509_VERIFY_PARAM_set_flags(SSL_CTX_get0_param(ctx), UInt(X509_V_FLAG_PARTIAL_CHAIN))
            if loaded != 1 {
                let detail = NativeTLS.errorString()
                SSL_CTX_free(ctx)
                return .failure(.trust("the CA file could not be used (\(detail))"))
            }
        }
        if r.needsOwnCheck {
            // The same check libcurl's handles get.
            guard UpstreamTLS.installVerifier(on: ctx, trust) else {
                SSL_CTX_free(ctx)
                return .failure(.init("the certificate check could not be installed"))
            }
        } else {
            SSL_CTX_set_verify(ctx, r.validateChain ? SSL_VERIFY_PEER : SSL_VERIFY_NONE, nil)
        }
        if let cert = clientCertificate {
            let ok =
                sluice_ssl_ctx_set_key_passphrase(ctx, cert.passphrase?.value) == 1
                && SSL_CTX_use_certificate_chain_file(ctx, cert.certificate) == 1
                && SSL_CTX_use_PrivateKey_file(ctx, cert.key, SSL_FILETYPE_PEM) == 1
                && SSL_CTX_check_private_key(ctx) == 1
            if !ok {
                let detail = NativeTLS.errorString()
                SSL_CTX_free(ctx)
                return .failure(.init("the client certificate could not be used (\(detail))"))
            }
        }
        return .success(
            NativeTLSContext(
                ctx, trust: trust, defaultCAFile: defaultCAFile, checksHostAfterHandshake: r.validateHost && !r.validateChain))
    }

    private init(_ context: OpaquePointer, trust: ServerTrust, defaultCAFile: String?, checksHostAfterHandshake: Bool) {
        self.context = context
        self.trust = trust
        self.defaultCAFile = defaultCAFile
        self.checksHostAfterHandshake = checksHostAfterHandshake
    }

    deinit { SSL_CTX_free(context) }

    /// A client `SSL` on `fd` for `host` (SNI for a name, the host check for a name or an
    /// address), offering HTTP/1.1 alone by ALPN.
    func makeSSL(fd: Int32, host: String) -> OpaquePointer? {
        guard let ssl = SSL_new(context) else { return nil }
        SSL_set_fd(ssl, fd)
        let r = trust.requirements
        let isAddress = NativeTLS.isIPLiteral(host)
        if !isAddress { _ = sluice_ssl_set_sni(ssl, host) }
        if r.validateHost && r.validateChain {
            SSL_set_hostflags(ssl, UInt32(X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS))
            guard SSL_set1_host(ssl, host) == 1 else {
                SSL_free(ssl)
                return nil
            }
        }
        _ = NativeTLS.http11ALPN.withUnsafeBufferPointer { SSL_set_alpn_protos(ssl, $0.baseAddress, UInt32($0.count)) }
        return ssl
    }

    /// After a handshake without chain verification but with the host check (a pinned
    /// self-signed certificate): whether the leaf names `host`.
    func peerNames(_ ssl: OpaquePointer, host: String) -> Bool {
        guard let leaf = SSL_get0_peer_certificate(ssl) else { return false }
        if NativeTLS.isIPLiteral(host) { return X509_check_ip_asc(leaf, host, 0) == 1 }
        return X509_check_host(leaf, host, host.utf8.count, UInt32(X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS), nil) == 1
    }
}

/// Why a TLS context could not be made: a trust failure (the CA file) or another TLS error.
struct NativeTLSSetupFailure: Error {
    let text: String
    let isTrust: Bool
    init(_ text: String) {
        self.text = text
        isTrust = false
    }
    private init(trust text: String) {
        self.text = text
        isTrust = true
    }
    static func trust(_ text: String) -> NativeTLSSetupFailure { NativeTLSSetupFailure(trust: text) }
}

/// The worker's TLS contexts, one per distinct trust (its requirements: every host whose
/// policy has the same trust shares one), client certificate and default CA file: made on a
/// connection's first need, dropped at a reload (the CA files may have new contents) or all
/// at once when more than `limit` pile up; a connection keeps its own context alive.
///
/// Threading: owned by one worker's thread.
final class NativeTLSContexts {
    static let limit = 64
    private struct Key: Hashable {
        let trust: TrustRequirements
        /// The client certificate's files and passphrase.
        let clientCertificate: [String]
        let defaultCAFile: String?
    }
    private var contexts: [Key: NativeTLSContext] = [:]
    /// The context last found for a policy's trust object, so that a try does not hash the
    /// requirements (CRLs and pins included): the entry keeps the trust alive, so its identity
    /// is not reused while the entry exists.
    private var byTrust: [ObjectIdentifier: (trust: ServerTrust, certificate: ClientCertificate?, context: NativeTLSContext)] =
        [:]

    func context(
        trust: ServerTrust, clientCertificate: ClientCertificate?, defaultCAFile: String?
    ) -> Result<
        NativeTLSContext, NativeTLSSetupFailure
    > {
        if let found = byTrust[ObjectIdentifier(trust)], found.certificate == clientCertificate,
            found.context.defaultCAFile == defaultCAFile
        {
            return .success(found.context)
        }
        let certificate = clientCertificate.map { [$0.certificate, $0.key, $0.passphrase?.value ?? ""] } ?? []
        let key = Key(trust: trust.requirements, clientCertificate: certificate, defaultCAFile: defaultCAFile)
        let context: NativeTLSContext
        if let found = contexts[key] {
            context = found
        } else {
            let made = NativeTLSContext.make(trust: trust, clientCertificate: clientCertificate, defaultCAFile: defaultCAFile)
            guard case .success(let new) = made else { return made }
            if contexts.count >= Self.limit { removeAll() }
            contexts[key] = new
            context = new
        }
        if byTrust.count >= 4 * Self.limit { byTrust.removeAll() }
        byTrust[ObjectIdentifier(trust)] = (trust, clientCertificate, context)
        return .success(context)
    }

    func removeAll() {
        contexts.removeAll()
        byTrust.removeAll()
    }
}

enum NativeTLS {
    /// ALPN's wire form of the one protocol the native transport speaks.
    static let http11ALPN: [UInt8] = [8] + Array("http/1.1".utf8)

    static func isIPLiteral(_ host: String) -> Bool {
        var v4 = in_addr()
        var v6 = in6_addr()
        return inet_pton(AF_INET, host, &v4) == 1 || inet_pton(AF_INET6, host, &v6) == 1
    }

    /// The oldest OpenSSL error queued on this thread, as text (`TLSObjects.lastError`), and
    /// the rest of the queue cleared: the worker thread's next `SSL_*` call starts clean.
    static func errorString() -> String {
        defer { ERR_clear_error() }
        return TLSObjects.lastError()
    }
}
