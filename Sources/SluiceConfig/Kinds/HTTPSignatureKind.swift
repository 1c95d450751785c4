import HTTPTypes
import SluiceCore

/// `http_signature` (docs/configuration.md, "HTTP Message Signatures (`http_signature`)"):
/// every try is signed per RFC 9421 with HMAC-SHA256 or Ed25519, covering the components the
/// policy names, with a `Content-Digest` (RFC 9530) of the body when it is covered.
///
/// ```yaml
/// - http_signature: { key_id: k1, algorithm: ed25519, key: file:/etc/sluice/k1.pem }
/// ```
enum HTTPSignatureKind: InterceptorKind {
    static var name: String { "http_signature" }

    static func read(_ settings: YAMLNode?, at entry: YAMLNode, _ reader: inout NodeReader) -> HTTPMessageSigner? {
        guard let settings else {
            reader.fail(entry, "http_signature needs key_id, algorithm and key")
            return nil
        }
        var keyID: String?
        var algorithm: HTTPMessageSigner.Algorithm?
        var keyNode: YAMLNode?
        var components: [String]?
        var created = true
        var expires: Int?
        var nonce = false
        var label = HTTPMessageSigner.defaultLabel
        var tag: String?
        let known = ["key_id", "algorithm", "key", "components", "created", "expires", "nonce", "label", "tag"]
        reader.entries(settings, in: "http_signature", known: known) { r, key, value in
            switch key {
            case "key_id":
                keyID = value.scalar?.string.isEmpty == false ? value.scalar?.string : nil
                if keyID == nil || !keyID!.utf8.allSatisfy({ $0 >= 0x20 && $0 < 0x7F && $0 != 0x22 && $0 != 0x5C }) {
                    keyID = nil
                    r.fail(value, "key_id must be printable ASCII without quotes or backslashes")
                }
            case "algorithm":
                algorithm = value.scalar.flatMap { HTTPMessageSigner.Algorithm(rawValue: $0.string) }
                if algorithm == nil { r.fail(value, "algorithm must be hmac-sha256 or ed25519") }
            case "key":
                keyNode = value
            case "components":
                var list: [String] = []
                for (text, n) in r.strings(value, what: "components") ?? [] {
                    let lower = text.lowercased()
                    if lower.hasPrefix("@") {
                        guard HTTPMessageSigner.derivedComponents.contains(lower) else {
                            r.fail(
                                n,
                                "unknown derived component '\(text)' (known: \(HTTPMessageSigner.derivedComponents.joined(separator: ", ")))"
                            )
                            continue
                        }
                        list.append(lower)
                    } else if r.fieldName(text, at: n) != nil {
                        list.append(lower)
                    }
                }
                components = list
            case "created":
                if let on = r.bool(value, key: key) { created = on }
            case "expires":
                if let ms = r.duration(value, key: key) { expires = max(1, ms / 1000) }
            case "nonce":
                if let on = r.bool(value, key: key) { nonce = on }
            case "label":
                guard let text = value.scalar?.string, HTTPMessageSigner.isLabel(text) else {
                    return r.fail(value, "label must be a lower-case key such as sig1")
                }
                label = text
            case "tag":
                // A structured-field string: printable ASCII without `"` or `\`.
                guard let text = value.scalar?.string, !text.isEmpty,
                    text.utf8.allSatisfy({ $0 >= 0x20 && $0 < 0x7F && $0 != 0x22 && $0 != 0x5C })
                else { return r.fail(value, "tag must be printable ASCII without quotes or backslashes") }
                tag = text
            default: break
            }
        }
        guard let keyID, let algorithm, let keyNode else {
            reader.fail(settings, "http_signature needs key_id, algorithm (hmac-sha256 or ed25519) and key")
            return nil
        }
        guard let secret = reader.secret(keyNode, what: "http_signature key") else { return nil }
        let key: HTTPMessageSigner.Key
        switch algorithm {
        case .hmacSHA256:
            guard let bytes = Base64.decode(secret.value.filter { !$0.isWhitespace }), bytes.count >= 16 else {
                reader.fail(keyNode, "an hmac-sha256 key is the shared secret in base64, at least 16 bytes")
                return nil
            }
            key = .hmac(Crypto.HMACKey(bytes))
        case .ed25519:
            guard let signing = Crypto.Ed25519Key(pem: secret.value) else {
                reader.fail(keyNode, "an ed25519 key is a PEM private key (PKCS #8, 'BEGIN PRIVATE KEY')")
                return nil
            }
            key = .ed25519(signing)
        }
        return HTTPMessageSigner(
            keyID: keyID, algorithm: algorithm, key: key, keySource: secret.source, components: components,
            created: created, expiresAfter: expires, nonce: nonce, label: label, tag: tag)
    }

    static func describe(_ a: HTTPMessageSigner) -> String {
        var parts = [
            "key_id \(a.keyID)", "algorithm \(a.algorithm.rawValue)", "key <redacted> (\(a.keySource))",
            "covers "
                + (a.components ?? HTTPMessageSigner.defaultComponents + ["content-digest (with a body)"])
                .joined(separator: " "),
            "label \(a.label)",
        ]
        if !a.created { parts.append("no created") }
        if let e = a.expiresAfter { parts.append("expires after \(e) s") }
        if a.nonce { parts.append("nonce") }
        if let t = a.tag { parts.append("tag \(t)") }
        return parts.joined(separator: ", ")
    }
}

/// The `http_signature` adapter: RFC 9421's signature base of the covered components, signed,
/// in `Signature-Input` and `Signature` under the label (any the client sent are replaced).
/// A named field the request does not have is left out (the `Signature-Input` lists what is
/// covered); `content-digest` is computed from the body (`sha-256`, RFC 9530) when covered.
struct HTTPMessageSigner: EveryTryAdapter {
    enum Algorithm: String, Sendable {
        case hmacSHA256 = "hmac-sha256"
        case ed25519
    }

    enum Key: Sendable {
        /// The shared secret, its HMAC states computed once.
        case hmac(Crypto.HMACKey)
        case ed25519(Crypto.Ed25519Key)
    }

    static let defaultLabel = "sig1"
    /// Covered when the policy names none (and `content-digest` when the request has a body).
    static let defaultComponents = ["@method", "@authority", "@path", "@query"]
    static let derivedComponents = [
        "@method", "@authority", "@scheme", "@target-uri", "@request-target", "@path", "@query",
    ]

    var name: String { "http_signature" }
    var readsBody: Bool { components?.contains("content-digest") ?? true }
    let keyID: String
    let algorithm: Algorithm
    let key: Key
    let keySource: String
    /// nil: `defaultComponents` (+ `content-digest` with a body).
    let components: [String]?
    let created: Bool
    let expiresAfter: Int?
    let nonce: Bool
    let label: String
    let tag: String?

    static func isLabel(_ text: String) -> Bool {
        guard let first = text.utf8.first, (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(first) || first == 0x2A
        else { return false }
        return text.utf8.allSatisfy {
            (UInt8(ascii: "a")...UInt8(ascii: "z")).contains($0) || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0)
                || $0 == UInt8(ascii: "_") || $0 == UInt8(ascii: "-") || $0 == UInt8(ascii: ".") || $0 == UInt8(ascii: "*")
        }
    }

    func adaptTry(_ request: inout ProxyRequest, _ context: TryContext) throws(AdaptationError) {
        let hasBody = !(context.body ?? []).isEmpty
        var covered = components ?? (Self.defaultComponents + (hasBody ? ["content-digest"] : []))
        if covered.contains("content-digest") {
            if hasBody || request.body != .none {
                let digest = Base64.encode(Crypto.sha256(context.body ?? []))
                request.headerFields[HTTPField.Name("Content-Digest")!] = "sha-256=:\(digest):"
            } else {
                covered.removeAll { $0 == "content-digest" }
            }
        }
        request.headerFields[HTTPField.Name("Signature")!] = nil
        request.headerFields[HTTPField.Name("Signature-Input")!] = nil
        var parameters = HTTPMessageSignature.Parameters(keyID: keyID)
        if created { parameters.created = context.wallClockMilliseconds / 1000 }
        if let expiresAfter { parameters.expires = context.wallClockMilliseconds / 1000 + expiresAfter }
        if nonce { parameters.nonce = Hex.lowercase(Crypto.randomBytes(16)) }
        parameters.tag = tag
        let base = HTTPMessageSignature.base(of: request, covering: covered, parameters: parameters)
        let signature: [UInt8]?
        switch key {
        case .hmac(let secret): signature = secret.mac(Array(base.base.utf8))
        case .ed25519(let signing): signature = signing.sign(Array(base.base.utf8))
        }
        guard let signature else { throw AdaptationError(adapter: name, reason: "signing failed") }
        request.headerFields[HTTPField.Name("Signature-Input")!] = "\(label)=\(base.signatureParams)"
        request.headerFields[HTTPField.Name("Signature")!] = "\(label)=:\(Base64.encode(signature)):"
    }
}

/// RFC 9421's signature base for a request (§2.5): one line per covered component, then
/// `@signature-params`. Pure; `HTTPSignatureTests` reproduces the RFC's Appendix B.2.5 and B.2.6.
enum HTTPMessageSignature {
    struct Parameters {
        var created: Int?
        var expires: Int?
        var nonce: String?
        var keyID: String
        var tag: String?
        init(keyID: String) { self.keyID = keyID }

        /// In the order RFC 9421's examples write them.
        var serialized: String {
            var out = ""
            if let created { out += ";created=\(created)" }
            if let expires { out += ";expires=\(expires)" }
            if let nonce { out += ";nonce=\"\(nonce)\"" }
            out += ";keyid=\"\(keyID)\""
            if let tag { out += ";tag=\"\(tag)\"" }
            return out
        }
    }

    /// The base, and the `@signature-params` value (`Signature-Input`'s member). A named field
    /// the request lacks is not covered.
    static func base(
        of request: ProxyRequest, covering components: [String], parameters: Parameters
    ) -> (base: String, signatureParams: String) {
        let url = URLParts(request.url)
        var rest = url.pathAndQuery
        if let hash = rest.firstIndex(of: "#") { rest = rest[..<hash] }
        var path = rest
        var query: Substring?
        if let q = rest.firstIndex(of: "?") {
            path = rest[..<q]
            query = rest[rest.index(after: q)...]
        }
        let https = url.scheme.lowercased() == "https"
        var authority = Substring(url.authority.lowercased())
        if let at = authority.lastIndex(of: "@") { authority = authority[authority.index(after: at)...] }
        if let colon = authority.lastIndex(of: ":"), !authority.hasSuffix("]"),
            authority[authority.index(after: colon)...] == (https ? "443" : "80")
        {
            authority = authority[..<colon]
        }
        var lines: [String] = []
        var included: [String] = []
        for component in components {
            let value: String
            switch component {
            case "@method": value = request.method
            case "@authority": value = String(authority)
            case "@scheme": value = https ? "https" : "http"
            case "@target-uri": value = request.url
            case "@path": value = path.isEmpty ? "/" : String(path)
            case "@query": value = "?" + (query.map(String.init) ?? "")
            case "@request-target": value = (path.isEmpty ? "/" : String(path)) + (query.map { "?" + $0 } ?? "")
            default:
                guard let name = HTTPField.Name(component) else { continue }
                let values = request.headerFields[values: name]
                guard !values.isEmpty else { continue }
                value = values.map { trimmed($0) }.joined(separator: ", ")
            }
            lines.append("\"\(component)\": \(value)")
            included.append(component)
        }
        let params = "(" + included.map { "\"\($0)\"" }.joined(separator: " ") + ")" + parameters.serialized
        lines.append("\"@signature-params\": \(params)")
        return (lines.joined(separator: "\n"), params)
    }

    private static func trimmed(_ value: String) -> String {
        var s = Substring(value)
        while let c = s.first, c == " " || c == "\t" { s = s.dropFirst() }
        while let c = s.last, c == " " || c == "\t" { s = s.dropLast() }
        return String(s)
    }
}
