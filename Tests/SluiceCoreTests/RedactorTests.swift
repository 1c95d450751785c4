import Testing

@testable import SluiceCore

@Suite struct RedactorTests {
    @Test func redactsCredentialsEverywhere() {
        let r = Redactor(secretValues: ["sup3rsecret", "abc"], queryParameters: ["token"])
        #expect(r.url("http://user:pw@h/p?token=zzz&a=1") == "http://h/p?token=<redacted>&a=1")
        #expect(r.headerValue(name: "Authorization", value: "Bearer x") == "<redacted>")
        #expect(r.headerValue(name: "X-Note", value: "has sup3rsecret inside") == "has <redacted> inside")
        #expect(r.scrub("abc stays: too short to be treated as a secret") == "abc stays: too short to be treated as a secret")
        #expect(Secret("v").description == "<redacted>")
        #expect("\(Secret("v"))" == "<redacted>")
    }

    /// A text cut to a length (a script's error, a log line) is redacted before the cut: a
    /// secret the cut would split is replaced whole, wherever it sits around the cut.
    @Test func aCutNeverShowsPartOfASecret() {
        let r = Redactor(secretValues: ["hunter2supersecret", "x漢字🙂y"])
        #expect(r.longestSecretBytes == 18)
        for secret in ["hunter2supersecret", "x漢字🙂y"] {
            for before in 0...40 {
                let text = String(repeating: "a", count: before) + secret + " tail"
                let cut = Array(text.utf8).withUnsafeBytes { r.redactedPrefix($0, 24) }
                #expect(!cut.contains("hunter") && !cut.contains("漢"), "\(before): \(cut)")
                #expect(cut.utf8.count <= 24 + "…".utf8.count, "\(cut)")
            }
        }
        // Several secrets: each `<redacted>` is shorter than its secret, and the text after it
        // must not slide a cut-off secret into view.
        let token = "tok_live_0123456789abcdefghijklmnopqrstu"
        let several = Redactor(secretValues: [token])
        for first in 0...30 {
            for second in 60...130 {
                var text = Array(repeating: UInt8(ascii: "a"), count: 200)
                text.replaceSubrange(first..<first + token.utf8.count, with: Array(token.utf8))
                if second >= first + token.utf8.count {
                    text.replaceSubrange(
                        second..<min(200, second + token.utf8.count), with: Array(token.utf8).prefix(200 - second))
                }
                let cut = text.withUnsafeBytes { several.redactedPrefix($0, 100) }
                #expect(!cut.contains("tok_") && !cut.contains("0123456789a"), "\(first) \(second): \(cut)")
            }
        }
        // A cut inside a multi-byte character steps back to its start.
        let accents = Array(String(repeating: "é", count: 20).utf8).withUnsafeBytes { r.redactedPrefix($0, 25) }
        #expect(accents == String(repeating: "é", count: 12) + "…", "\(accents)")
        let short = Array("no secret here".utf8).withUnsafeBytes { r.redactedPrefix($0, 24) }
        #expect(short == "no secret here")
        let long = Array(String(repeating: "b", count: 30).utf8).withUnsafeBytes { r.redactedPrefix($0, 24) }
        #expect(long == String(repeating: "b", count: 24) + "…")
    }

    private func occurs(_ r: Redactor, _ line: String) -> Bool {
        Array(line.utf8).withUnsafeBufferPointer { r.occursSecret(in: $0) }
    }

    /// The search every log line goes through: the secrets' bytes made once, each searched by
    /// its first byte then checked at its last. Wherever a secret sits, whatever sits around
    /// it, it is found; and nothing else is.
    @Test func findsASecretWhereverItIs() {
        let r = Redactor(secretValues: ["s3cr3t", "aab", "tok-ééé", "aaab", "x漢字🙂y"])
        #expect(r.secretValues == ["tok-ééé", "s3cr3t", "x漢字🙂y", "aaab"])  // "aab": under 4 bytes
        for line in ["s3cr3t", "s3cr3t at the start", "at the end s3cr3t", "{\"v\":\"s3cr3t\"}", "aaaab", "aaaaaab"] {
            #expect(occurs(r, line), "\(line)")
        }
        for line in ["x tok-ééé x", "tok-ééé", "漢 x漢字🙂y", "x漢字🙂y"] { #expect(occurs(r, line), "\(line)") }
        // Candidates that fail at their last byte, in the middle, or run past the end.
        for line in [
            "", "s", "s3cr3", "s3cr3T", "s3cX3t", "s3cr3 s3cr3", "aaa", "aaba aaac", "tok-éé", "tok-ééè", "x漢字🙂", "x漢字🙃y",
        ] {
            #expect(!occurs(r, line), "\(line)")
        }
        // Every position of the line, every length of line around it.
        for length in 0...40 {
            for at in 0...length {
                let pad = String(repeating: "s3cr", count: 11)
                let line = String(pad.prefix(at)) + "s3cr3t" + String(pad.prefix(length - at))
                #expect(occurs(r, line), "\(line)")
                #expect(!occurs(r, String(pad.prefix(length))))
            }
        }
    }

    /// Whichever byte the search looks for first, a value is found at every place of a line,
    /// and a near miss at every place is not.
    @Test func everyProbeFindsTheValueEverywhere() {
        let needle = Array("k3y-é".utf8)
        for probe in needle.indices {
            for length in 0...20 {
                for at in 0...length {
                    var line = Array(repeating: UInt8(ascii: "k"), count: length)
                    line.insert(contentsOf: needle, at: at)
                    var miss = line
                    miss[at + needle.count - 1] ^= 1
                    needle.withUnsafeBufferPointer { n in
                        line.withUnsafeBufferPointer { #expect(Redactor.occurs(n, probe: probe, in: $0), "\(probe) \(at)") }
                        miss.withUnsafeBufferPointer { #expect(!Redactor.occurs(n, probe: probe, in: $0), "\(probe) \(at)") }
                    }
                }
            }
        }
    }

    @Test func noSecretsFindNothing() {
        #expect(!occurs(Redactor(), "anything at all"))
        #expect(!occurs(Redactor(secretValues: ["abc", ""]), "abc"))
        #expect(Redactor().scrub(bytes: Array("x".utf8)) == Array("x".utf8))
    }

    /// A value configured twice (two policies' token) is kept once; both forms scrub alike.
    @Test func aSecretConfiguredTwiceIsSearchedOnce() {
        let r = Redactor(secretValues: ["bench-token-01", "bench-key-01", "bench-token-01"])
        #expect(r.secretValues == ["bench-token-01", "bench-key-01"])
        #expect(occurs(r, "Bearer bench-key-01"))
        let line = "a bench-token-01 b bench-key-01 c\n"
        #expect(r.scrub(bytes: Array(line.utf8)) == Array("a <redacted> b <redacted> c\n".utf8))
        #expect(r.scrub(line) == "a <redacted> b <redacted> c\n")
    }

    @Test func anEmptyNeedleOccursAndALongerOneDoesNot() {
        let h = Array("ab".utf8)
        h.withUnsafeBufferPointer { h in
            #expect(Redactor.occurs(UnsafeBufferPointer(start: nil, count: 0), in: h))
            Array("abc".utf8).withUnsafeBufferPointer { #expect(!Redactor.occurs($0, in: h)) }
            Array("ab".utf8).withUnsafeBufferPointer { #expect(Redactor.occurs($0, in: h)) }
        }
    }
}
