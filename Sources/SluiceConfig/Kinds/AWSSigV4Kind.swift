import HTTPTypes
import SluiceCore
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// `aws_sigv4` (docs/configuration.md, "AWS Signature Version 4 (`aws_sigv4`)"): every try is
/// signed with AWS Signature Version 4 (Envoy's `aws_request_signing`), so a client that holds
/// no credentials reaches S3 and every other AWS API through Sluice.
///
/// ```yaml
/// - aws_sigv4: { service: s3, region: eu-west-1 }     # credentials from Sluice's environment
/// ```
enum AWSSigV4Kind: InterceptorKind {
    static var name: String { "aws_sigv4" }

    static func read(_ settings: YAMLNode?, at entry: YAMLNode, _ reader: inout NodeReader) -> AWSSigV4Signer? {
        guard let settings else {
            reader.fail(entry, "aws_sigv4 needs service and region, e.g. '- aws_sigv4: { service: s3, region: eu-west-1 }'")
            return nil
        }
        var service: String?
        var region: String?
        var credentials: AWSSigV4Signer.CredentialSource?
        var payload = AWSSigV4Signer.Payload.signed
        var excluded = AWSSigV4Signer.defaultExcludedHeaders
        let known = ["service", "region", "credentials", "payload", "exclude_headers"]
        reader.entries(settings, in: "aws_sigv4", known: known) { r, key, value in
            switch key {
            case "service", "region":
                guard let text = value.scalar?.string, !text.isEmpty,
                    text.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F && $0 != UInt8(ascii: "/") })
                else { return r.fail(value, "\(key) must be a name such as \(key == "service" ? "s3" : "eu-west-1")") }
                if key == "service" { service = text } else { region = text }
            case "credentials":
                credentials = readCredentials(value, &r)
            case "payload":
                if let p = value.scalar.flatMap({ AWSSigV4Signer.Payload(rawValue: $0.string) }) {
                    payload = p
                } else {
                    r.fail(value, "payload must be signed or unsigned")
                }
            default:
                excluded = []
                for (text, n) in r.strings(value, what: "exclude_headers") ?? [] {
                    if let field = r.fieldName(text, at: n) { excluded.insert(field.canonicalName) }
                }
            }
        }
        guard let service, let region else {
            reader.fail(settings, "aws_sigv4 needs both service and region (e.g. service: s3, region: eu-west-1)")
            return nil
        }
        if credentials == nil { credentials = environmentCredentials(at: settings, &reader) }
        guard let credentials else { return nil }
        return AWSSigV4Signer(
            service: service, region: region, credentials: credentials, payload: payload, excludedHeaders: excluded)
    }

    /// `credentials:` — `{ file, profile }` or `{ access_key_id, secret_access_key, session_token }`.
    private static func readCredentials(_ node: YAMLNode, _ r: inout NodeReader) -> AWSSigV4Signer.CredentialSource? {
        var file: String?
        var profile = "default"
        var keyID: String?
        var secret: Secret?
        var token: Secret?
        let known = ["file", "profile", "access_key_id", "secret_access_key", "session_token"]
        r.entries(node, in: "aws_sigv4.credentials", known: known) { r, key, value in
            switch key {
            case "file":
                if let text = value.scalar?.string, !text.isEmpty {
                    file = r.pathOrReference(text, at: value)
                } else {
                    r.fail(value, "file must be the path of an AWS shared credentials file")
                }
            case "profile": profile = value.scalar?.string ?? profile
            case "access_key_id": keyID = r.secretOrString(value, what: key)
            case "secret_access_key": secret = r.secret(value, what: key)
            default: token = r.secret(value, what: key)
            }
        }
        if let file {
            guard keyID == nil, secret == nil, token == nil else {
                r.fail(node, "aws_sigv4 credentials are either a file (with a profile) or keys, not both")
                return nil
            }
            let source = AWSCredentialsFile(path: file, profile: profile)
            if case .failure(let problem) = source.current() {
                r.fail(node, "aws_sigv4 credentials: \(problem)")
                return nil
            }
            return .file(source)
        }
        guard let keyID, let secret else {
            r.fail(node, "aws_sigv4 credentials need access_key_id and secret_access_key (or file and profile)")
            return nil
        }
        return .fixed(AWSCredentials(accessKeyID: keyID, secret: secret, sessionToken: token))
    }

    /// The default: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN` of
    /// Sluice's own environment, read when the configuration is (a reload reads them again).
    private static func environmentCredentials(at node: YAMLNode, _ r: inout NodeReader) -> AWSSigV4Signer.CredentialSource? {
        // As a `${NAME}` reference resolves: unset or empty is none.
        func variable(_ name: String) -> Secret? { try? SecretReference.resolve("${\(name)}").get() }
        guard let keyID = variable("AWS_ACCESS_KEY_ID")?.value, let secretValue = variable("AWS_SECRET_ACCESS_KEY") else {
            r.fail(
                node,
                "aws_sigv4 has no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in Sluice's environment, "
                    + "or credentials: { file, profile } or { access_key_id, secret_access_key }")
            return nil
        }
        r.secrets.append(secretValue)
        let token = variable("AWS_SESSION_TOKEN")
        if let token { r.secrets.append(token) }
        return .environment(AWSCredentials(accessKeyID: keyID, secret: secretValue, sessionToken: token))
    }

    static func describe(_ a: AWSSigV4Signer) -> String {
        let credentials: String
        switch a.credentials {
        case .environment(let c): credentials = "environment (key \(c.accessKeyID), secret \(c.secret))"
        case .fixed(let c): credentials = "key \(c.accessKeyID), secret \(c.secret) (\(c.secret.source))"
        case .file(let f): credentials = "file \(f.path), profile \(f.profile)"
        }
        return "service \(a.service), region \(a.region), payload \(a.payload.rawValue), credentials \(credentials), "
            + "excludes \(a.excludedHeaders.sorted().joined(separator: ", "))"
    }
}

/// One set of AWS credentials.
struct AWSCredentials: Sendable {
    var accessKeyID: String
    var secret: Secret
    var sessionToken: Secret?
}

/// A profile of the AWS shared credentials file (INI: `[profile]`, `aws_access_key_id`,
/// `aws_secret_access_key`, `aws_session_token`), read again when the file changes (its
/// inode, size or modification time), looked at no more than once a second.
///
/// Threading: any worker; the cache is behind a mutex (held for a `stat`, at most once a second).
final class AWSCredentialsFile: Sendable {
    let path: String
    let profile: String
    private struct Cache {
        var credentials: Result<AWSCredentials, AWSCredentialsFile.Problem>?
        var identity: [Int] = []
        var checkedAt = Int.min
    }
    struct Problem: Error, CustomStringConvertible {
        let description: String
    }
    private let cache = Mutex(Cache())

    init(path: String, profile: String) {
        self.path = path
        self.profile = profile
    }

    func current() -> Result<AWSCredentials, Problem> {
        let now = MonotonicClock.milliseconds()
        return cache.withLock { cache in
            if let known = cache.credentials, now - cache.checkedAt < 1000 { return known }
            cache.checkedAt = now
            var st = stat()
            guard stat(path, &st) == 0 else {
                cache.identity = []
                let result = Result<AWSCredentials, Problem>.failure(Problem(description: "cannot read \(path)"))
                cache.credentials = result
                return result
            }
            let identity = [Int(st.st_ino), Int(st.st_size), st.st_mtim.tv_sec, st.st_mtim.tv_nsec]
            if let known = cache.credentials, identity == cache.identity { return known }
            cache.identity = identity
            let result = read()
            cache.credentials = result
            return result
        }
    }

    private func read() -> Result<AWSCredentials, Problem> {
        guard let data = FileContents.bytes(atPath: path, limit: .max) else {
            return .failure(Problem(description: "cannot read \(path)"))
        }
        guard data.count <= 1 << 20 else { return .failure(Problem(description: "\(path) is larger than 1 MiB")) }
        var section = ""
        var values: [String: String] = [:]
        for raw in String(decoding: data, as: UTF8.self).split(whereSeparator: { $0 == "\n" || $0 == "\r" }) {
            let line = String(raw).trimmingWhitespace()
            if line.isEmpty || line.hasPrefix("#") || line.hasPrefix(";") { continue }
            if line.hasPrefix("["), line.hasSuffix("]") {
                section = String(line.dropFirst().dropLast()).trimmingWhitespace()
                continue
            }
            guard section == profile, let equals = line.firstIndex(of: "=") else { continue }
            let key = String(line[..<equals]).trimmingWhitespace().lowercased()
            values[key] = String(line[line.index(after: equals)...]).trimmingWhitespace()
        }
        guard let keyID = values["aws_access_key_id"], let secret = values["aws_secret_access_key"] else {
            return .failure(
                Problem(description: "profile \(profile) of \(path) has no aws_access_key_id and aws_secret_access_key"))
        }
        let token = values["aws_session_token"].map { Secret($0, source: "file:\(path)") }
        return .success(
            AWSCredentials(accessKeyID: keyID, secret: Secret(secret, source: "file:\(path)"), sessionToken: token))
    }
}

/// The `aws_sigv4` adapter: on every try, the canonical request of the request as it is sent
/// (`AWSSignatureV4`), signed with a key derived for the day, region and service; sets
/// `X-Amz-Date`, `X-Amz-Content-SHA256`, `X-Amz-Security-Token` (with a session token) and
/// `Authorization`, replacing any the client sent.
struct AWSSigV4Signer: EveryTryAdapter {
    enum Payload: String, Sendable {
        /// The body's SHA-256 (the body is read whole first, up to `max_body`).
        case signed
        /// `UNSIGNED-PAYLOAD`: the body streams (S3 accepts it).
        case unsigned
    }

    enum CredentialSource: Sendable {
        case environment(AWSCredentials)
        case fixed(AWSCredentials)
        case file(AWSCredentialsFile)
    }

    /// Envoy's (fields a proxy or a retry is likely to change), and `user-agent`, which the AWS
    /// SDKs never sign: a verifier built on one (botocore, hence moto and LocalStack) leaves it
    /// out of the canonical request even when `SignedHeaders` names it.
    static let defaultExcludedHeaders: Set<String> = [
        "x-forwarded-for", "x-forwarded-proto", "x-amzn-trace-id", "user-agent",
    ]

    var name: String { "aws_sigv4" }
    var readsBody: Bool { payload == .signed }
    let service: String
    let region: String
    let credentials: CredentialSource
    let payload: Payload
    let excludedHeaders: Set<String>

    /// The day's signing key, derived once per day and key (four HMACs) instead of per try.
    let keys = SigningKeys()

    /// Threading: any worker; one lock, held to read or replace the key.
    final class SigningKeys: Sendable {
        private struct Key: Sendable {
            let day: String
            let accessKeyID: String
            let secret: String
            let key: Crypto.HMACKey
        }
        private let current = Mutex<Key?>(nil)

        func key(day: String, _ credentials: AWSCredentials, region: String, service: String) -> Crypto.HMACKey {
            if let known = current.withLock({ $0 }), known.day == day, known.accessKeyID == credentials.accessKeyID,
                known.secret == credentials.secret.value
            {
                return known.key
            }
            let key = AWSSignatureV4.signingKey(secret: credentials.secret.value, day: day, region: region, service: service)
            current.withLock {
                $0 = Key(day: day, accessKeyID: credentials.accessKeyID, secret: credentials.secret.value, key: key)
            }
            return key
        }
    }

    /// The fields the signer sets (a client's are replaced).
    private static let amzDate = HTTPField.Name("X-Amz-Date")!
    private static let amzContentSHA256 = HTTPField.Name("X-Amz-Content-SHA256")!
    private static let amzSecurityToken = HTTPField.Name("X-Amz-Security-Token")!
    /// SHA-256 of no bytes: a request without a body.
    private static let emptyPayloadHash = Hex.lowercase(Crypto.sha256([]))

    func adaptTry(_ request: inout ProxyRequest, _ context: TryContext) throws(AdaptationError) {
        let credentials: AWSCredentials
        switch self.credentials {
        case .environment(let c), .fixed(let c): credentials = c
        case .file(let file):
            switch file.current() {
            case .success(let c): credentials = c
            case .failure(let problem): throw AdaptationError(adapter: name, reason: "credentials: \(problem)")
            }
        }
        request.headerFields[.authorization] = nil
        request.headerFields[Self.amzSecurityToken] = nil
        let date = AWSSignatureV4.timestamp(wallClockMilliseconds: context.wallClockMilliseconds)
        let payloadHash: String
        switch payload {
        case .signed:
            if let body = context.body, !body.isEmpty {
                payloadHash = Hex.lowercase(Crypto.sha256(body))
            } else {
                payloadHash = Self.emptyPayloadHash
            }
        case .unsigned: payloadHash = "UNSIGNED-PAYLOAD"
        }
        request.headerFields[Self.amzDate] = date
        request.headerFields[Self.amzContentSHA256] = payloadHash
        if let token = credentials.sessionToken { request.headerFields[Self.amzSecurityToken] = token.value }
        let url = AWSSignatureV4.URLComponents(request.url)
        var headers: [(String, String)] = [("host", url.host)]
        for field in request.headerFields where !excludedHeaders.contains(field.name.canonicalName) {
            headers.append((field.name.canonicalName, field.value))
        }
        let signer = AWSSignatureV4(
            accessKeyID: credentials.accessKeyID, secret: credentials.secret.value, region: region, service: service)
        let signed = signer.sign(
            method: request.method, path: url.path, query: url.query, headers: headers, payloadHash: payloadHash,
            timestamp: date, normalizePath: service != "s3", encodePath: service != "s3",
            key: keys.key(day: String(date.prefix(8)), credentials, region: region, service: service))
        request.headerFields[.authorization] = signed.authorization
    }
}

/// AWS Signature Version 4 (the published algorithm; verified against aws-c-auth's test suite
/// in `AWSSigV4Tests`): the canonical request, the string to sign, the signing key and the
/// `Authorization` value. Pure: no clock, no I/O.
struct AWSSignatureV4: Sendable {
    let accessKeyID: String
    let secret: String
    let region: String
    let service: String

    struct Signed {
        let canonicalRequest: String
        let stringToSign: String
        let signature: String
        let signedHeaders: String
        let authorization: String
    }

    /// The parts of an absolute URL a signature covers: `host` as the `Host` field carries it
    /// (lower case, the port only when it is not the scheme's default), and the path and query
    /// as sent.
    struct URLComponents {
        var host: String
        var path: Substring
        var query: Substring

        init(_ url: String) {
            let parts = URLParts(url)
            let https = parts.scheme.lowercased() == "https"
            var authority = Substring(parts.authority.lowercased())
            if let at = authority.lastIndex(of: "@") { authority = authority[authority.index(after: at)...] }
            if let colon = authority.lastIndex(of: ":"), !authority.hasSuffix("]") {
                let port = authority[authority.index(after: colon)...]
                if port == (https ? "443" : "80") || port.isEmpty { authority = authority[..<colon] }
            }
            host = String(authority)
            var rest = parts.pathAndQuery
            if let hash = rest.firstIndex(of: "#") { rest = rest[..<hash] }
            if let q = rest.firstIndex(of: "?") {
                path = rest[..<q]
                query = rest[rest.index(after: q)...]
            } else {
                path = rest
                query = ""
            }
            if path.isEmpty { path = "/" }
        }
    }

    /// `YYYYMMDD'T'HHMMSS'Z'` (UTC).
    static func timestamp(wallClockMilliseconds ms: Int) -> String {
        var seconds = time_t(ms / 1000)
        var t = tm()
        gmtime_r(&seconds, &t)
        func two(_ n: Int32) -> String { n < 10 ? "0\(n)" : "\(n)" }
        return "\(t.tm_year + 1900)\(two(t.tm_mon + 1))\(two(t.tm_mday))T\(two(t.tm_hour))\(two(t.tm_min))\(two(t.tm_sec))Z"
    }

    /// Signs a request. `headers`: lower-case names with their values, in the message's order
    /// (several with one name are joined with `,`); `host` among them. `normalizePath`: remove
    /// dot segments and empty segments (every service but S3); `encodePath`: percent-encode the
    /// path once more (every service but S3, whose path is signed as sent). `key`: the day's
    /// signing key when the caller keeps it (`SigningKeys`), else it is derived here.
    func sign(
        method: String, path: Substring, query: Substring, headers: [(String, String)], payloadHash: String,
        timestamp: String, normalizePath: Bool, encodePath: Bool, key: Crypto.HMACKey? = nil
    ) -> Signed {
        var canonicalPath = String(path)
        if normalizePath { canonicalPath = Self.removeDotSegments(canonicalPath) }
        if encodePath { canonicalPath = Self.percentEncode(canonicalPath, keepSlash: true) }
        // Sorted by name, the message's order kept among equal names (then joined with `,`).
        let order = headers.indices.sorted {
            headers[$0].0 == headers[$1].0 ? $0 < $1 : headers[$0].0 < headers[$1].0
        }
        var canonical: [UInt8] = []
        canonical.reserveCapacity(512)
        canonical += method.utf8
        canonical.append(0x0A)
        canonical += canonicalPath.utf8
        canonical.append(0x0A)
        canonical += Self.canonicalQuery(query).utf8
        canonical.append(0x0A)
        var signedHeaders: [UInt8] = []
        var previous: String?
        for i in order {
            let (name, value) = headers[i]
            if name == previous {
                canonical[canonical.count - 1] = UInt8(ascii: ",")
            } else {
                if previous != nil { signedHeaders.append(UInt8(ascii: ";")) }
                signedHeaders += name.utf8
                canonical += name.utf8
                canonical.append(UInt8(ascii: ":"))
                previous = name
            }
            Self.appendTrimmedAndCollapsed(value, to: &canonical)
            canonical.append(0x0A)
        }
        canonical.append(0x0A)
        canonical += signedHeaders
        canonical.append(0x0A)
        canonical += payloadHash.utf8
        let day = timestamp.prefix(8)
        let scope = "\(day)/\(region)/\(service)/aws4_request"
        let stringToSign = "AWS4-HMAC-SHA256\n\(timestamp)\n\(scope)\n" + Hex.lowercase(Crypto.sha256(canonical))
        let signingKey = key ?? Self.signingKey(secret: secret, day: String(day), region: region, service: service)
        let signature = Hex.lowercase(signingKey.mac(Array(stringToSign.utf8)))
        let signed = String(decoding: signedHeaders, as: UTF8.self)
        return Signed(
            canonicalRequest: String(decoding: canonical, as: UTF8.self), stringToSign: stringToSign,
            signature: signature, signedHeaders: signed,
            authorization: "AWS4-HMAC-SHA256 Credential=\(accessKeyID)/\(scope), SignedHeaders=\(signed), Signature=\(signature)")
    }

    /// The signing key of a day (`YYYYMMDD`): HMACs of the date, region, service and
    /// `aws4_request` under `AWS4` + the secret.
    static func signingKey(secret: String, day: String, region: String, service: String) -> Crypto.HMACKey {
        var key = Crypto.hmacSHA256(key: Array("AWS4\(secret)".utf8), Array(day.utf8))
        key = Crypto.hmacSHA256(key: key, Array(region.utf8))
        key = Crypto.hmacSHA256(key: key, Array(service.utf8))
        key = Crypto.hmacSHA256(key: key, Array("aws4_request".utf8))
        return Crypto.HMACKey(key)
    }

    /// The query's parameters, each name and value percent-encoded (an escape already there is
    /// kept, with upper-case digits; `+` is a plus sign), sorted by name, then value.
    static func canonicalQuery(_ query: Substring) -> String {
        guard !query.isEmpty else { return "" }
        var pairs: [(String, String)] = []
        for parameter in query.split(separator: "&", omittingEmptySubsequences: true) {
            if let equals = parameter.firstIndex(of: "=") {
                pairs.append(
                    (
                        percentEncode(parameter[..<equals], keepSlash: false, keepEscapes: true),
                        percentEncode(parameter[parameter.index(after: equals)...], keepSlash: false, keepEscapes: true)
                    ))
            } else {
                pairs.append((percentEncode(parameter, keepSlash: false, keepEscapes: true), ""))
            }
        }
        pairs.sort {
            $0.0 == $1.0
                ? Array($0.1.utf8).lexicographicallyPrecedes(Array($1.1.utf8))
                : Array($0.0.utf8).lexicographicallyPrecedes(Array($1.0.utf8))
        }
        return pairs.map { "\($0.0)=\($0.1)" }.joined(separator: "&")
    }

    /// Every byte but the unreserved ones (`A-Z a-z 0-9 - . _ ~`, and `/` when `keepSlash`) as
    /// `%XX`; with `keepEscapes`, a `%XX` already there stays (its digits upper-cased).
    static func percentEncode(_ text: some StringProtocol, keepSlash: Bool, keepEscapes: Bool = false) -> String {
        let hex = Array("0123456789ABCDEF".utf8)
        let bytes = Array(text.utf8)
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        var i = 0
        while i < bytes.count {
            let b = bytes[i]
            switch b {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"),
                UInt8(ascii: "~"):
                out.append(b)
            case UInt8(ascii: "/") where keepSlash:
                out.append(b)
            case UInt8(ascii: "%") where keepEscapes && i + 2 < bytes.count && isHex(bytes[i + 1]) && isHex(bytes[i + 2]):
                out += [b, upper(bytes[i + 1]), upper(bytes[i + 2])]
                i += 2
            default:
                out += [UInt8(ascii: "%"), hex[Int(b >> 4)], hex[Int(b & 15)]]
            }
            i += 1
        }
        return String(decoding: out, as: UTF8.self)
    }

    private static func isHex(_ b: UInt8) -> Bool {
        (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(b) || (UInt8(ascii: "a")...UInt8(ascii: "f")).contains(b)
            || (UInt8(ascii: "A")...UInt8(ascii: "F")).contains(b)
    }

    private static func upper(_ b: UInt8) -> UInt8 {
        (UInt8(ascii: "a")...UInt8(ascii: "f")).contains(b) ? b - 32 : b
    }

    /// RFC 3986 §5.2.4 on the path, with empty segments removed as well (`//` is `/`); a
    /// trailing slash is kept.
    static func removeDotSegments(_ path: String) -> String {
        var out: [Substring] = []
        let segments = path.split(separator: "/", omittingEmptySubsequences: true)
        for segment in segments {
            if segment == "." { continue }
            if segment == ".." {
                if !out.isEmpty { out.removeLast() }
                continue
            }
            out.append(segment)
        }
        var result = "/" + out.joined(separator: "/")
        let last = segments.last
        if path.hasSuffix("/") || last == "." || last == "..", !out.isEmpty { result += "/" }
        return result
    }

    /// A field value as the canonical request has it: without leading and trailing white
    /// space, every run of spaces inside it one space.
    static func appendTrimmedAndCollapsed(_ value: String, to out: inout [UInt8]) {
        var pendingSpace = false
        var started = false
        for b in value.utf8 {
            if b == 0x20 || b == 0x09 || b == 0x0A || b == 0x0D {
                pendingSpace = started
                continue
            }
            if pendingSpace { out.append(0x20) }
            pendingSpace = false
            started = true
            out.append(b)
        }
    }
}
