import SluiceCore

/// `limits.max_in_flight_upstream` (with `limits.upstream_queue` and `timeouts.upstream_queue`):
/// a request that will go upstream takes one of its worker's slots (`UpstreamGate`), waits in
/// the queue (its connection holds its input meanwhile), or is answered `503` with
/// `Retry-After`. It comes after the cache, whose hits take no slot. CONNECT tunnels take none
/// (long-lived byte pipes, bounded by `limits.max_connections`); requests inside an
/// intercepted tunnel do. The slot is held until the exchange ends (or its upgrade becomes a
/// tunnel).
enum UpstreamSlotStage: RequestStage {
    static var name: String { "upstream_slot" }

    static func enter(_ exchange: Exchange, _ services: any StageServices) -> StageVerdict {
        guard let owner = exchange.owner else { return .respond(.cancelledByOperator) }
        switch services.admitUpstream(owner) {
        case .go:
            exchange.holdsUpstreamSlot = true
            return .proceed
        case .wait(let ticket):
            return .wait(.upstreamSlot(ticket))
        case .refuse(let error):
            return .respond(error)
        }
    }
}
