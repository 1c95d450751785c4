import Foundation
import Testing

@testable import SluiceCore

/// `PeerSignature` and `PeerReplayGuard`: what a peer signs, what the owner accepts, and what
/// it refuses (another request line, another secret, a time outside the window, a replay).
@Suite struct PeerSignatureTests {
    static let signer = PeerSignature(secret: Secret("fleet-secret-0123456789"))
    static let url = "http://origin.test/a?b=1"

    @Test func aSignedRequestVerifiesOnceWithinTheWindow() {
        let replays = PeerReplayGuard()
        let value = Self.signer.fieldValue(method: "GET", url: Self.url, sender: "10.0.0.2:3128", now: 1000, nonce: 42)
        #expect(value.hasPrefix("id=10.0.0.2:3128, t=1000, n=000000000000002a, sig="))
        #expect(
            Self.signer.verify(value, method: "GET", url: Self.url, now: 1029, replays: replays)
                == .valid(sender: "10.0.0.2:3128"))
        #expect(Self.signer.verify(value, method: "GET", url: Self.url, now: 1029, replays: replays) == .replayed)
        let other = Self.signer.fieldValue(method: "GET", url: Self.url, sender: "10.0.0.2:3128", now: 1000, nonce: 43)
        #expect(
            Self.signer.verify(other, method: "GET", url: Self.url, now: 971, replays: replays) == .valid(sender: "10.0.0.2:3128")
        )
    }

    @Test func whatIsNotSignedAsSentIsRefused() {
        let replays = PeerReplayGuard()
        let value = Self.signer.fieldValue(method: "GET", url: Self.url, sender: "10.0.0.2:3128", now: 1000, nonce: 7)
        #expect(Self.signer.verify(nil, method: "GET", url: Self.url, now: 1000, replays: replays) == .unsigned)
        #expect(Self.signer.verify(value, method: "HEAD", url: Self.url, now: 1000, replays: replays) == .forged)
        #expect(Self.signer.verify(value, method: "GET", url: Self.url + "&c", now: 1000, replays: replays) == .forged)
        #expect(
            Self.signer.verify(
                value.replacingOccurrences(of: "t=1000", with: "t=1001"), method: "GET", url: Self.url, now: 1000,
                replays: replays) == .forged)
        #expect(
            Self.signer.verify(
                value.replacingOccurrences(of: "id=10.0.0.2", with: "id=10.0.0.3"), method: "GET", url: Self.url, now: 1000,
                replays: replays) == .forged)
        let stranger = PeerSignature(secret: Secret("another-secret-0123456789"))
        #expect(stranger.verify(value, method: "GET", url: Self.url, now: 1000, replays: replays) == .forged)
        for garbled in [
            "", "id=x", "id=a, t=1000, n=00, sig=00", "t=1000, n=0000000000000007, sig=" + String(repeating: "0", count: 64),
        ] {
            #expect(Self.signer.verify(garbled, method: "GET", url: Self.url, now: 1000, replays: replays) == .forged)
        }
        #expect(Self.signer.verify(value, method: "GET", url: Self.url, now: 1031, replays: replays) == .stale)
        #expect(Self.signer.verify(value, method: "GET", url: Self.url, now: 969, replays: replays) == .stale)
        // Nothing refused was recorded: the request still verifies once.
        #expect(
            Self.signer.verify(value, method: "GET", url: Self.url, now: 1000, replays: replays)
                == .valid(sender: "10.0.0.2:3128"))
    }

    @Test func theReplayGuardForgetsOnlyWhatAgedOutOrOverflowed() {
        let replays = PeerReplayGuard(capacity: 4)
        #expect(replays.admit("a", until: 10, now: 0))
        #expect(!replays.admit("a", until: 10, now: 5))
        #expect(replays.admit("a", until: 20, now: 11))
        for nonce in ["b", "c", "d", "e"] { #expect(replays.admit(nonce, until: 30, now: 12)) }
        // At capacity the oldest ("a") went; the others are still kept.
        #expect(replays.admit("a", until: 30, now: 12))
        #expect(!replays.admit("e", until: 30, now: 12))
    }
}
