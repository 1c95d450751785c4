import SluiceCore

/// `oauth2` (docs/configuration.md, "OAuth 2 (`oauth2` adapter)"): Alamofire's
/// `AuthenticationInterceptor` — a token fetched (once for the process, or the fleet) and
/// applied as `Authorization: Bearer`, refreshed before it expires and on a `refresh_on`
/// status (`OAuth2Authenticator`).
enum OAuth2Kind: InterceptorKind {
    static var name: String { "oauth2" }

    static func read(_ options: YAMLNode?, at node: YAMLNode, _ reader: inout NodeReader) -> OAuth2Authenticator? {
        guard let options else {
            reader.fail(node, "oauth2 needs grant, token_url and client_id")
            return nil
        }
        var grant: OAuth2Authenticator.Grant?
        var tokenURL: String?
        var clientID: String?
        var secret: Secret?
        var refresh: Secret?
        var scope: String?
        var audience: String?
        var clientAuth = OAuth2Authenticator.ClientAuthentication.basic
        var before = 30_000
        var windowMax = 5
        var windowMs = 30_000
        var refreshOn: Set<Int> = [401]
        let known = [
            "grant", "token_url", "client_id", "client_secret", "refresh_token", "scope", "audience",
            "client_auth", "refresh_before_expiry", "refresh_window", "refresh_on", "share",
        ]
        var share = true
        reader.entries(options, in: "oauth2", known: known) { r, key, v in
            switch key {
            case "grant":
                grant = v.scalar.flatMap { OAuth2Authenticator.Grant(rawValue: $0.string) }
                if grant == nil { r.fail(v, "grant must be client_credentials or refresh_token") }
            case "token_url":
                let text = r.secretOrString(v, what: key) ?? ""
                if text.lowercased().hasPrefix("http://") || text.lowercased().hasPrefix("https://") {
                    tokenURL = text
                } else {
                    r.fail(v, "token_url must be an http(s) URL")
                }
            case "client_id": clientID = r.secretOrString(v, what: key)
            case "client_secret": secret = r.secret(v, what: key)
            case "refresh_token": refresh = r.secret(v, what: key)
            case "scope": scope = r.secretOrString(v, what: key)
            case "audience": audience = r.secretOrString(v, what: key)
            case "client_auth":
                if let a = v.scalar.flatMap({ OAuth2Authenticator.ClientAuthentication(rawValue: $0.string) }) {
                    clientAuth = a
                } else {
                    r.fail(v, "client_auth must be basic or body")
                }
            case "share":
                if let on = r.bool(v, key: key) { share = on }
            case "refresh_before_expiry":
                if v.scalar?.string == "0" { before = 0 } else if let ms = r.duration(v, key: key) { before = ms }
            case "refresh_window":
                r.entries(v, in: "refresh_window", known: ["max", "per"]) { r, k, w in
                    if k == "max" {
                        if let n = w.scalar.flatMap({ Int($0.string) }), n >= 1 {
                            windowMax = n
                        } else {
                            r.fail(w, "max must be at least 1")
                        }
                    } else if let ms = r.duration(w, key: k) {
                        windowMs = ms
                    }
                }
            default:
                var codes: Set<Int> = []
                for (text, n) in r.strings(v, what: key) ?? [] {
                    if let c = Int(text), (400...599).contains(c) {
                        codes.insert(c)
                    } else {
                        r.fail(n, "refresh_on takes 4xx/5xx statuses")
                    }
                }
                refreshOn = codes
            }
        }
        guard let grant, let tokenURL, let clientID else {
            reader.fail(options, "oauth2 needs grant, token_url and client_id")
            return nil
        }
        if grant == .refreshToken && refresh == nil {
            reader.fail(options, "the refresh_token grant needs refresh_token")
            return nil
        }
        var settings = OAuth2Authenticator.Settings(
            grant: grant, tokenURL: tokenURL, clientID: clientID, clientSecret: secret, refreshToken: refresh, scope: scope,
            audience: audience, clientAuthentication: clientAuth, refreshBeforeExpiry: before, windowMax: windowMax,
            windowMilliseconds: windowMs, refreshOn: refreshOn)
        settings.share = share
        return OAuth2Authenticator(settings: settings)
    }

    static func describe(_ a: OAuth2Authenticator) -> String {
        let st = a.settings
        return "\(st.grant.rawValue) at \(st.tokenURL), client_id \(st.clientID), client_secret "
            + "\(st.clientSecret.map { "\($0) (\($0.source))" } ?? "none"), client_auth \(st.clientAuthentication.rawValue)"
    }
}
