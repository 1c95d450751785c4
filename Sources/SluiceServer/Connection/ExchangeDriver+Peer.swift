import SluiceCore

/// A request for a URL another member of the fleet owns, asking the members ranked above this
/// instance before its own store is looked up (`fleet.cache`, `PeerHop`): the driver's side of
/// it — starting each peer's transfer, and going on locally when none answered.
extension ExchangeDriver {
    /// `walk` names the members ranked above this instance for the URL: they are asked in turn.
    func askPeers(_ walk: PeerWalk, _ exchange: Exchange) {
        guard let peers = worker.peers else { return peersDidNotAnswer(exchange) }
        connection.stopTimer()
        let hop = PeerHop(driver: self, exchange: exchange, peers: peers, walk: walk)
        peerHop = hop
        askNextPeer(hop)
    }

    /// The peer `hop` asked gave no answer: the next is asked.
    func peerFailed(_ hop: PeerHop) {
        guard peerHop === hop, exchange === hop.exchange else { return }
        phase = .idle
        askNextPeer(hop)
    }

    private func askNextPeer(_ hop: PeerHop) {
        let exchange = hop.exchange
        guard let peer = hop.nextPeer() else { return peersDidNotAnswer(exchange) }
        let request: UpstreamRequest
        do {
            request = try hop.request(tries)
        } catch {
            return peersDidNotAnswer(exchange)
        }
        let transfer = tries.peerTransfer(
            request, to: peer, delegate: hop, bodySource: self, output: connection.clientOutput,
            clientMinorVersion: exchange.head.minorVersion)
        phase = .forwarding(transfer)
        transfer.start(perTryTimeout: hop.timeout(worker))
    }

    /// No member ranked above this instance answered: the cache stage runs again, and this
    /// time looks the request up here — a copy of this instance's own answers (fresh, stale
    /// or revalidated as usual), and a miss is fetched here, as by the URL's owner.
    private func peersDidNotAnswer(_ exchange: Exchange) {
        peerHop = nil
        phase = .idle
        exchange.peersAsked = true
        advance(exchange, from: exchange.stage)
    }
}
