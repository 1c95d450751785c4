import CShims
import SluiceCore
import Synchronization

/// libcurl's share handle (DNS cache, TLS sessions) of one server's workers, made when the
/// first worker's `UpstreamSession` asks for it. Making it opens libcurl (CShims'
/// curl_loader.c): a server whose tries never reach libcurl never maps it and its
/// dependencies (4.4 MiB at rest, BENCHMARKS.md "Where idle memory goes").
///
/// Threading: `handle()` from any worker thread (the mutex makes one handle); `close()` from
/// the controlling thread once no worker thread is left to use the handle.
final class CurlShare: Sendable {
    /// The handle as the mutex holds it.
    private struct Made: @unchecked Sendable {
        // @unchecked: a handle libcurl makes safe for every thread (CShims' lock callbacks).
        let pointer: UnsafeMutableRawPointer
    }

    private let made = Mutex<Made?>(nil)

    /// The share handle, made on the first call; nil when libcurl cannot make one.
    func handle() -> UnsafeMutableRawPointer? {
        let (handle, opened) = made.withLock { made in
            let opened = made == nil && sluice_curl_loaded() == 0
            if made == nil, let pointer = sluice_share_create() { made = Made(pointer: pointer) }
            return (made, opened)
        }
        if opened { Log.info("libcurl \(String(cString: sluice_curl_version())) opened") }
        return handle?.pointer
    }

    /// Frees the handle if one was made.
    func close() {
        guard
            let pointer = made.withLock({ made in
                defer { made = nil }
                return made?.pointer
            })
        else { return }
        sluice_curl_share_cleanup(pointer)
    }
}
