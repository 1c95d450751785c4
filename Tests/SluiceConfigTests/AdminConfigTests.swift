import SluiceCore
import Testing

@testable import SluiceConfig

/// `admin:` (AdminReader.swift): off by default, loopback unless a token, no shared address.
@Suite struct AdminConfigTests {
    private func issues(_ yaml: String) -> [String] {
        do {
            _ = try ConfigLoader.parse(yaml: yaml, file: "a.yaml")
            return []
        } catch let error as ConfigError {
            return error.issues.map(\.description)
        } catch {
            return ["\(error)"]
        }
    }

    @Test func offByDefault() throws {
        #expect(try ConfigLoader.parse(yaml: "listen: [127.0.0.1:3128]", file: "a.yaml").server.admin == nil)
    }

    @Test func loopbackWithoutToken() throws {
        let v4 = try ConfigLoader.parse(yaml: "admin: { listen: 127.0.0.2:9901 }", file: "a.yaml").server.admin
        #expect(v4 == .init(listen: "127.0.0.2:9901"))
        let v6 = try ConfigLoader.parse(yaml: "admin: { listen: '[::1]:9901' }", file: "a.yaml").server.admin
        #expect(v6?.listen == "[::1]:9901")
    }

    @Test func anyAddressWithToken() throws {
        let admin = try ConfigLoader.parse(yaml: "admin: { listen: 0.0.0.0:9901, token: t0ken }", file: "a.yaml").server.admin
        #expect(admin?.token?.value == "t0ken")
        #expect("\(admin!.token!)" == "<redacted>")
    }

    @Test func nonLoopbackWithoutTokenIsLocated() {
        let found = issues("admin:\n  listen: 10.0.0.1:9901\n")
        #expect(found.count == 1)
        #expect(found.first?.hasPrefix("a.yaml:2:11: ") == true)
        #expect(found.first?.contains("admin.token") == true)
        #expect(issues("admin: { listen: '[::2]:9901' }").count == 1)
    }

    @Test func badFormsAreLocated() {
        #expect(issues("admin: { token: x }").first?.contains("admin needs listen") == true)
        #expect(issues("admin: { listen: localhost:9901 }").first?.contains("invalid admin.listen") == true)
        #expect(issues("admin: { listen: 127.0.0.1:9901, tokn: x }").first?.contains("did you mean 'token'") == true)
        #expect(issues("listen: [127.0.0.1:9901]\nadmin: { listen: 127.0.0.1:9901 }").first?.contains("used twice") == true)
    }

    @Test func loopbackRecognition() {
        #expect(ListenAddress.isLoopback("127.0.0.1:1"))
        #expect(ListenAddress.isLoopback("127.255.0.9:1"))
        #expect(ListenAddress.isLoopback("[::1]:1"))
        #expect(!ListenAddress.isLoopback("128.0.0.1:1"))
        #expect(!ListenAddress.isLoopback("[::]:1"))
        #expect(!ListenAddress.isLoopback("0.0.0.0:1"))
        #expect(!ListenAddress.isLoopback("[::ffff:127.0.0.1]:1"))
    }
}
