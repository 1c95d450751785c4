import Testing

@testable import SluiceCore

/// `access.proxy_auth`'s users file (located errors for every refused line) and the
/// per-worker verifier: bcrypt and SHA-256 crypt, the caches, and the hashing budget.
@Suite struct ProxyAuthenticationTests {
    /// `bcrypt.hashpw(b"correct horse", gensalt(4))` and `openssl passwd -5 -salt saltsalt 'battery staple'`.
    static let bcryptHash = "$2b$04$CH3NlT4itbyf5xSsaGxykOjq92HnjgLapztqViljcfXEx1WRh44fG"
    static let sha256Hash = "$5$saltsalt$/B/a8TyziOAL7A5QHAhQtwjk3lO8brshalLojtxVb.8"

    static func table() -> ProxyAuthentication {
        let text =
            "# users\nalice:\(bcryptHash)\n\nbob:\(sha256Hash)\r\ncarol:\(bcryptHash.replacingOccurrences(of: "$2b$", with: "$2y$"))\n"
        guard case .success(let auth) = ProxyAuthentication.parse(text, usersFile: "/u") else {
            Issue.record("the users file did not parse")
            return ProxyAuthentication(usersFile: "/u", users: [:])
        }
        return auth
    }

    static func header(_ user: String, _ password: String, scheme: String = "Basic") -> [UInt8] {
        Array("\(scheme) \(Base64.encode(Array("\(user):\(password)".utf8)))".utf8)
    }

    func verify(_ v: ProxyAuthVerifier, _ value: [UInt8]?) -> ProxyAuthVerifier.Verdict {
        guard let value else { return v.verify(nil) }
        return value.withUnsafeBytes { v.verify($0) }
    }

    @Test func parsesUsersCommentsBlankLinesAndCRLF() {
        let auth = Self.table()
        #expect(auth.users.keys.sorted() == ["alice", "bob", "carol"])
        #expect(auth.users["bob"] == Self.sha256Hash)
    }

    @Test(arguments: [
        ("alice:plaintext", 1, 7, "plain-text"),
        ("alice:$apr1$abcdefgh$82JubPF2dQkt1tVfvLnXS.", 1, 7, "MD5"),
        ("alice:$1$ab$e2KlfqG5YBMTjSz7XF.Eu1", 1, 7, "MD5"),
        ("alice:abJnggxhB/yWI", 1, 7, "DES"),
        ("alice:{SHA}qUqP5cyxm6YcTAhz05Hph5gvu9M=", 1, 7, "SHA-1"),
        ("alice:$6$salt$abc", 1, 7, "SHA-512"),
        ("alice:$2b$04$tooshort", 1, 7, "malformed bcrypt"),
        ("alice:$5$salt$short", 1, 7, "malformed SHA-256"),
        ("# c\nno colon here", 2, 1, "expected user:hash"),
        ("bad user:\(bcryptHash)", 1, 1, "visible ASCII"),
        ("alice:\(bcryptHash)\nalice:\(sha256Hash)", 2, 1, "listed twice"),
        ("# only a comment\n", 1, 1, "no users"),
    ])
    func refusesWithTheLine(text: String, line: Int, column: Int, phrase: String) {
        guard case .failure(let error) = ProxyAuthentication.parse(text, usersFile: "/u") else {
            Issue.record("accepted: \(text)")
            return
        }
        #expect(error.issues.count == 1)
        #expect(error.issues.first?.line == line)
        #expect(error.issues.first?.column == column)
        #expect(error.issues.first?.message.contains(phrase) == true, "\(error.issues)")
    }

    @Test func everyBadLineIsReported() {
        guard case .failure(let error) = ProxyAuthentication.parse("a:x\nb:\(Self.bcryptHash)\nc:y\n", usersFile: "/u") else {
            Issue.record("accepted")
            return
        }
        #expect(error.issues.map(\.line) == [1, 3])
    }

    @Test func missingFileIsLineZero() {
        guard case .failure(let error) = ProxyAuthentication.load(path: "/nonexistent/users") else {
            Issue.record("a missing file loaded")
            return
        }
        #expect(error.issues.first?.line == 0)
    }

    @Test func verifiesBcryptAndSHA256Crypt() {
        let v = ProxyAuthVerifier(Self.table())
        #expect(verify(v, Self.header("alice", "correct horse")) == .user("alice"))
        #expect(verify(v, Self.header("carol", "correct horse")) == .user("carol"))  // $2y$
        #expect(verify(v, Self.header("bob", "battery staple")) == .user("bob"))
        #expect(verify(v, Self.header("bob", "battery stapl")) == .invalid)
        #expect(verify(v, Self.header("alice", "correct horsE")) == .invalid)
        #expect(verify(v, Self.header("mallory", "correct horse")) == .invalid)
        #expect(verify(v, Self.header("alice", "correct horse", scheme: "bAsIc")) == .user("alice"))
    }

    @Test func missingOrOtherSchemesAreMissing() {
        let v = ProxyAuthVerifier(Self.table())
        #expect(verify(v, nil) == .missing)
        #expect(verify(v, Array("Bearer abc".utf8)) == .missing)
        #expect(verify(v, Array("Basic !!!".utf8)) == .missing)
        #expect(verify(v, Array("Basic \(Base64.encode(Array("nocolon".utf8)))".utf8)) == .missing)
        #expect(v.hashesComputed == 0)
    }

    @Test func anUnknownUserCostsAHashToo() {
        let v = ProxyAuthVerifier(Self.table())
        _ = verify(v, Self.header("mallory", "x"))
        #expect(v.hashesComputed == 1)
    }

    @Test func acceptedAndRejectedCredentialsAreHashedOnce() {
        let v = ProxyAuthVerifier(Self.table())
        for _ in 0..<5 {
            #expect(verify(v, Self.header("alice", "correct horse")) == .user("alice"))
            #expect(verify(v, Self.header("alice", "wrong")) == .invalid)
        }
        #expect(v.hashesComputed == 2)
    }

    @Test func spentBudgetAnswersBusyButCachedCredentialsPass() {
        final class Clock: @unchecked Sendable { var now = 0 }
        let clock = Clock()
        // Every hash "takes" 50 ms on this clock; the budget is 100 ms per second.
        let v = ProxyAuthVerifier(
            Self.table(), budgetMilliseconds: 100,
            clock: {
                clock.now += 25  // read twice per hash (before and after)
                return clock.now
            })
        #expect(verify(v, Self.header("alice", "correct horse")) == .user("alice"))
        var busy = 0
        for i in 0..<10 where verify(v, Self.header("alice", "guess\(i)")) == .busy { busy += 1 }
        #expect(busy >= 5, "a flood of new wrong passwords must be cut off by the budget")
        #expect(v.hashesComputed <= 6)
        #expect(verify(v, Self.header("alice", "correct horse")) == .user("alice"))  // cached: no budget needed
        clock.now += 5_000  // the budget refills with time
        #expect(verify(v, Self.header("bob", "battery staple")) == .user("bob"))
    }
}
