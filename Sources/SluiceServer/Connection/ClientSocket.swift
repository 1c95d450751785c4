import CLibEvent
import COpenSSL

#if canImport(Glibc)
    import Glibc
#endif

/// What a `ClientSocket` tells its connection.
protocol ClientSocketOwner: AnyObject {
    /// New bytes are in `input`.
    func socketReadable()
    /// `output` fell to `ClientSocket.outputLowWatermark` or below after a write.
    func socketDrained()
    /// The peer closed its side, or the socket failed: nothing more can be read or written.
    func socketClosed()
}

/// A plain client socket that Sluice reads and writes itself, with an input and an output
/// `evbuffer` (so codec, transfers and tunnels move bytes the way they would with a
/// bufferevent) and a read event (a write event too, once a write could not finish). It exists for the cost of a request on a kept-alive
/// connection: a bufferevent asks the kernel how much is readable (`FIONREAD`) before every
/// read, and turns the write event on and off around every response (two `epoll_ctl`s and
/// one more trip through `epoll_wait`). Here a readable event costs one `recv`, and output is
/// written when the connection asks (`flush()`, which the worker batches once per loop pass),
/// with the write event armed only while the kernel's buffer is full.
///
/// A read lands in a small extent reserved in `input` (`smallRead`, one 4 KiB chain: a request
/// head needs no more) and spills into the worker's scratch buffer, from which the rest is
/// copied: an idle or lightly used connection never holds a large chain, and a thousand
/// connections that each receive a request at once do not each allocate one. An origin's
/// socket that streams a body reads into larger extents (`adaptDirectRead`).
///
/// Reading stops while `input` holds `inputHighWatermark` bytes or more (the connection's
/// backpressure on uploads and pipelined requests) and resumes when the connection has
/// consumed some (`inputConsumed()`), or while `wantsInput` is false. While it is stopped,
/// the kernel's view of the connection is checked every `closedCheckMilliseconds`: a client
/// that aborts an upload the upstream is slow to take (FIN or RST) is noticed then, not
/// when its bytes are finally read.
///
/// An origin's socket may carry TLS (`tls`, set once its handshake is done): reads are then
/// `SSL_read`s into the same extents (read-ahead: one `read` per batch of records), writes
/// `SSL_write`s of `output`'s chains, and bytes OpenSSL holds decrypted but not yet taken
/// (or a close it has seen) are handed on by activating the read event, since the kernel
/// will not say the socket is readable for them.
///
/// Threading: owned by one `ClientConnection`, on its worker's thread. Its events hold it
/// unretained (`LoopEvent`): `close()` and `detach()` drop them first.
final class ClientSocket {
    /// Stop reading from a client once this many unprocessed bytes wait (256 KiB): the
    /// upload's backpressure, and the bound on pipelined requests held in memory.
    static let inputHighWatermark = 256 * 1024
    /// `socketDrained` fires once the output is down to this (256 KiB).
    static let outputLowWatermark = 256 * 1024
    /// The part of a read that lands in `input` directly (a 4 KiB chain with libevent's
    /// header).
    static let smallRead = 4096 - 64
    /// The most an origin's socket reads directly (a 64 KiB chain with libevent's header).
    static let largeRead = 65536 - 64
    /// What the next read reserves in `input`: `smallRead`, or for an origin's socket that
    /// streams a body, up to `largeRead` (see `adaptDirectRead`).
    private var directRead = ClientSocket.smallRead
    private let maxDirectRead: Int
    /// The worker's spill buffer for the rest of a read (an upload moves in reads of up to
    /// `smallRead` + its size). Owned by the worker, which outlives its sockets.
    private let spill: UnsafeMutableRawBufferPointer

    let fd: Int32
    let input: OpaquePointer
    let output: OpaquePointer
    /// Set by the connection right after creating the socket (before the loop runs again).
    unowned(unsafe) var owner: (any ClientSocketOwner)?
    private let base: OpaquePointer
    private var readEvent: SocketEvent<ClientSocket>!
    /// Made on first need (`makeWriteEvent`).
    private var writeEvent: SocketEvent<ClientSocket>?
    /// Checks for the peer's close while reading is stopped (made on first need).
    private var closedCheck: LoopTimer<ClientSocket>?
    private var closedCheckArmed = false
    static let closedCheckMilliseconds = 200
    private var readArmed = false
    private var writeArmed = false
    private var open = true
    /// The connection ended by an error (a reset, a failed write), not by the peer's FIN:
    /// for a body framed by the connection's end, only a FIN is its end.
    private(set) var endedWithError = false
    /// Whether the connection wants bytes at all (false while it closes).
    var wantsInput = true {
        didSet { armRead() }
    }

    /// Whether the peer's close is watched for while reading is stopped (a client's abort).
    /// Off for an origin's socket: an origin that sent its whole response and closed while
    /// the client was slow to take it is not an abort, and its last bytes are still to read.
    private let watchesCloseWhilePaused: Bool

    /// The TLS session over the socket (an origin's, after its handshake); freed with the
    /// socket.
    private let tls: OpaquePointer?
    /// OpenSSL saw the session end (close_notify, the peer's close or an error): reported
    /// after the bytes before it, on the read event's next pass (activated for it).
    private(set) var tlsEnded = false
    /// A plain socket's end (or error, `endedWithError`) met by the read into the spill after
    /// bytes the owner has not seen yet: told on the read event's next pass.
    private var endPending = false
    /// The TLS session ended without the peer's close_notify (a close at the TCP level, or an
    /// error): for a body framed by the connection's end, possibly a cut.
    private(set) var tlsEndedUncleanly = false

    init(
        base: OpaquePointer, fd: Int32, spill: UnsafeMutableRawBufferPointer, watchesCloseWhilePaused: Bool = true,
        tls: OpaquePointer? = nil
    ) {
        self.base = base
        self.fd = fd
        self.tls = tls
        self.watchesCloseWhilePaused = watchesCloseWhilePaused
        self.spill = spill
        maxDirectRead = watchesCloseWhilePaused ? Self.smallRead : Self.largeRead
        input = evbuffer_new()
        output = evbuffer_new()
        readEvent = SocketEvent(on: base, fd: fd, .read, owner: self) { socket, _ in socket.readNow() }
        armRead()
    }

    /// The write event, made the first time the kernel's buffer is full: most connections
    /// never need it (a response leaves in one `sendmsg`), and an idle one holds no event it
    /// does not use.
    private func makeWriteEvent() -> SocketEvent<ClientSocket> {
        if let writeEvent { return writeEvent }
        let event = SocketEvent(on: base, fd: fd, .write, owner: self) { socket, _ in socket.writeNow() }
        writeEvent = event
        return event
    }

    /// The connection consumed input: reading resumes if the watermark had stopped it.
    func inputConsumed() {
        if !readArmed { armRead() }
    }

    private func armRead() {
        let want = open && wantsInput && evbuffer_get_length(input) < Self.inputHighWatermark
        if want != readArmed {
            readArmed = want
            if want { readEvent.arm() } else { readEvent.stop() }
            if watchesCloseWhilePaused { armClosedCheck(open && !want) }
        }
        // Decrypted bytes or an end that OpenSSL holds, or an end the spill's read met: the
        // kernel will not report them.
        if want, let tls, tlsEnded || SSL_has_pending(tls) == 1 { readEvent.activate() }
        if want, endPending { readEvent.activate() }
    }

    private func armClosedCheck(_ on: Bool) {
        guard on != closedCheckArmed, readEvent != nil else { return }
        closedCheckArmed = on
        if !on {
            closedCheck?.stop()
            return
        }
        if closedCheck == nil { closedCheck = LoopTimer(on: base, owner: self, repeating: true) { $0.checkClosed() } }
        closedCheck?.arm(milliseconds: Self.closedCheckMilliseconds)
    }

    /// Reading is stopped: the peer is gone if the kernel says the connection is no longer
    /// established (a FIN: CLOSE_WAIT; a RST: CLOSE), whatever unread bytes it left.
    private func checkClosed() {
        guard open else { return }
        var info = tcp_info()
        var length = socklen_t(MemoryLayout<tcp_info>.size)
        guard getsockopt(fd, Int32(IPPROTO_TCP), TCP_INFO, &info, &length) == 0 else { return }
        if Int(info.tcpi_state) != Int(TCP_ESTABLISHED) { failed() }
    }

    private func readNow() {
        guard open else { return }
        if let tls { return readTLS(tls) }
        if endPending { return failed() }
        var extent = iovec()
        guard evbuffer_reserve_space(input, directRead, &extent, 1) >= 1 else { return failed() }
        let direct = min(extent.iov_len, directRead)
        // `recv` into the extent, and into the spill only when the extent filled: a request or
        // a small response is one `recv`. Not `readv` or `recvmsg` of both at once: `perf`
        // (cpu-clock sampling under the `lua` benchmark's load) put the vectors' import and
        // `readv`'s file layer (`fdget_pos`, `rw_verify_area`) at 1–2 % of a worker's time,
        // which `recv`'s single buffer does not pay (nginx reads with `recvfrom`).
        let n = recv(fd, extent.iov_base, direct, 0)
        if n > 0 {
            var spilled = 0
            if n == direct {
                // More may be waiting. An end or an error met here is told after these bytes,
                // on the read event's next pass (`endPending`): reading an error clears it
                // from the socket, so the next `recv` would see a clean end instead.
                spilled = recv(fd, spill.baseAddress, spill.count, 0)
                if spilled == 0 || (spilled < 0 && !Self.wouldBlockOrInterrupted) {
                    endPending = true
                    if spilled < 0 { endedWithError = true }
                }
                spilled = max(0, spilled)
            }
            extent.iov_len = n
            evbuffer_commit_space(input, &extent, 1)
            if spilled > 0 { evbuffer_add(input, spill.baseAddress, spilled) }
            adaptDirectRead(n + spilled)
            armRead()
            owner?.socketReadable()
        } else if n == 0 {
            failed()
        } else if !Self.wouldBlockOrInterrupted {
            endedWithError = true
            failed()
        }
    }

    /// Reads decrypted bytes while OpenSSL holds some (read-ahead reads up to a record
    /// buffer's worth per `read`) and `input` is under the watermark, then tells the owner. An
    /// end seen after some bytes is told on the read event's next pass, which `armRead`
    /// activates (the owner may close the socket while it handles the bytes).
    private func readTLS(_ tls: OpaquePointer) {
        if tlsEnded { return failed() }
        var total = 0
        while evbuffer_get_length(input) < Self.inputHighWatermark {
            var vector = iovec()
            guard evbuffer_reserve_space(input, directRead, &vector, 1) >= 1 else { return failed() }
            ERR_clear_error()  // SSL_get_error reads the thread's queue (libcurl's leftovers too)
            let n = SSL_read(tls, vector.iov_base, Int32(min(vector.iov_len, directRead)))
            if n > 0 {
                vector.iov_len = Int(n)
                evbuffer_commit_space(input, &vector, 1)
                total += Int(n)
                // Nothing buffered in OpenSSL: the next `SSL_read` would be a `read` that
                // most likely finds nothing. The event is level-triggered: bytes still in the
                // kernel make it fire again.
                if SSL_has_pending(tls) == 0 { break }
                continue
            }
            let error = SSL_get_error(tls, n)
            ERR_clear_error()
            if error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE { break }
            // SSL_ERROR_ZERO_RETURN is close_notify, a clean end; anything else (a close
            // without close_notify included) may be a cut, never the end of a body.
            if error != SSL_ERROR_ZERO_RETURN {
                endedWithError = true
                tlsEndedUncleanly = true
            }
            tlsEnded = true
            break
        }
        if total == 0 {
            if tlsEnded { failed() }
            return
        }
        adaptDirectRead(total)
        armRead()
        owner?.socketReadable()
    }

    /// An origin's socket that fills its direct extent is streaming a body: its reads grow
    /// (×4, up to `largeRead`) so that a large body moves in 64 KiB chains handed on without
    /// a copy, instead of 4 KiB ones plus a copy out of the spill buffer (a 1 GiB download
    /// ran at 0.73 of the libcurl transport's speed that way). Reads of a quarter or less
    /// shrink it back (halving), so a connection that serves small responses reserves 4 KiB.
    private func adaptDirectRead(_ n: Int) {
        if n >= directRead {
            if directRead < maxDirectRead { directRead = min(directRead * 4, maxDirectRead) }
        } else if n <= directRead / 4, directRead > Self.smallRead {
            directRead = max(directRead / 2, Self.smallRead)
        }
    }

    /// Writes as much of `output` as the kernel takes now, in one `send` or `sendmsg` (or, with
    /// file segments queued, a `writev` and `sendfile`s: `writePlain`); what is left is
    /// written when the socket is writable again. False when the peer is gone (the owner is
    /// told through `socketClosed`, never from inside this call).
    @discardableResult
    func flush() -> Bool {
        guard open else { return false }
        if let tls {
            guard writeTLS(tls) else { return false }
        } else if evbuffer_get_length(output) > 0 {
            guard writePlain() else { return false }
        }
        let left = evbuffer_get_length(output)
        if (left > 0) != writeArmed {
            writeArmed = left > 0
            if writeArmed { makeWriteEvent().arm() } else { writeEvent?.stop() }
        }
        return true
    }

    var pendingOutput: Int { evbuffer_get_length(output) }

    /// Whether `output` may hold file segments (`sendFiles()`).
    private var sendsFiles = false

    /// `output` is about to hold file segments (a disk hit the kernel sends, `DiskHitStream`):
    /// libevent then writes each with `sendfile(2)` from its file instead of copying it into
    /// the buffer (`EVBUFFER_FLAG_DRAINS_TO_FD`). Only for a socket without TLS.
    func sendFiles() {
        guard tls == nil, !sendsFiles else { return }
        sendsFiles = true
        evbuffer_set_flags(output, UInt64(EVBUFFER_FLAG_DRAINS_TO_FD))
    }

    /// Writes `output`: memory chains alone with `sendChains`; with file segments queued, with
    /// `evbuffer_write`: memory chains in one `writev`, which stops at a file segment; a file
    /// segment with one `sendfile`. With file segments queued it writes
    /// again while the kernel takes bytes, so a response's head and the file's bytes after it
    /// leave in the same pass (not one loop pass apart). False when the connection failed —
    /// or when `sendfile` found its file shorter than the segment (libevent reports that as 0
    /// bytes without an errno: a body file truncated behind the tier), so the rest can never
    /// be sent.
    private func writePlain() -> Bool {
        if !sendsFiles { return sendChains() }
        while true {
            if sendsFiles { errno = 0 }
            let n = evbuffer_write(output, fd)
            if n < 0 { return Self.wouldBlockOrInterrupted }
            if n == 0 { return !(sendsFiles && errno == 0) }
            if !sendsFiles || evbuffer_get_length(output) == 0 { return true }
        }
    }

    /// Writes `output`'s memory chains (the first `sendVectors`) in one `send`, or one
    /// `sendmsg` when there are several: the socket's own path, where `evbuffer_write`'s
    /// `writev` goes through the file layer first (`fdget_pos`, `rw_verify_area`,
    /// `sock_write_iter`), and `send` of one chain imports no vector at all. What the kernel
    /// does not take stays in `output` for the write event. False when the connection failed.
    private func sendChains() -> Bool {
        withUnsafeTemporaryAllocation(of: iovec.self, capacity: Self.sendVectors) { vectors in
            let count = min(Int(evbuffer_peek(output, -1, nil, vectors.baseAddress, Int32(vectors.count))), vectors.count)
            guard count > 0 else { return true }
            let n: Int
            if count == 1 {
                n = send(fd, vectors[0].iov_base, vectors[0].iov_len, Int32(MSG_NOSIGNAL))
            } else {
                var message = msghdr()
                message.msg_iov = vectors.baseAddress
                message.msg_iovlen = count
                n = sendmsg(fd, &message, Int32(MSG_NOSIGNAL))
            }
            if n < 0 { return Self.wouldBlockOrInterrupted }
            evbuffer_drain(output, n)
            return true
        }
    }

    /// Whether the call that just failed may be tried again later (`errno` is EAGAIN,
    /// EWOULDBLOCK or EINTR), not a failed connection.
    private static var wouldBlockOrInterrupted: Bool { errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR }

    /// The most chains one `sendChains` writes: `evbuffer_write`'s own bound (an upload
    /// relayed from a client's socket arrives in 4 KiB chains).
    private static let sendVectors = 128

    /// `SSL_write`s `output`'s chains until it is empty or the kernel's buffer is full; false
    /// when the session failed.
    private func writeTLS(_ tls: OpaquePointer) -> Bool {
        while evbuffer_get_length(output) > 0 {
            var vector = iovec()
            guard evbuffer_peek(output, -1, nil, &vector, 1) >= 1 else { return true }
            ERR_clear_error()
            let n = SSL_write(tls, vector.iov_base, Int32(min(vector.iov_len, Int(Int32.max))))
            if n > 0 {
                evbuffer_drain(output, Int(n))
                continue
            }
            let error = SSL_get_error(tls, n)
            ERR_clear_error()
            // WANT_READ would mean a renegotiation, which the context refuses.
            if error == SSL_ERROR_WANT_WRITE || error == SSL_ERROR_WANT_READ { return true }
            endedWithError = true
            return false
        }
        return true
    }

    private func writeNow() {
        guard open else { return }
        guard flush() else {
            endedWithError = true
            return failed()
        }
        if evbuffer_get_length(output) <= Self.outputLowWatermark { owner?.socketDrained() }
    }

    private func failed() {
        guard open else { return }
        stopEvents()
        owner?.socketClosed()
    }

    private func stopEvents() {
        if readArmed { readEvent.stop() }
        if writeArmed { writeEvent?.stop() }
        if closedCheckArmed { closedCheck?.stop() }
        closedCheckArmed = false
        readArmed = false
        writeArmed = false
        open = false
    }

    /// Frees everything and closes the descriptor; `abortive`: with a reset (RST) instead of
    /// a FIN, for a response only the connection's end frames, cut short.
    func close(abortive: Bool = false) {
        let open = self.open
        release()
        if let tls {
            // close_notify, best effort (one non-blocking write), unless the session failed.
            if open, !abortive, !endedWithError {
                ERR_clear_error()
                SSL_shutdown(tls)
            }
            ERR_clear_error()
            SSL_free(tls)
        }
        if abortive {
            var linger = Glibc.linger(l_onoff: 1, l_linger: 0)
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &linger, socklen_t(MemoryLayout<Glibc.linger>.size))
        }
        Glibc.close(fd)
    }

    /// Frees everything but the descriptor, which the caller takes over (interception hands
    /// it to a TLS bufferevent). Unconsumed input and unsent output are dropped.
    func detach() -> Int32 {
        release()
        return fd
    }

    private func release() {
        guard readEvent != nil else { return }
        open = false
        // The events before the descriptor and the buffers (they may be dropped from within
        // their own callbacks: each lives until its callback returns).
        closedCheck = nil
        closedCheckArmed = false
        readEvent = nil
        writeEvent = nil
        evbuffer_free(input)
        evbuffer_free(output)
    }
}
