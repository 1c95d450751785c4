import CCurl
import CShims
import SluiceCore

/// The one table from a failed libcurl transfer to what Sluice makes of it: the `ProxyError`
/// the client sees (docs/errors.md) and the failure's kind in retry terms (`retry.errors`;
/// the table in docs/configuration.md). What differs by purpose is deliberate: a tunnel only
/// connects, so every failure but DNS and a timeout reads as refused; a token request names
/// its phase; a forwarded request says whether the timeout hit the connect or the transfer.
/// TLS failures that a trust evaluator explains are named by `UpstreamTLS.failure`, and are
/// never retried (another try meets the same certificate); failures of a parent proxy by
/// `UpstreamProxy.failure`.
///
/// Threading: called on the worker's thread, before the handle goes back to the session.
enum CurlFailure {
    enum Purpose { case forward, tunnel, tokenRequest }

    /// `message` is libcurl's error buffer (nil or empty: its generic text for `code`);
    /// `trust` is the evaluator of a TLS transfer (nil for plain HTTP and tunnels);
    /// `gotResponse`: part of a response arrived (a lost connection is then not a `reset`).
    static func classify(
        _ code: CURLcode, handle: UnsafeMutableRawPointer, message: String?, host: String,
        authority: String, purpose: Purpose, trust: ServerTrust?, parent: UpstreamProxy? = nil,
        gotResponse: Bool = false
    ) -> (error: ProxyError, kind: TransportErrorKind) {
        let detail = message.flatMap { $0.isEmpty ? nil : $0 } ?? String(cString: sluice_curl_easy_strerror(code))
        if let parent, let failure = parent.failure(code, handle: handle, detail: detail) { return failure }
        if let trust, let failure = UpstreamTLS.failure(handle, code: code, message: detail, trust: trust, host: authority) {
            return (failure, .other)
        }
        switch code {
        case CURLE_COULDNT_RESOLVE_HOST:
            return (.dnsFailure(host: host), .dns)
        case CURLE_OPERATION_TIMEDOUT:
            return (.upstreamTimeout(host: authority, phase: timeoutPhase(handle, purpose)), .timeout)
        case CURLE_COULDNT_CONNECT:
            return (.upstreamRefused(host: authority), .refused)
        case _ where purpose == .tunnel:
            return (.upstreamRefused(host: authority), .other)
        case CURLE_SSL_CONNECT_ERROR:
            return (.tlsFailure(host: authority, reason: detail), .tls)
        case CURLE_PEER_FAILED_VERIFICATION, CURLE_SSL_ENGINE_NOTFOUND, CURLE_SSL_ENGINE_SETFAILED,
            CURLE_SSL_CERTPROBLEM, CURLE_SSL_CIPHER, CURLE_SSL_ENGINE_INITFAILED, CURLE_SSL_CACERT_BADFILE,
            CURLE_SSL_SHUTDOWN_FAILED, CURLE_SSL_CRL_BADFILE, CURLE_SSL_ISSUER_ERROR, CURLE_SSL_PINNEDPUBKEYNOTMATCH,
            CURLE_SSL_INVALIDCERTSTATUS, CURLE_SSL_CLIENTCERT:
            return (.tlsFailure(host: authority, reason: detail), .other)
        case CURLE_GOT_NOTHING, CURLE_SEND_ERROR, CURLE_RECV_ERROR,
            // An HTTP/2 stream reset (RST_STREAM) or a connection ended (GOAWAY) under it:
            // before any response byte, as retryable as a lost HTTP/1.1 connection.
            CURLE_HTTP2_STREAM, CURLE_HTTP2:
            return (.upstreamProtocol(host: authority, reason: detail), gotResponse ? .other : .reset)
        case CURLE_URL_MALFORMAT where purpose == .forward:
            return (.badURL(detail), .other)
        default:
            return (.upstreamProtocol(host: authority, reason: detail), .other)
        }
    }

    /// The error alone, for tunnels and token requests (nothing retries them).
    static func error(
        _ code: CURLcode, handle: UnsafeMutableRawPointer, message: String?, host: String,
        authority: String, purpose: Purpose, trust: ServerTrust?, parent: UpstreamProxy? = nil
    ) -> ProxyError {
        classify(
            code, handle: handle, message: message, host: host, authority: authority, purpose: purpose,
            trust: trust, parent: parent
        ).error
    }

    private static func timeoutPhase(_ handle: UnsafeMutableRawPointer, _ purpose: Purpose) -> TimeoutPhase {
        switch purpose {
        case .tokenRequest: return .tokenRequest
        case .tunnel: return .connect
        case .forward:
            var connectTime: curl_off_t = 0
            sluice_easy_getinfo_off(handle, CURLINFO_CONNECT_TIME_T, &connectTime)
            return connectTime == 0 ? .connect : .transfer
        }
    }
}
