import SluiceCore

/// The request body a try needs before it is built (`RequestBodyStage`'s waits), the driver's
/// side: a chunked body's start, validated before anything goes upstream, and a body read
/// whole so that every try (and an adapter that reads it, a signer) has it.
///
/// Threading: a view of its driver, made when used (it stores nothing of its own), on the
/// worker's thread.
struct RequestBodyExchange {
    unowned(unsafe) let driver: ExchangeDriver

    /// Starts forwarding a chunked request once the bytes buffered so far prove its body
    /// starts validly (a first chunk, or the last chunk); until then it waits, under the
    /// header timeout. A client that promised `Expect: 100-continue` is told to go on first.
    func startWhenValid(_ exchange: Exchange) {
        let connection = driver.connection
        do {
            if try connection.probeBufferedBody() {
                driver.phase = .idle
                driver.advance(exchange, from: exchange.stage + 1)
                return
            }
        } catch {
            connection.respondError(error)
            return
        }
        if case .awaitingBody = driver.phase { return }
        driver.phase = .awaitingBody
        connection.armTimer(.header)
        connection.sendContinueIfExpected(exchange.head)
    }

    /// Reads the body into the replay buffer; the request stages go on once it is complete.
    func continueBuffering(_ exchange: Exchange) {
        let connection = driver.connection
        var scratch = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            let n: Int?
            do {
                n = try scratch.withUnsafeMutableBytes { raw in
                    try driver.readRequestBody(into: raw.baseAddress!, capacity: raw.count)
                }
            } catch let error as ProxyError {
                return connection.respondError(error)
            } catch {
                return connection.respondError(.malformedRequest("\(error)"))
            }
            guard let n else {
                driver.phase = .bufferingBody
                return
            }
            if n == 0 { break }
            if let reader = exchange.policy.bodyReader, exchange.body.replay == nil {
                // Past `max_body`: the adapter that must read the body cannot have it.
                return connection.respondError(.bodyTooLargeForAdapter(adapter: reader, limit: exchange.policy.maxBody))
            }
        }
        exchange.body.rewindForReplay()
        driver.phase = .idle
        driver.advance(exchange, from: exchange.stage + 1)
    }
}
