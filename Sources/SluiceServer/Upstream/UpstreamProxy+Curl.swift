import CCurl
import CShims
import SluiceCore

/// `upstream_proxy:` applied to a libcurl handle (the key's behaviour:
/// Sources/SluiceCore/Features/UpstreamProxy.swift). Plain-HTTP requests go to the parent in
/// absolute form; https requests and tunnels (`tunnel`) go through a `CONNECT` to it.
///
/// Threading: called on the worker's thread while a transfer configures its handle.
extension UpstreamProxy {
    func apply(to h: UnsafeMutableRawPointer, tunnel: Bool = false) {
        sluice_easy_setopt_str(h, CURLOPT_PROXY, url)
        sluice_easy_setopt_long(h, CURLOPT_PROXYTYPE, Int(CURLPROXY_HTTP.rawValue))
        if !noProxy.isEmpty { sluice_easy_setopt_str(h, CURLOPT_NOPROXY, noProxy.joined(separator: ",")) }
        if tunnel { sluice_easy_setopt_long(h, CURLOPT_HTTPPROXYTUNNEL, 1) }
        if let auth {
            sluice_easy_setopt_long(h, CURLOPT_PROXYAUTH, Self.curlAuthBasic)
            sluice_easy_setopt_str(h, CURLOPT_PROXYUSERNAME, auth.username)
            sluice_easy_setopt_str(h, CURLOPT_PROXYPASSWORD, auth.password.value)
        }
    }

    /// `CURLAUTH_BASIC` (a macro Swift does not import).
    static let curlAuthBasic = 1

    /// What a failure of a transfer through this parent was, when the parent is the one that
    /// failed: its name did not resolve, it refused the connection, or it answered the
    /// `CONNECT` with something other than 2xx. Nil when the failure is the origin's.
    func failure(
        _ code: CURLcode, handle: UnsafeMutableRawPointer, detail: String
    )
        -> (error: ProxyError, kind: TransportErrorKind)?
    {
        switch code {
        case CURLE_COULDNT_RESOLVE_PROXY:
            return (.parentProxyFailed(proxy: url, reason: "DNS lookup failed"), .dns)
        case CURLE_COULDNT_CONNECT:
            // With a parent, the only connection Sluice opens is to the parent.
            return (.parentProxyFailed(proxy: url, reason: "connection refused"), .refused)
        case CURLE_PROXY:
            return (.parentProxyFailed(proxy: url, reason: detail), .other)
        default:
            var connectCode = 0
            sluice_easy_getinfo_long(handle, CURLINFO_HTTP_CONNECTCODE, &connectCode)
            if connectCode != 0 && !(200...299).contains(connectCode) {
                return (.parentProxyFailed(proxy: url, reason: "CONNECT answered \(connectCode)"), .other)
            }
            return nil
        }
    }
}
