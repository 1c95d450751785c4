import SluiceCore

/// The shared cache's answers written out, the driver's side (`CacheStage`'s `.serveStored`, a
/// `304` that validated a stored response, `stale-if-error`): from memory at once, or from the
/// disk tier block by block as the client drains (`DiskHitStream`; sent by the kernel to a
/// plain-http client).
///
/// Threading: a view of its driver, made when used (it stores nothing of its own), on the
/// worker's thread.
struct StoredResponses {
    unowned(unsafe) let driver: ExchangeDriver

    /// Writes a stored response (`StoredResponseWriter`) and ends the exchange, or streams its
    /// body from the disk tier as the client drains.
    func serve(_ answer: StoredAnswer, _ exchange: Exchange) {
        let keepAlive = driver.connection.keepsAliveAfterResponse
        let output = driver.connection.clientOutput
        let response = StoredResponseWriter.writeHead(
            answer, isHead: exchange.head.methodIs("HEAD"),
            range: exchange.cache.flatMap { CacheFields.value("range", in: $0.requestFields) },
            ifRange: exchange.cache.flatMap { CacheFields.value("if-range", in: $0.requestFields) },
            keepAlive: keepAlive, viaLine: driver.worker.viaLine, into: output)
        exchange.summary.cache = answer.parameters
        exchange.summary.servedFromStore = true
        if answer.object.onDisk, !response.body.isEmpty {
            let reader =
                exchange.cache?.diskReader
                ?? driver.worker.diskTier?.open(key: exchange.target.url, variant: answer.object.response.varyKey)
            exchange.cache?.diskReader = nil
            exchange.report(exchange.machine.responseHeadSent(status: response.status))
            guard let reader, UInt64(answer.object.bodyLength) == reader.bodyLength else {
                return abort(exchange, reason: "disk cache entry vanished")
            }
            var promotion: CachePromotion?
            if let taken = exchange.cache?.takePromotionToken() {
                promotion = CachePromotion(store: taken.store, url: taken.url, object: answer.object, token: taken.token)
                if promotion == nil { taken.store.memory.endFill(taken.url, taken.token) }
            }
            let hit = DiskHitStream(
                reader: reader, exchange: exchange, range: response.body, keepAlive: keepAlive, promotion: promotion,
                kernel: promotion == nil && driver.connection.acceptsFileSegments())
            driver.phase = .servingDisk(hit)
            return pump(hit)
        }
        let sent = StoredResponseWriter.writeBody(answer.object, response.body, into: output)
        driver.connection.scheduleFlush()
        exchange.report(exchange.machine.responseHeadSent(status: response.status))
        exchange.machine.responseBodySent(bytes: sent)
        exchange.end(.ok)
        driver.connection.exchangeFinished(keepAlive: keepAlive)
    }

    /// Sends the disk hit's next blocks (`StoredResponseWriter.pump`), and ends the exchange
    /// after the last. Called when the head is written and whenever the output drains.
    func pump(_ hit: DiskHitStream) {
        let output = driver.connection.clientOutput
        let failure =
            hit.kernel ? StoredResponseWriter.pumpKernel(hit, into: output) : StoredResponseWriter.pump(hit, into: output)
        driver.connection.scheduleFlush()
        if let failure { return abort(hit.exchange, reason: failure) }
        guard hit.offset >= hit.range.upperBound else { return }
        let exchange = hit.exchange
        exchange.machine.responseBodySent(bytes: hit.sent)
        exchange.end(.ok)
        driver.phase = .idle
        driver.connection.exchangeFinished(keepAlive: hit.keepAlive)
    }

    /// A stored response's body cannot be completed (a disk block failed its digest and the
    /// entry was dropped; a shared fill broke or could not be read): the response already
    /// announced its length, so the connection is closed without completing it, and the
    /// access log says why. `warning`: logged as one (damage on disk), else at debug level
    /// (a shared fill's break was logged where it broke).
    func abort(_ exchange: Exchange, reason: String, warning: Bool = true) {
        let line = "\(reason): \(exchange.target.url); response to \(driver.connection.peer) aborted"
        if warning { Log.warning(line) } else { Log.debug(line) }
        exchange.summary.servedFromStore = false  // it broke: a failure, not a hit
        exchange.end(.error, error: reason + "; response aborted")
        driver.connection.abortiveClose = true
        driver.connection.close()
    }
}
