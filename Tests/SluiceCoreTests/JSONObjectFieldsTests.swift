import Testing

@testable import SluiceCore

/// `JSONObjectFields` (the OAuth 2.0 token response without Foundation) and
/// `PercentEncoding.decode` (the dashboard's `?host=`).
@Suite struct JSONObjectFieldsTests {
    @Test func readsTheMembersATokenResponseHas() throws {
        let body =
            #" { "access_token": "a\"b\u00e9\ud83d\ude00", "expires_in": 3600, "refresh_token": "r", "scope": ["x", {"y": null}], "ok": true } "#
        let fields = try #require(JSONObjectFields(Array(body.utf8)))
        #expect(fields.string("access_token") == "a\"bé😀")
        #expect(fields.integer("expires_in") == 3600 && fields.string("refresh_token") == "r")
        #expect(fields["scope"] == .other && fields["ok"] == .other && fields.string("missing") == nil)
        #expect(JSONObjectFields(Array(#"{"expires_in": "120"}"#.utf8))?.integer("expires_in") == 120)
        #expect(JSONObjectFields(Array(#"{"expires_in": 3.6e3}"#.utf8))?.integer("expires_in") == 3600)
    }

    @Test(arguments: [
        "", "[]", "{", #"{"a" 1}"#, #"{"a": 1,}"#, #"{"a": tru}"#, #"{"a": 1} x"#, #"{"a": "\x"}"#, "{\"a\": \"\u{1}\"}",
    ])
    func refusesWhatIsNotOneObject(_ text: String) {
        #expect(JSONObjectFields(Array(text.utf8)) == nil)
    }

    /// `JSONStringLiteral`, shared with `sluice.json.decode`: each escape, a surrogate pair, a
    /// lone surrogate (U+FFFD) and each refusal.
    @Test func stringLiterals() {
        func decode(_ literal: String) -> (Result<[UInt8], JSONStringLiteral.Problem>, Int) {
            let bytes = Array(literal.utf8)
            var position = 1  // past the opening quote
            return (JSONStringLiteral.decode(bytes, from: &position), position)
        }
        let literal = #""\"\\\/\b\f\n\r\t\u0041\u00e9\ud83d\ude00" tail"#
        let escapes = decode(literal)
        #expect((try? escapes.0.get()) == Array("\"\\/\u{8}\u{C}\n\r\tAé😀".utf8))
        #expect(escapes.1 == literal.utf8.count - " tail".utf8.count)
        #expect((try? decode(#""\ud800x""#).0.get()) == Array("\u{FFFD}x".utf8))
        #expect(decode(#""abc"#).0 == .failure(.unterminated))
        #expect(decode(#""a\"#).0 == .failure(.unexpectedEnd))
        #expect(decode(#""\q""#).0 == .failure(.badEscape))
        #expect(decode(#""\u12g4""#).0 == .failure(.badUnicodeEscape))
        #expect(decode(#""\ud800\u0041""#).0 == .failure(.badSurrogatePair))
        #expect(decode("\"a\u{1}\"").0 == .failure(.controlCharacter))
    }

    @Test func percentDecoding() {
        #expect(PercentEncoding.decode("a%20b%C3%A9") == "a bé")
        #expect(
            PercentEncoding.decode("bad%2") == nil && PercentEncoding.decode("%FF") == nil && PercentEncoding.decode("%zz") == nil
        )
    }
}
