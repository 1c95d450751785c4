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

    @Test func percentDecoding() {
        #expect(PercentEncoding.decode("a%20b%C3%A9") == "a bé")
        #expect(
            PercentEncoding.decode("bad%2") == nil && PercentEncoding.decode("%FF") == nil && PercentEncoding.decode("%zz") == nil
        )
    }
}
