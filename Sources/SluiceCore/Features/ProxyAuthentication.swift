import CCrypt
import COpenSSL

#if canImport(Glibc)
    import Glibc
#endif

/// `access.proxy_auth: { basic: { users_file: PATH } }` (docs/configuration.md, "Proxy
/// authentication"): the users a forward-proxy client may authenticate as, read from an
/// htpasswd-style file of `user:hash` lines. Only slow, salted hashes are accepted — bcrypt
/// (`$2b$`, `$2y$`, `$2a$`, as `htpasswd -B` writes) and SHA-256 crypt (`$5$`, as `openssl
/// passwd -5` writes); anything else (plain text, `$apr1$` MD5, `$1$`, `{SHA}`, DES) is
/// refused at load with the file's line, so a weak hash never goes live.
///
/// Threading: an immutable value, shared by every worker through the pipeline snapshot.
public struct ProxyAuthentication: Sendable {
    /// The realm of `Proxy-Authenticate: Basic realm="sluice"`.
    public static let realm = "sluice"
    public let usersFile: String
    /// User name → crypt(3) hash string.
    public let users: [String: String]

    public init(usersFile: String, users: [String: String]) {
        self.usersFile = usersFile
        self.users = users
    }

    /// One problem in a users file, at its line and column (1-based).
    public struct FileIssue: Sendable, Equatable {
        public var line: Int
        public var column: Int
        public var message: String
    }

    /// Every problem of one users file (line 0: the file could not be read).
    public struct FileError: Error, Sendable, Equatable {
        public var issues: [FileIssue]
    }

    /// Reads the users file at `path`: every problem of the file, or a table.
    public static func load(path: String) -> Result<ProxyAuthentication, FileError> {
        guard let text = readFile(path) else {
            return .failure(
                FileError(issues: [
                    FileIssue(line: 0, column: 0, message: "cannot read \(path): \(String(cString: strerror(errno)))")
                ]))
        }
        return parse(text, usersFile: path)
    }

    /// Parses `user:hash` lines; blank lines and lines starting with `#` are skipped.
    public static func parse(_ text: String, usersFile: String) -> Result<ProxyAuthentication, FileError> {
        var users: [String: String] = [:]
        var issues: [FileIssue] = []
        // "\r\n" is one Character in Swift: both line ends are separators.
        let lines = text.split(omittingEmptySubsequences: false, whereSeparator: { $0 == "\n" || $0 == "\r\n" })
        for (index, raw) in lines.enumerated() {
            let line = index + 1
            var entry = Substring(raw)
            if entry.hasSuffix("\r") { entry = entry.dropLast() }
            if entry.allSatisfy({ $0 == " " || $0 == "\t" }) || entry.hasPrefix("#") { continue }
            guard let colon = entry.firstIndex(of: ":") else {
                issues.append(FileIssue(line: line, column: 1, message: "expected user:hash"))
                continue
            }
            let user = String(entry[..<colon])
            let hash = String(entry[entry.index(after: colon)...])
            let hashColumn = user.count + 2
            if user.isEmpty || !user.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) {
                issues.append(
                    FileIssue(
                        line: line, column: 1,
                        message: "user names must be visible ASCII without spaces or ':'"))
                continue
            }
            if let problem = hashProblem(hash) {
                issues.append(FileIssue(line: line, column: hashColumn, message: "user \(user): \(problem)"))
                continue
            }
            if users[user] != nil {
                issues.append(FileIssue(line: line, column: 1, message: "user \(user) is listed twice"))
                continue
            }
            users[user] = hash
        }
        if issues.isEmpty && users.isEmpty {
            issues.append(FileIssue(line: 1, column: 1, message: "the users file has no users"))
        }
        return issues.isEmpty
            ? .success(ProxyAuthentication(usersFile: usersFile, users: users)) : .failure(FileError(issues: issues))
    }

    /// Why `hash` is not a bcrypt or SHA-256 crypt hash, or nil. Structure only: a hash is
    /// never computed at load (bcrypt costs milliseconds, a file may have thousands of users).
    static func hashProblem(_ hash: String) -> String? {
        let unsupported = "use bcrypt (htpasswd -B) or SHA-256 crypt (openssl passwd -5)"
        let b64 = Set("./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
        let bytes = Array(hash.utf8)
        if hash.hasPrefix("$2a$") || hash.hasPrefix("$2b$") || hash.hasPrefix("$2y$") {
            // $2b$NN$ + 22 salt + 31 hash characters.
            guard bytes.count == 60, bytes[6] == UInt8(ascii: "$"), let cost = Int(String(hash.dropFirst(4).prefix(2))),
                (4...31).contains(cost), hash.dropFirst(7).allSatisfy(b64.contains)
            else {
                return "malformed bcrypt hash (expected $2b$NN$ and 53 characters)"
            }
            return nil
        }
        if hash.hasPrefix("$5$") {
            var parts = hash.dropFirst(3).split(separator: "$", omittingEmptySubsequences: false)
            if parts.first?.hasPrefix("rounds=") == true {
                guard let n = Int(parts[0].dropFirst(7)), n >= 1000 else { return "malformed SHA-256 crypt rounds" }
                parts.removeFirst()
            }
            guard parts.count == 2, (1...16).contains(parts[0].count), parts[1].count == 43,
                parts.allSatisfy({ $0.allSatisfy(b64.contains) })
            else {
                return "malformed SHA-256 crypt hash (expected $5$salt$ and 43 characters)"
            }
            return nil
        }
        if hash.hasPrefix("$apr1$") || hash.hasPrefix("$1$") { return "MD5 crypt is not accepted; \(unsupported)" }
        if hash.hasPrefix("$6$") { return "SHA-512 crypt is not accepted; \(unsupported)" }
        if hash.hasPrefix("{SHA}") { return "unsalted SHA-1 is not accepted; \(unsupported)" }
        if hash.hasPrefix("$") { return "unknown hash scheme; \(unsupported)" }
        if bytes.count == 13 && hash.allSatisfy(b64.contains) { return "DES crypt is not accepted; \(unsupported)" }
        return "not a hash (plain-text passwords are not accepted); \(unsupported)"
    }

    private static func readFile(_ path: String) -> String? {
        FileContents.bytes(atPath: path).map { String(decoding: $0, as: UTF8.self) }
    }
}

/// Checks `Proxy-Authorization` values against a `ProxyAuthentication` table on one worker.
///
/// bcrypt costs milliseconds of CPU per check, and it runs on the event loop, where it delays
/// every other client of the worker. So a hash is computed only when a credential is new:
/// - verified credentials are cached, keyed by the SHA-256 of the header value (the value
///   itself is never kept), up to `cacheLimit` entries;
/// - rejected credentials are cached the same way, so repeating a wrong password costs a
///   SHA-256, not a bcrypt;
/// - hashing is budgeted: at most `budgetMilliseconds` of crypt time per second per worker
///   (a token bucket). A new credential that arrives with the budget spent is answered `407`
///   without a check (`Verdict.busy`), so a flood of distinct wrong passwords costs a worker at
///   most that share of its loop, and clients whose credentials are cached go on unaffected.
/// A cache that reaches its limit is emptied (a new users file empties both: a new verifier is
/// made for each pipeline snapshot). An unknown user is checked against another user's hash,
/// so its answer takes as long as a wrong password's (no user enumeration by timing).
///
/// Threading: confined to its worker's event-loop thread (one per worker and snapshot).
public final class ProxyAuthVerifier {
    /// Entries in each cache (verified, rejected) before it is emptied: `4096`.
    public static let cacheLimit = 4096
    /// Crypt time per second a worker may spend on new credentials: `200` ms (a fifth of its loop).
    public static let budgetMilliseconds = 200

    public enum Verdict: Equatable, Sendable {
        case user(String)
        /// No `Proxy-Authorization`, or not `Basic`.
        case missing
        /// Unknown user or wrong password (not said which).
        case invalid
        /// A new credential arrived with the hashing budget spent; not checked.
        case busy
    }

    /// A SHA-256 digest as a dictionary key.
    struct Digest: Hashable {
        var a: UInt64, b: UInt64, c: UInt64, d: UInt64
    }

    public let authentication: ProxyAuthentication
    private var verified: [Digest: String] = [:]
    private var rejected: Set<Digest> = []
    private let cryptData: UnsafeMutablePointer<crypt_data>
    /// Budget left (ms of crypt time) and when it was last refilled.
    private var budget: Int
    private var refilledAt: Int
    private let budgetLimit: Int
    private let clock: () -> Int
    /// The hash an unknown user is checked against (any user's: same scheme and cost).
    private let decoyHash: String?
    /// Hashes computed so far (for tests and the budget's proof).
    public private(set) var hashesComputed = 0

    public init(
        _ authentication: ProxyAuthentication, budgetMilliseconds: Int = ProxyAuthVerifier.budgetMilliseconds,
        clock: @escaping () -> Int = MonotonicClock.milliseconds
    ) {
        self.authentication = authentication
        cryptData = .allocate(capacity: 1)
        memset(cryptData, 0, MemoryLayout<crypt_data>.size)
        budgetLimit = budgetMilliseconds
        budget = budgetMilliseconds
        self.clock = clock
        refilledAt = clock()
        decoyHash = authentication.users.values.max { $0.count < $1.count }
    }

    deinit {
        memset(cryptData, 0, MemoryLayout<crypt_data>.size)  // it held a password
        cryptData.deallocate()
    }

    /// The verdict for a `Proxy-Authorization` field value (nil: the field is absent).
    public func verify(_ value: UnsafeRawBufferPointer?) -> Verdict {
        guard let value, let credentials = Self.basicCredentials(value) else { return .missing }
        let key = Self.digest(value)
        if let user = verified[key] { return .user(user) }
        if rejected.contains(key) { return .invalid }
        refill()
        guard budget > 0 else { return .busy }
        let started = clock()
        let verdict = check(user: credentials.user, password: credentials.password)
        budget -= max(1, clock() - started)
        switch verdict {
        case .user(let user):
            if verified.count >= Self.cacheLimit { verified.removeAll(keepingCapacity: true) }
            verified[key] = user
        default:
            if rejected.count >= Self.cacheLimit { rejected.removeAll(keepingCapacity: true) }
            rejected.insert(key)
        }
        return verdict
    }

    /// Whether `a` and `b` hold the same bytes, compared in constant time (CRYPTO_memcmp): a
    /// connection's accepted credential against the one a later request carries.
    public static func sameCredential(_ a: [UInt8], _ b: UnsafeRawBufferPointer) -> Bool {
        a.count == b.count && a.withUnsafeBytes { CRYPTO_memcmp($0.baseAddress, b.baseAddress, b.count) } == 0
    }

    private func refill() {
        let now = clock()
        let elapsed = now - refilledAt
        guard elapsed > 0 else { return }
        budget = min(budgetLimit, budget + elapsed * budgetLimit / 1000)
        refilledAt = now
    }

    private func check(user: [UInt8], password: [UInt8]) -> Verdict {
        let name = String(decoding: user, as: UTF8.self)
        let stored = authentication.users[name]
        guard let hash = stored ?? decoyHash else { return .invalid }
        let matches = Self.crypt(password: password, hash: hash, data: cryptData)
        hashesComputed += 1
        return matches && stored != nil ? .user(name) : .invalid
    }

    /// Whether crypt(3) of `password` with `hash`'s setting reproduces `hash`, compared in
    /// constant time (CRYPTO_memcmp).
    static func crypt(password: [UInt8], hash: String, data: UnsafeMutablePointer<crypt_data>) -> Bool {
        guard !password.contains(0) else { return false }
        var phrase = password.map { CChar(bitPattern: $0) }
        phrase.append(0)
        defer { for i in phrase.indices { phrase[i] = 0 } }
        guard let out = crypt_r(phrase, hash, data) else { return false }
        let expected = Array(hash.utf8)
        let length = strlen(out)
        guard length == expected.count, out.pointee != CChar(UInt8(ascii: "*")) else { return false }
        return expected.withUnsafeBytes { CRYPTO_memcmp(out, $0.baseAddress, length) } == 0
    }

    /// `Basic base64(user:password)` (RFC 7617; the scheme is case-insensitive).
    static func basicCredentials(_ value: UnsafeRawBufferPointer) -> (user: [UInt8], password: [UInt8])? {
        var bytes = value[...]
        while let first = bytes.first, first == 0x20 || first == 0x09 { bytes = bytes.dropFirst() }
        while let last = bytes.last, last == 0x20 || last == 0x09 { bytes = bytes.dropLast() }
        let scheme = Array("basic ".utf8)
        guard bytes.count > scheme.count,
            zip(bytes.prefix(scheme.count), scheme).allSatisfy({ ($0 >= 65 && $0 <= 90 ? $0 | 0x20 : $0) == $1 })
        else { return nil }
        var token = bytes.dropFirst(scheme.count)
        while let first = token.first, first == 0x20 { token = token.dropFirst() }
        guard let decoded = Base64.decode(String(decoding: token, as: UTF8.self)),
            let colon = decoded.firstIndex(of: UInt8(ascii: ":"))
        else { return nil }
        return (Array(decoded[..<colon]), Array(decoded[(colon + 1)...]))
    }

    static func digest(_ value: UnsafeRawBufferPointer) -> Digest {
        let out = Crypto.sha256(value)
        return out.withUnsafeBytes {
            Digest(
                a: $0.loadUnaligned(fromByteOffset: 0, as: UInt64.self), b: $0.loadUnaligned(fromByteOffset: 8, as: UInt64.self),
                c: $0.loadUnaligned(fromByteOffset: 16, as: UInt64.self), d: $0.loadUnaligned(fromByteOffset: 24, as: UInt64.self)
            )
        }
    }
}
