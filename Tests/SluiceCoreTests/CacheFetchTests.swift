import SluiceCore
import Synchronization
import Testing

/// `CacheFetch`: the one origin fetch other requests wait on — a waiter is woken by the next
/// event only (one-shot), by progress only once its step is reached, never after it cancelled,
/// and told at once (nil) when the fetch moved on before it registered.
@Suite struct CacheFetchTests {
    final class Woken: Sendable {
        let names = Mutex<[String]>([])
        func wake(_ name: String) -> @Sendable () -> Void { { self.names.withLock { $0.append(name) } } }
        var all: [String] { names.withLock { $0 } }
    }

    @Test func wakesAreOneShotAndStepped() {
        let store = CacheStore(.init())
        let (claimed, fetch) = store.claimFetch("u")
        #expect(claimed && store.claimFetch("u").claimed == false && store.claimFetch("u").fetch === fetch)
        let woken = Woken()
        #expect(fetch.wait(seen: .fetching, available: 0, wake: woken.wake("a")) != nil)
        let b = fetch.wait(seen: .fetching, available: 0, wake: woken.wake("b"))
        fetch.cancelWait(b!)
        fetch.publish("stream")
        #expect(woken.all == ["a"] && fetch.snapshot.phase == .streaming && fetch.snapshot.stream as? String == "stream")
        // A waiter that saw an older phase is told at once.
        #expect(fetch.wait(seen: .fetching, available: 0, wake: woken.wake("late")) == nil)
        // Progress wakes a reader only once its step is reached.
        #expect(fetch.wait(seen: .streaming, available: 0, until: 1000, wake: woken.wake("step")) != nil)
        fetch.progressed(to: 600)
        #expect(woken.all == ["a"])
        fetch.progressed(to: 1200)
        #expect(woken.all == ["a", "step"])
        #expect(fetch.wait(seen: .streaming, available: 600, wake: woken.wake("behind")) == nil)
        #expect(fetch.wait(seen: .streaming, available: 1200, until: 5000, wake: woken.wake("end")) != nil)
        store.endFetch("u", token: fetch.token, complete: true)
        #expect(woken.all == ["a", "step", "end"] && fetch.snapshot.phase == .ended(complete: true))
        #expect(!store.isFetching("u") && store.claimFetch("u").claimed)
    }

    @Test func aSecondPublishChangesNothingAndWaitingPastEverythingIsAllowed() {
        let store = CacheStore(.init())
        let (_, fetch) = store.claimFetch("u")
        #expect(fetch.publish("first") && !fetch.publish("second"))
        #expect(fetch.snapshot.stream as? String == "first")
        let woken = Woken()
        // A waiter for the end only (a reader that cannot open the source yet).
        #expect(fetch.wait(seen: .streaming, available: .max, wake: woken.wake("end")) != nil)
        fetch.progressed(to: 1 << 40)
        #expect(woken.all.isEmpty)
        fetch.readerStarted()
        #expect(fetch.readers == 1)
        fetch.readerEnded()
        fetch.end(complete: false)
        #expect(woken.all == ["end"] && fetch.snapshot.phase == .ended(complete: false))
    }

    @Test func aFetchThatNeverStreamedEndsIncomplete() {
        let store = CacheStore(.init())
        let (_, fetch) = store.claimFetch("u")
        store.endFetch("u", token: fetch.token, complete: true)
        #expect(fetch.snapshot.phase == .ended(complete: false))
    }
}
