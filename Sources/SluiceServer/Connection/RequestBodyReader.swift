import SluiceCore

/// What curl uploads for one exchange: the client's decoded request body, passed through the
/// adapters' streaming encoders (deflate), and kept for replay while it is small enough
/// (a redirect that must resend the body: 307/308).
///
/// Owned by one `Exchange`, on the worker's thread.
final class RequestBodyReader {
    /// The most bytes kept for replay (0: none).
    let replayLimit: Int

    private var encoders: [any BodyEncoder]
    /// Encoded bytes not yet handed to curl.
    private var pending: [UInt8] = []
    private var pendingOffset = 0
    private var encodedEnd = false
    /// What was handed to curl so far, while replay is possible; nil once it is not.
    private(set) var replay: [UInt8]?
    private var replayOffset: Int?
    /// What this try sends instead of `replay` (a script's `req:set_body`,
    /// `TryAdaptersStage`); nil: `replay`. Each try sets it again.
    private var replacement: [UInt8]?
    private var scratch: [UInt8] = []

    init(encoders: [any BodyEncoder], replayLimit: Int) {
        self.encoders = encoders
        self.replayLimit = replayLimit
        replay = replayLimit > 0 ? [] : nil
    }

    /// Installs the adapters' encoders; before the first byte is read.
    func setEncoders(_ encoders: [any BodyEncoder]) { self.encoders = encoders }

    /// True when the whole body was read and can be sent again.
    func canReplay(clientBodyDone: Bool) -> Bool { clientBodyDone && replay != nil && (encoders.isEmpty || encodedEnd) }

    /// Starts sending the kept body again from its first byte.
    func rewindForReplay() { replayOffset = 0 }

    /// The body this try sends (`bytes`, from its first byte) in place of the kept one; nil:
    /// the kept one. Kept across rewinds within the try (libcurl's seek).
    func replaceForThisTry(_ bytes: [UInt8]?) {
        replacement = bytes
        if bytes != nil { replayOffset = 0 }
    }

    /// Fills `buffer` for curl. `readClient` reads decoded client body bytes (nil: none yet,
    /// 0: the body ended). Returns bytes written, 0 at the end, nil when curl must pause.
    func read(
        into buffer: UnsafeMutableRawPointer, capacity: Int,
        readClient: (UnsafeMutableRawPointer, Int) throws(ProxyError) -> Int?
    ) throws(ProxyError) -> Int? {
        if let offset = replayOffset, let source = replacement ?? replay {
            let n = min(capacity, source.count - offset)
            source.withUnsafeBytes { buffer.copyMemory(from: $0.baseAddress! + offset, byteCount: n) }
            replayOffset = offset + n
            return n
        }
        let n: Int?
        if encoders.isEmpty {
            n = try readClient(buffer, capacity)
        } else {
            n = try readEncoded(into: buffer, capacity: capacity, readClient: readClient)
        }
        if let n, n > 0, replay != nil {
            if replay!.count + n > replayLimit {
                replay = nil
            } else {
                replay!.append(contentsOf: UnsafeRawBufferPointer(start: buffer, count: n))
            }
        }
        return n
    }

    private func readEncoded(
        into buffer: UnsafeMutableRawPointer, capacity: Int,
        readClient: (UnsafeMutableRawPointer, Int) throws(ProxyError) -> Int?
    ) throws(ProxyError) -> Int? {
        while pendingOffset == pending.count {
            if encodedEnd { return 0 }
            pending.removeAll(keepingCapacity: true)
            pendingOffset = 0
            if scratch.count < capacity { scratch = [UInt8](repeating: 0, count: capacity) }
            let result: Result<Int?, ProxyError> = scratch.withUnsafeMutableBytes { raw in
                do throws(ProxyError) {
                    return .success(try readClient(raw.baseAddress!, capacity))
                } catch {
                    return .failure(error)
                }
            }
            let got = try result.get()
            guard let got else { return nil }
            do {
                try encode(scratch, count: got, finish: got == 0)
            } catch {
                throw .malformedRequest("request body encoding failed: \(error)")
            }
            if got == 0 { encodedEnd = true }
        }
        let n = min(capacity, pending.count - pendingOffset)
        pending.withUnsafeBytes { buffer.copyMemory(from: $0.baseAddress! + pendingOffset, byteCount: n) }
        pendingOffset += n
        return n
    }

    /// Runs `count` bytes of `input` through every encoder in order.
    private func encode(_ input: [UInt8], count: Int, finish: Bool) throws {
        var stage = Array(input.prefix(count))
        for (index, encoder) in encoders.enumerated() {
            var out: [UInt8] = []
            try stage.withUnsafeBytes { try encoder.encode($0, finish: finish, into: &out) }
            if index == encoders.count - 1 {
                pending.append(contentsOf: out)
            } else {
                stage = out
            }
        }
    }
}
