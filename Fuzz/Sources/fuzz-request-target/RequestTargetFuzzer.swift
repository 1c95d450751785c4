import FuzzSupport
import SluiceCore

@testable import SluiceServer

/// Fuzz target: `RequestTarget`, the absolute-form (`http://host:port/path`) and
/// authority-form (`host:port`, CONNECT) parsers, and a host's `upstream:` override. The
/// input's first byte picks the form and the override; the rest is the target.
///
/// Checks, beyond "no crash, no hang": an accepted target has a non-empty host of the
/// allowed characters (or an IPv6 literal) and a port from 1 to 65535; its URL starts with
/// its scheme, in lower case; parsing that URL again, or the target's `authority`, gives the
/// same target; and an override yields its scheme and, when it names one, its port.
@main
enum RequestTargetFuzzer {
    static func main() {
        FuzzDriver.run { data, count in RequestTargetFuzzer.testOneInput(FuzzDriver.bytes(data, count)) }
    }

    /// One input: returns 0, or traps on a finding.
    static func testOneInput(_ raw: UnsafeRawBufferPointer) -> Int32 {
        guard let selector = raw.first else { return 0 }
        let text = String(decoding: raw.dropFirst(), as: UTF8.self)
        switch selector % 3 {
        case 0:
            guard let target = try? RequestTarget.authority(text) else { return 0 }
            check(target)
            let again = try? RequestTarget.authority(target.authority)
            fuzzCheck(again?.host == target.host && again?.port == target.port, "authority does not round-trip")
        default:
            guard let target = try? RequestTarget.absolute(text) else { return 0 }
            check(target)
            let prefix = target.scheme == .http ? "http://" : "https://"
            fuzzCheck(target.url.hasPrefix(prefix), "URL \(target.url) without its scheme")
            fuzzCheck((try? RequestTarget.absolute(target.url)) == target, "URL does not parse to the same target")
            guard selector % 3 == 2 else { return 0 }
            let ports: [Int?] = [nil, 1, 80, 443, 8443, 65535]
            let override = UpstreamOverride(
                scheme: selector & 8 != 0 ? .https : .http,
                port: ports[Int(selector >> 4) % ports.count])
            let overridden = try? target.overridden(by: override)
            fuzzCheck(overridden != nil, "an accepted target cannot be overridden by \(override)")
            guard let moved = overridden else { return 0 }
            check(moved)
            fuzzCheck(moved.scheme == (override.scheme == .https ? .https : .http), "override scheme not applied")
            if let port = override.port { fuzzCheck(moved.port == port, "override port not applied") }
            fuzzCheck(moved.host == target.host, "override changed the host")
        }
        return 0
    }

    static func check(_ target: RequestTarget) {
        fuzzCheck(!target.host.isEmpty, "empty host")
        fuzzCheck((1...65535).contains(target.port), "port \(target.port)")
        let plain = target.host.utf8.allSatisfy { c in
            (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A) || c == 0x2D || c == 0x2E
                || c == 0x5F
        }
        fuzzCheck(plain || IPNetwork.parseAddress(target.host)?.count == 16, "host \(target.host) not a name or IPv6 literal")
    }
}
