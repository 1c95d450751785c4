import CCurl
import COpenSSL
import CShims
import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// Applies a host's `ServerTrust` (and client certificate) to a curl easy handle, and names
/// the reason when a handshake fails it.
///
/// What libcurl enforces itself: chain verification against the CA bundle, the host name,
/// OCSP stapling. What Sluice checks in the handshake (OpenSSL's certificate-verify callback,
/// installed through `CURLOPT_SSL_CTX_FUNCTION`): CRLs and pins, before any request byte is
/// sent. Handles whose trust libcurl cannot see in its connection and TLS-session matching
/// (anything but plain `default`) do not resume TLS sessions, so a session verified under
/// one evaluator never skips another's checks.
///
/// Threading: `configure` on the worker's thread; the callbacks run on the thread that drives
/// the handshake (the same worker), reading only the immutable `ServerTrust`.
enum UpstreamTLS {
    static func configure(
        _ h: UnsafeMutableRawPointer, trust: ServerTrust, clientCertificate: ClientCertificate?,
        defaultCAFile: String?
    ) {
        let r = trust.requirements
        if let ca = r.caFile ?? defaultCAFile {
            // The file replaces the system's anchors: libcurl's built-in CA directory
            // (/etc/ssl/certs on Debian) would otherwise still be trusted beside it.
            sluice_easy_setopt_str(h, CURLOPT_CAINFO, ca)
            sluice_easy_setopt_ptr(h, CURLOPT_CAPATH, nil)
        }
        sluice_easy_setopt_long(h, CURLOPT_SSL_VERIFYPEER, r.validateChain ? 1 : 0)
        sluice_easy_setopt_long(h, CURLOPT_SSL_VERIFYHOST, r.validateHost ? 2 : 0)
        if r.requireOCSP { sluice_easy_setopt_long(h, CURLOPT_SSL_VERIFYSTATUS, 1) }
        if !r.isCurlNative { sluice_easy_setopt_long(h, CURLOPT_SSL_SESSIONID_CACHE, 0) }
        if r.needsOwnCheck {
            sluice_easy_setopt_ptr(h, CURLOPT_SSL_CTX_DATA, Unmanaged.passUnretained(trust).toOpaque())
            sluice_easy_setopt_ssl_ctx_cb(h) { _, sslContext, userdata in
                let trust = Unmanaged<ServerTrust>.fromOpaque(userdata!).takeUnretainedValue()
                return UpstreamTLS.installVerifier(on: OpaquePointer(sslContext!), trust) ? CURLE_OK : CURLE_SSL_CERTPROBLEM
            }
        }
        if let cert = clientCertificate {
            sluice_easy_setopt_str(h, CURLOPT_SSLCERT, cert.certificate)
            sluice_easy_setopt_str(h, CURLOPT_SSLKEY, cert.key)
            if let pass = cert.passphrase { sluice_easy_setopt_str(h, CURLOPT_KEYPASSWD, pass.value) }
        }
    }

    /// How pooled connections may be reused by a TLS try under the worker's current policy
    /// snapshot. libcurl's pool knows nothing of pins and CRLs, so connections opened before
    /// a reload are kept out: its lifetime limit counts whole seconds (a connection dies when
    /// its age, rounded down, exceeds the limit), so just after a reload every try connects
    /// anew. A try still running under an older snapshot must not leave a connection behind.
    struct ConnectionReuse {
        /// Open a new connection (the first seconds after a reload).
        var fresh = false
        /// Reuse no pooled connection older than this many seconds.
        var maxAgeSeconds: Int?
        /// Close the connection after this try (it runs under a superseded snapshot).
        var forbidReuse = false

        func apply(to h: UnsafeMutableRawPointer) {
            if fresh { sluice_easy_setopt_long(h, CURLOPT_FRESH_CONNECT, 1) }
            if let maxAgeSeconds { sluice_easy_setopt_long(h, CURLOPT_MAXLIFETIME_CONN, maxAgeSeconds) }
            if forbidReuse { sluice_easy_setopt_long(h, CURLOPT_FORBID_REUSE, 1) }
        }
    }

    static func reuse(current: WorkerPipeline, exchangeSnapshot: WorkerPipeline?) -> ConnectionReuse {
        var reuse = ConnectionReuse(forbidReuse: exchangeSnapshot.map { $0 !== current } ?? false)
        guard let reloadedAt = current.reloadedAt else { return reuse }
        let seconds = (MonotonicClock.milliseconds() - reloadedAt) / 1000
        if seconds < 2 { reuse.fresh = true } else { reuse.maxAgeSeconds = seconds - 1 }
        return reuse
    }

    /// Makes `verify` the certificate check of `context` for `trust` (and turns
    /// `SSL_VERIFY_PEER` on): libcurl's handles (from `CURLOPT_SSL_CTX_FUNCTION`) and the
    /// native transport's contexts (`NativeTLSContext`) both get it here. The trust is
    /// retained for the context's life and released by OpenSSL's ex_data free callback: a
    /// pooled connection may outlive the policy snapshot that opened it. False when OpenSSL
    /// refused.
    static func installVerifier(on context: OpaquePointer, _ trust: ServerTrust) -> Bool {
        let retained = Unmanaged<ServerTrust>.passRetained(trust).toOpaque()
        let ok = sluice_ssl_ctx_set_verifier(
            context,
            { store, arg in
                let trust = Unmanaged<ServerTrust>.fromOpaque(arg!).takeUnretainedValue()
                return UpstreamTLS.verify(store!, trust) ? 1 : 0
            }, retained, { arg in Unmanaged<ServerTrust>.fromOpaque(arg!).release() })
        if ok == 0 { Unmanaged<ServerTrust>.fromOpaque(retained).release() }
        return ok != 0
    }

    /// The certificate-verify callback's work: CRLs (for the leaf), the chain when asked,
    /// then every pin set against the chain. Sets the store's error for libcurl to report.
    static func verify(_ store: OpaquePointer, _ trust: ServerTrust) -> Bool {
        let r = trust.requirements
        var crlStack: OpaquePointer?
        if !trust.crls.objects.isEmpty, let stack = OPENSSL_sk_new_null() {
            crlStack = stack
            // The CRLs were parsed at load and stay owned by `trust`; the stack only borrows them.
            for crl in trust.crls.objects { OPENSSL_sk_push(stack, UnsafeRawPointer(crl)) }
            X509_STORE_CTX_set0_crls(store, stack)  // not owned by the store context: freed below
            X509_STORE_CTX_set_flags(store, UInt(X509_V_FLAG_CRL_CHECK))
        }
        defer {
            if let crlStack {
                X509_STORE_CTX_set0_crls(store, nil)
                OPENSSL_sk_free(crlStack)
            }
        }
        if r.validateChain {
            guard X509_verify_cert(store) == 1 else { return false }
        }
        guard !r.certificatePins.isEmpty || !r.publicKeyPins.isEmpty else { return true }
        // With the chain verified, a pin may match any certificate of it (anchor included).
        // Without, only the leaf counts: the handshake proves the server holds the leaf's key
        // and nothing about the other certificates it sends, which anyone could append.
        var chain: [OpaquePointer] = []
        if r.validateChain, let verified = X509_STORE_CTX_get0_chain(store) {
            for i in 0..<OPENSSL_sk_num(verified) { chain.append(OpaquePointer(OPENSSL_sk_value(verified, i))) }
        } else if let leaf = X509_STORE_CTX_get0_cert(store) {
            chain.append(leaf)
        }
        if !r.certificatePins.isEmpty {
            let ders = chain.compactMap(CertificateFiles.der(of:))
            for pins in r.certificatePins where !ders.contains(where: pins.contains) {
                X509_STORE_CTX_set_error(store, X509_V_ERR_APPLICATION_VERIFICATION)
                return false
            }
        }
        if !r.publicKeyPins.isEmpty {
            let digests = chain.compactMap(CertificateFiles.spkiDigest(of:))
            for pins in r.publicKeyPins where !digests.contains(where: pins.contains) {
                X509_STORE_CTX_set_error(store, X509_V_ERR_APPLICATION_VERIFICATION)
                return false
            }
        }
        X509_STORE_CTX_set_error(store, X509_V_OK)
        return true
    }

    /// The trust failure behind a failed transfer, or nil when the failure was not about
    /// trust. `message` is libcurl's error buffer.
    static func failure(
        _ h: UnsafeMutableRawPointer, code: CURLcode, message: String, trust: ServerTrust,
        host: String
    ) -> ProxyError? {
        let reason: String
        switch code {
        case CURLE_PEER_FAILED_VERIFICATION:
            var result = 0
            sluice_easy_getinfo_long(h, CURLINFO_SSL_VERIFYRESULT, &result)
            reason = verifyReason(Int32(result), message: message, requirements: trust.requirements)
        case CURLE_SSL_INVALIDCERTSTATUS:
            if message.contains("revoked") || message.contains("revocation") {
                reason = "certificate revoked"
            } else if message.contains("No OCSP response") {
                reason = "no OCSP response"
            } else {
                reason = message
            }
        case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
            reason = "public key pin mismatch"
        case CURLE_SSL_CACERT_BADFILE:
            reason = "the CA file could not be used (\(message))"
        default:
            return nil
        }
        return .trustFailure(host: host, evaluator: trust.evaluatorName, reason: reason)
    }

    /// A failed verification's reason as the access log and the 502 name it, from OpenSSL's
    /// verify result (both transports; `message` is libcurl's text, empty for the native one).
    static func verifyReason(_ result: Int32, message: String, requirements r: TrustRequirements) -> String {
        // libcurl checks the name itself, after OpenSSL's verification, and leaves the verify
        // result at X509_V_ERR_UNSPECIFIED (or OK): its message is what says so.
        if message.contains("subject name") || message.contains("does not match target host") {
            return "hostname mismatch"
        }
        switch result {
        case X509_V_OK:
            return message
        case X509_V_ERR_CERT_HAS_EXPIRED: return "certificate expired"
        case X509_V_ERR_CERT_NOT_YET_VALID: return "certificate not yet valid"
        case X509_V_ERR_CERT_REVOKED: return "certificate revoked"
        case X509_V_ERR_UNABLE_TO_GET_CRL: return "no CRL for the certificate's issuer"
        case X509_V_ERR_CRL_HAS_EXPIRED: return "the CRL has expired"
        case X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH: return "hostname mismatch"
        case X509_V_ERR_APPLICATION_VERIFICATION:
            switch (r.certificatePins.isEmpty, r.publicKeyPins.isEmpty) {
            case (false, true): return "certificate pin mismatch"
            case (true, false): return "public key pin mismatch"
            default: return "certificate or public key pin mismatch"
            }
        default:
            return "untrusted certificate (\(String(cString: X509_verify_cert_error_string(Int(result)))))"
        }
    }
}

extension TLSProtocolMemory {
    /// What an https try to `target` tells about its origin's protocols: the one it chose when
    /// libcurl offered h2 and http/1.1 by ALPN (the next tries go native while it speaks
    /// HTTP/1.1, `UpstreamEngine.choose`), or, when the native client's try ended without a
    /// version (it failed), that the choice is to be learned again.
    mutating func learn(from timings: TryTimings, target: RequestTarget, http2: HTTP2Mode) {
        if timings.engine == .curl, let version = timings.httpVersion, http2 != .off {
            learn(host: target.host, port: target.port, spokeHTTP2: version == .http2, now: MonotonicClock.milliseconds())
        } else if timings.engine == .native, timings.httpVersion == nil {
            forget(host: target.host, port: target.port)
        }
    }
}
