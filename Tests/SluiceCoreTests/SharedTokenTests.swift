import HTTPTypes
import Testing

@testable import SluiceCore

/// `oauth2` with a fleet's token store (docs/fleet.md): a token kept in the store is used
/// without a fetch; with none, the fetch takes the store's lock and keeps what it got; an
/// instance that finds the lock taken waits for the token; a token refused upstream is deleted
/// from the store (compare-and-delete) and not taken again; a store that cannot answer leaves
/// the instance on its own.
@Suite struct SharedTokenTests {
    final class Store: SharedTokenStore {
        var kept: SharedToken = .none
        var lockAnswer: Bool? = true
        var awaited: SharedToken = .none
        var calls: [String] = []
        func token(_ key: String, completion: @escaping (SharedToken) -> Void) {
            calls.append("token")
            completion(kept)
        }
        func lock(_ key: String, completion: @escaping (Bool?) -> Void) {
            calls.append("lock")
            completion(lockAnswer)
        }
        func awaitToken(_ key: String, completion: @escaping (SharedToken) -> Void) {
            calls.append("await")
            completion(awaited)
        }
        func store(_ key: String, token: String, milliseconds: Int) { calls.append("store \(token) \(milliseconds)") }
        func unlock(_ key: String) { calls.append("unlock") }
        func invalidate(_ key: String, token: String) { calls.append("invalidate \(token)") }
    }

    final class Session: SessionContext {
        /// @unchecked: the tests run on one thread.
        struct Waker: SessionWaker, @unchecked Sendable {
            let id = 1
            let session: Session
            func wake() { session.runParked() }
        }
        let store: Store?
        var posts = 0
        var parked: [() -> Bool] = []
        init(store: Store?) { self.store = store }
        var sharedTokens: (any SharedTokenStore)? { store }
        var waker: any SessionWaker { Waker(session: self) }
        var monitor: (any EventMonitor)? { nil }
        func post(
            url: String, headers: [(String, String)], body: [UInt8],
            completion: @escaping (Result<(status: Int, body: [UInt8]), ProxyError>) -> Void
        ) {
            posts += 1
            completion(.success((200, Array(#"{"access_token":"fetched-\#(posts)","expires_in":60}"#.utf8))))
        }
        func park(_ work: @escaping () -> Bool) { parked.append(work) }
        func runParked() { parked = parked.filter { !$0() } }
    }

    let settings = OAuth2Authenticator.Settings(
        grant: .clientCredentials, tokenURL: "https://auth.test/token", clientID: "c", clientSecret: Secret("s"))

    func bearer(_ oauth: OAuth2Authenticator, _ session: Session) -> String? {
        var header: String?
        let request = ProxyRequest(id: 1, method: "GET", url: "http://api.test/", headerFields: [:], body: .none)
        oauth.adapt(request, for: session) { result in
            header = try? result.get().headerFields[.authorization]
        }
        return header
    }

    @Test func aTokenKeptByTheFleetIsUsedWithoutAFetch() {
        let store = Store()
        store.kept = .found(token: "shared", milliseconds: 50_000)
        let session = Session(store: store)
        #expect(bearer(OAuth2Authenticator(settings: settings), session) == "Bearer shared")
        #expect(session.posts == 0 && store.calls == ["token"])
    }

    @Test func withNoneTheFetchTakesTheLockAndKeepsTheToken() {
        let store = Store()
        let session = Session(store: store)
        #expect(bearer(OAuth2Authenticator(settings: settings), session) == "Bearer fetched-1")
        #expect(store.calls == ["token", "lock", "store fetched-1 60000"])
    }

    @Test func anInstanceThatFindsTheLockTakenWaitsForTheToken() {
        let store = Store()
        store.lockAnswer = false
        store.awaited = .found(token: "from-another", milliseconds: 40_000)
        let session = Session(store: store)
        #expect(bearer(OAuth2Authenticator(settings: settings), session) == "Bearer from-another")
        #expect(session.posts == 0 && store.calls == ["token", "lock", "await"])
        // The other instance failed: this one fetches for itself (without the lock).
        let failed = Store()
        failed.lockAnswer = false
        #expect(bearer(OAuth2Authenticator(settings: settings), Session(store: failed)) == "Bearer fetched-1")
    }

    @Test func aRefusedTokenIsDeletedFromTheFleetAndNotTakenAgain() {
        let store = Store()
        store.kept = .found(token: "old", milliseconds: 50_000)
        let session = Session(store: store)
        let oauth = OAuth2Authenticator(settings: settings)
        #expect(bearer(oauth, session) == "Bearer old")
        var answer: RetryResult?
        let used = ProxyRequest(
            id: 1, method: "GET", url: "http://api.test/", headerFields: [.authorization: "Bearer old"], body: .none)
        oauth.retry(used, dueTo: .status(401, retryAfterMilliseconds: nil), attempt: 0) { answer = $0 }
        #expect(answer == .retry)
        store.calls = []
        #expect(bearer(oauth, session) == "Bearer fetched-1")
        #expect(store.calls == ["token", "invalidate old", "lock", "store fetched-1 60000"])
    }

    @Test func aStoreThatCannotAnswerLeavesTheInstanceOnItsOwn() {
        let store = Store()
        store.kept = .unavailable
        let session = Session(store: store)
        #expect(bearer(OAuth2Authenticator(settings: settings), session) == "Bearer fetched-1")
        #expect(store.calls == ["token"])
        var local = settings
        local.share = false
        let quiet = Store()
        #expect(bearer(OAuth2Authenticator(settings: local), Session(store: quiet)) == "Bearer fetched-1")
        #expect(quiet.calls.isEmpty, "share: false never asks the fleet")
    }
}
