import CCurl
import CLibEvent
import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// The I/O a retry needs: a body read whole before the first try (so every try can send it
/// again), and the backoff timer. Whether and when to retry is the `ExchangeMachine`'s to decide.
extension ClientConnection {
    /// Reads the body into the replay buffer; starts the first try once it is complete.
    func continueBuffering(_ head: HTTPRequestHead, _ exchange: Exchange) {
        var scratch = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            let n: Int?
            do {
                n = try scratch.withUnsafeMutableBytes { raw in
                    try readRequestBodyOrThrow(into: raw.baseAddress!, capacity: raw.count)
                }
            } catch let error as ProxyError {
                return respondError(error)
            } catch {
                return respondError(.malformedRequest("\(error)"))
            }
            guard let n else {
                state = .bufferingBody(head, exchange)
                return
            }
            if n == 0 { break }
        }
        exchange.body.rewindForReplay()
        do {
            startTry(try upstreamRequest(head, exchange), exchange)
        } catch {
            respondError(error)
        }
    }

    private func readRequestBodyOrThrow(into buffer: UnsafeMutableRawPointer, capacity: Int) throws -> Int? {
        try readRequestBody(into: buffer, capacity: capacity)
    }

    /// Waits `ms` before the retry the machine scheduled; the connection holds its input meanwhile.
    func startRetryTimer(_ ms: Int) {
        let timer = event_new(
            worker.base, -1, 0,
            { _, _, arg in
                Unmanaged<ClientConnection>.fromOpaque(arg!).takeUnretainedValue().retryTimerFired()
            }, Unmanaged.passUnretained(self).toOpaque())!
        state = .waitingToRetry(timer)
        var tv = timeval(tv_sec: ms / 1000, tv_usec: (ms % 1000) * 1000)
        event_add(timer, &tv)
    }

    private func retryTimerFired() {
        guard case .waitingToRetry(let timer) = state, let exchange else { return }
        event_free(timer)
        state = .awaitingHead
        feed(.retryTimerFired, exchange)
    }
}
