import CLibEvent
import SluiceCore

/// CONNECT: the connection's side of `TunnelDialer` and `Tunnel`.
extension ClientConnection {
    /// The CONNECT destination answered: tell the client and start relaying.
    func tunnelEstablished(fd: Int32) {
        let tunnel = Tunnel(connection: self, upstreamFD: fd)
        state = .tunnel(tunnel)
        if let exchange {
            exchange.summary.status = 200
            exchange.summary.attempts = 1
            exchange.monitor?.handle(.tunnelOpened(id: exchange.id, client: peer, authority: exchange.target.authority))
        }
        ResponseEncoder.connectEstablished(into: clientOutput)
        scheduleFlush()
        setReading(true)
        tunnel.clientReadable()  // bytes the client sent early (a TLS ClientHello) go first
    }

    /// Byte accounting for the access log's tunnel line.
    func tunnelMoved(up: Int, down: Int) {
        guard let exchange else { return }
        exchange.summary.bytesIn += Int64(up)
        exchange.summary.bytesOut += Int64(down)
    }

    func tunnelFailed(_ error: ProxyError) {
        state = .awaitingHead
        respondError(error)
    }
}
