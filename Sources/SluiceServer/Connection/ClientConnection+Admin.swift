import CLibEvent
import SluiceCore

#if canImport(Glibc)
    import Glibc
#endif

/// What the admin API (`AdminServer`) sees and does of a connection's exchange, on the
/// worker's thread.
extension ClientConnection {
    /// The exchange in flight, as `GET /requests` lists it; nil when there is none.
    func adminSnapshot(worker index: Int) -> AdminExchange? {
        guard let exchange, !exchange.ended else { return nil }
        let summary = exchange.summary
        let state: String
        switch self.state {
        case .dialing: state = "connecting"
        case .tunnel: state = "tunnel"
        case .awaitingBody, .bufferingBody: state = "reading_body"
        default: state = exchange.inspect { $0.state.name }
        }
        return AdminExchange(
            id: summary.id, requestId: summary.requestId ?? "", worker: index, client: summary.client, method: summary.method,
            url: exchange.pipeline.redactor.url(summary.url), policy: summary.policy, host: exchange.policyHost,
            state: state, attempt: summary.attempts, status: summary.status,
            bytesIn: summary.bytesIn, bytesOut: summary.bytesOut,
            ageMilliseconds: exchange.inspect { $0.elapsed })
    }

    /// `POST /requests/cancel`: the client is told (503 `request cancelled by the proxy's
    /// operator`, then the connection closes) and the upstream transfer stops. A response
    /// that already started is cut off by closing the connection (the client sees a
    /// truncated message); a tunnel is closed.
    func cancelByOperator() {
        guard let exchange, !exchange.ended else { return }
        switch state {
        case .forwarding(let transfer):
            if transfer.responseStarted {
                exchange.end(.error, error: "cancelled by the proxy's operator after the response started")
                close()
                return
            }
            transfer.cancel()
        case .dialing(let dialer):
            dialer.cancel()
        case .waitingToRetry(let timer):
            event_free(timer)
        case .queued(let ticket):
            worker.upstreamGate.leave(ticket)
        case .tunnel:
            exchange.end(.tunnel, error: "cancelled by the proxy's operator")
            close()
            return
        case .upgrading(let transfer):
            if transfer.phase != .awaitingAnswer && transfer.phase != .connecting {
                exchange.end(exchange.summary.status == 101 ? .tunnel : .error, error: "cancelled by the proxy's operator")
                close()
                return
            }
            transfer.cancel()
        case .servingDisk:
            exchange.end(.error, error: "cancelled by the proxy's operator after the response started")
            close()
            return
        case .awaitingHead, .closing, .closed:
            return
        case .adapting, .awaitingBody, .bufferingBody, .awaitingCollapsed:
            break
        }
        state = .awaitingHead
        respondError(.cancelledByOperator)
    }
}

/// One in-flight exchange as the admin API shows it (`docs/admin-api.yaml`, `Exchange`).
struct AdminExchange: Sendable, Encodable {
    let id: UInt64
    let requestId: String
    let worker: Int
    let client: String
    let method: String
    let url: String
    let policy: String
    let host: String
    let state: String
    let attempt: Int
    let status: Int
    let bytesIn: Int64
    let bytesOut: Int64
    let ageMilliseconds: Int

    enum CodingKeys: String, CodingKey {
        case id, worker, client, method, url, policy, host, state, attempt, status
        case requestId = "request_id"
        case bytesIn = "bytes_in"
        case bytesOut = "bytes_out"
        case ageMilliseconds = "age_ms"
    }
}
