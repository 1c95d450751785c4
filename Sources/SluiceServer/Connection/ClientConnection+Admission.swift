import CLibEvent
import SluiceCore

/// A forwarded request's way through the worker's `UpstreamGate` (`limits.max_in_flight_upstream`):
/// it goes upstream at once, waits in the queue (the connection holds its input meanwhile), or
/// is answered `503` with `Retry-After`. CONNECT tunnels do not take a slot (they are long-lived
/// byte pipes, bounded by `limits.max_connections`); requests inside an intercepted tunnel do.
extension ClientConnection {
    func prepareWhenAdmitted(_ head: HTTPRequestHead, _ exchange: Exchange) {
        switch worker.upstreamGate.admit(self) {
        case .go:
            holdsUpstreamSlot = true
            prepare(head, exchange)
        case .wait(let ticket):
            state = .queued(ticket)
        case .refuse(let error):
            respondError(error)
        }
    }

    /// A slot freed for the request waiting with `ticket`; false when the connection is no
    /// longer waiting for it (the slot is then not taken).
    func upstreamSlotGranted(_ ticket: UInt64) -> Bool {
        guard case .queued(let waiting) = state, waiting == ticket, let head = currentHead, let exchange else { return false }
        state = .awaitingHead
        holdsUpstreamSlot = true
        prepare(head, exchange)
        return true
    }

    /// The request waiting with `ticket` is refused (the queue's wait ran out).
    func upstreamSlotRefused(_ ticket: UInt64, _ error: ProxyError) {
        guard case .queued(let waiting) = state, waiting == ticket else { return }
        state = .awaitingHead
        respondError(error)
    }

    /// The exchange is over: its slot goes to the next waiting request.
    func releaseUpstreamSlot() {
        guard holdsUpstreamSlot else { return }
        holdsUpstreamSlot = false
        worker.upstreamGate.release()
    }
}
