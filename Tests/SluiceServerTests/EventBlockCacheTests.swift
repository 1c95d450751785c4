import CLibEvent
import CShims
import Glibc
import Testing

@testable import SluiceServer

/// libevent's 2 and 4 KiB buffer blocks through the per-thread cache
/// (`sluice_event_cache_buffer_blocks`): a drained read's block is kept for the next read on
/// the same thread, at most 8 of a size, and given back to malloc on request.
@Suite struct EventBlockCacheTests {
    /// One read's worth: a 4 KiB chain reserved (as `ClientSocket` reserves `smallRead`),
    /// filled, committed and drained.
    static func readAndDrain(_ buffer: OpaquePointer) {
        var vector = iovec()
        #expect(evbuffer_reserve_space(buffer, ClientSocket.smallRead, &vector, 1) == 1)
        vector.iov_len = ClientSocket.smallRead
        #expect(evbuffer_commit_space(buffer, &vector, 1) == 0)
        #expect(evbuffer_drain(buffer, ClientSocket.smallRead) == 0)
    }

    @Test func aDrainedReadsBlockServesTheNextRead() {
        sluice_event_cache_buffer_blocks()
        sluice_event_release_cached_blocks()
        let buffer = evbuffer_new()!
        defer { evbuffer_free(buffer) }
        Self.readAndDrain(buffer)
        #expect(sluice_event_cached_blocks() == 1, "the drained chain is kept")
        var vector = iovec()
        #expect(evbuffer_reserve_space(buffer, ClientSocket.smallRead, &vector, 1) == 1)
        #expect(sluice_event_cached_blocks() == 0, "the next read takes it back")
        #expect(evbuffer_commit_space(buffer, &vector, 0) == 0)
        sluice_event_release_cached_blocks()
    }

    @Test func theCacheHoldsAtMostEightOfASizeAndGivesThemBack() {
        sluice_event_cache_buffer_blocks()
        sluice_event_release_cached_blocks()
        // Twelve reads' blocks live at once, then all drained: eight are kept.
        let buffers = (0..<12).map { _ in evbuffer_new()! }
        for buffer in buffers {
            var vector = iovec()
            #expect(evbuffer_reserve_space(buffer, ClientSocket.smallRead, &vector, 1) == 1)
            vector.iov_len = ClientSocket.smallRead
            #expect(evbuffer_commit_space(buffer, &vector, 1) == 0)
        }
        for buffer in buffers { evbuffer_free(buffer) }
        #expect(sluice_event_cached_blocks() == 8)
        sluice_event_release_cached_blocks()
        #expect(sluice_event_cached_blocks() == 0)
    }
}
