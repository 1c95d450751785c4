import CCurl
import CShims
import SluiceCore

/// The one mapping from a failed libcurl transfer to the `ProxyError` the client sees
/// (docs/errors.md). What differs by purpose is deliberate: a tunnel only connects, so every
/// failure but DNS and a timeout reads as refused; a token request names its phase; a
/// forwarded request says whether the timeout hit the connect or the transfer. TLS failures
/// that a trust evaluator explains are named by `UpstreamTLS.failure`.
///
/// Threading: called on the worker's thread, before the handle goes back to the session.
enum CurlFailure {
    enum Purpose { case forward, tunnel, tokenRequest }

    /// `message` is libcurl's error buffer (nil or empty: its generic text for `code`);
    /// `trust` is the evaluator of a TLS transfer (nil for plain HTTP and tunnels).
    static func error(_ code: CURLcode, handle: UnsafeMutableRawPointer, message: String?, host: String,
                      authority: String, purpose: Purpose, trust: ServerTrust?) -> ProxyError {
        let detail = message.flatMap { $0.isEmpty ? nil : $0 } ?? String(cString: curl_easy_strerror(code))
        if let trust, let failure = UpstreamTLS.failure(handle, code: code, message: detail, trust: trust, host: authority) {
            return failure
        }
        switch code {
        case CURLE_COULDNT_RESOLVE_HOST:
            return .dnsFailure(host: host)
        case CURLE_OPERATION_TIMEDOUT:
            switch purpose {
            case .tokenRequest: return .upstreamTimeout(host: authority, phase: "token request")
            case .tunnel: return .upstreamTimeout(host: authority, phase: "connect")
            case .forward:
                var connectTime: curl_off_t = 0
                sluice_easy_getinfo_off(handle, CURLINFO_CONNECT_TIME_T, &connectTime)
                return .upstreamTimeout(host: authority, phase: connectTime == 0 ? "connect" : "transfer")
            }
        case _ where purpose == .tunnel, CURLE_COULDNT_CONNECT:
            return .upstreamRefused(host: authority)
        case CURLE_SSL_CONNECT_ERROR, CURLE_PEER_FAILED_VERIFICATION, CURLE_SSL_ENGINE_NOTFOUND,
             CURLE_SSL_ENGINE_SETFAILED, CURLE_SSL_CERTPROBLEM, CURLE_SSL_CIPHER, CURLE_SSL_ENGINE_INITFAILED,
             CURLE_SSL_CACERT_BADFILE, CURLE_SSL_SHUTDOWN_FAILED, CURLE_SSL_CRL_BADFILE, CURLE_SSL_ISSUER_ERROR,
             CURLE_SSL_PINNEDPUBKEYNOTMATCH, CURLE_SSL_INVALIDCERTSTATUS, CURLE_SSL_CLIENTCERT:
            return .tlsFailure(host: authority, reason: detail)
        case CURLE_URL_MALFORMAT where purpose == .forward:
            return .badURL(detail)
        default:
            return .upstreamProtocol(host: authority, reason: detail)
        }
    }
}
