/// `upstream_proxy:` in a policy (docs/configuration.md, "Parent proxy"): Sluice behind a
/// corporate proxy. A host whose effective policy names one reaches its origin through it:
/// plain-HTTP requests are sent to the parent in absolute form, https requests and CONNECT
/// tunnels go through a `CONNECT` to the parent. Never taken from Sluice's own environment
/// (`http_proxy` & co. are ignored: `UpstreamSession.makeHandle`).
///
/// With a parent, Sluice resolves and connects to the parent only: `access.deny` is checked
/// against the parent's addresses, and the destination's name is the parent's to resolve.
///
/// Threading: a value, fixed when the configuration is loaded and read by every worker (its
/// curl side, `UpstreamProxy+Curl.swift`, runs on the worker configuring a transfer).
public struct UpstreamProxy: Sendable, Equatable {
    /// Basic credentials for the parent (`Proxy-Authorization`).
    public struct Auth: Sendable, Equatable {
        public var username: String
        public var password: Secret
        public init(username: String, password: Secret) {
            self.username = username
            self.password = password
        }
    }

    /// `http://host:port`: plain HTTP to the parent, with an explicit port (proxies have no
    /// agreed default: Squid's is 3128, libcurl's 1080). Never carries credentials (they live
    /// in `auth`), so errors and logs show it as it is.
    public var url: String
    /// Destinations reached directly: host names (`intranet.example`), domains with a
    /// leading dot (`.corp.example`: the domain and every subdomain), IP addresses and CIDR
    /// networks (`10.0.0.0/8`). In libcurl's `NOPROXY` syntax.
    public var noProxy: [String]
    public var auth: Auth?

    public init(url: String, noProxy: [String] = [], auth: Auth? = nil) {
        self.url = url
        self.noProxy = noProxy
        self.auth = auth
    }

    /// The parent's host name or address: with a parent, the only destination Sluice
    /// resolves and connects to (so the one `access.deny` refuses).
    public var host: String { URLParts(url).host }
}
