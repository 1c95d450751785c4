/// The origin's answer to an upgrade handshake, read from the raw bytes of a connection
/// Sluice speaks on itself (`UpgradeTransfer`): the response head, line by line through a
/// `ResponseHeadCollector` (the same one every forwarded response goes through), then — for
/// an answer other than `101` — where its body ends, so that the answer is relayed as a
/// complete response and the connection closed after it. A chunked body is framed by
/// `ChunkedDecoder`, the decoder both HTTP/1.1 parsers use, so a relayed body ends where a
/// strict client finds its end.
///
/// A value type fed bytes: `read` says how many it consumed and what they completed; tested
/// with input split at every byte (`UpgradeResponseReaderTests`).
///
/// Threading: a value owned by its `UpgradeTransfer`, on the worker's thread.
struct UpgradeResponseReader {
    /// How a final (non-101) answer's body is delimited on the origin connection.
    enum BodyFraming: Equatable {
        case none
        case length(UInt64)
        case chunked
        /// Ends when the origin closes.
        case close
    }

    enum Event: Equatable {
        /// `101`: the bytes after the consumed ones belong to the new protocol.
        case switched
        /// A final answer's head is complete; its body follows, framed so.
        case answered(BodyFraming)
        /// The body of a final answer ended at the consumed bytes.
        case bodyEnded
    }

    enum Failure: Error, Equatable {
        case headTooLarge
        case malformed(String)
    }

    /// The longest response head accepted (64 KiB).
    static let maxHeadBytes = 64 * 1024

    private enum State {
        case head
        case body(BodyFraming)
        /// A chunked body, read by `chunked`.
        case chunked
        case done
    }

    private(set) var head = ResponseHeadCollector()
    private var state = State.head
    /// Sizes of up to 16 hex digits; a trailer section as large as a head, any number of
    /// fields within it.
    private var chunked = ChunkedDecoder(
        rules: ChunkedDecoder.Rules(sizeDigits: 16, body: nil, trailerSection: maxHeadBytes, trailerFields: nil))
    private var line: [UInt8] = []
    private var headBytes = 0
    /// Where a `.length` body stands.
    private var remaining: UInt64 = 0

    /// The body bytes of a final answer still to come, for `.length` framing.
    var isInBody: Bool {
        switch state {
        case .head, .done: return false
        default: return true
        }
    }

    /// Consumes bytes up to the first event (or all of them). A body is consumed without
    /// being copied: the caller relays the consumed body bytes itself.
    mutating func read(_ bytes: UnsafeRawBufferPointer) throws(Failure) -> (consumed: Int, event: Event?) {
        var i = 0
        while i < bytes.count {
            switch state {
            case .head:
                let b = bytes[i]
                i += 1
                headBytes += 1
                guard headBytes <= Self.maxHeadBytes else { throw .headTooLarge }
                line.append(b)
                guard b == 0x0A else { continue }
                let completedFinal = line.withUnsafeBytes { head.add($0) }
                let empty = line.count <= 2
                line.removeAll(keepingCapacity: true)
                if empty && head.status == 0 { throw .malformed("no status line") }
                if empty && head.status == 101 { return (i, .switched) }
                if completedFinal {
                    let framing = try Self.framing(of: head)
                    switch framing {
                    case .none: state = .done
                    case .length(let n):
                        remaining = n
                        state = n == 0 ? .done : .body(framing)
                    case .chunked: state = .chunked
                    case .close: state = .body(.close)
                    }
                    return (i, .answered(framing))
                }
            case .body(.length):
                let n = min(UInt64(bytes.count - i), remaining)
                remaining -= n
                i += Int(n)
                if remaining == 0 {
                    state = .done
                    return (i, .bodyEnded)
                }
            case .body:
                return (bytes.count, nil)  // close-delimited: everything is body
            case .chunked:
                do throws(ChunkedDecoder.Failure) {
                    // Data needs no event: the caller relays every consumed byte itself.
                    let (n, event) = try chunked.decode(UnsafeRawBufferPointer(rebasing: bytes[i...]))
                    i += n
                    if event == .end {
                        state = .done
                        return (i, .bodyEnded)
                    }
                } catch {
                    if case .trailerSectionTooLarge = error { throw .headTooLarge }
                    throw .malformed(error.reason)
                }
            case .done:
                return (i, nil)
            }
        }
        return (i, nil)
    }

    /// RFC 9112 §6.3 for a response to a GET: bodiless statuses, then Transfer-Encoding
    /// (chunked last, else read to the close), then Content-Length, else to the close.
    static func framing(of head: ResponseHeadCollector) throws(Failure) -> BodyFraming {
        if head.status == 204 || head.status == 304 || head.status < 200 { return .none }
        if let te = head.value("transfer-encoding") {
            let last = te.split(separator: ",").last.map { $0.trimmingCharacters(in: " \t").lowercased() }
            return last == "chunked" ? .chunked : .close
        }
        if let cl = head.value("content-length") {
            guard let n = UInt64(cl) else { throw .malformed("invalid Content-Length") }
            return .length(n)
        }
        return .close
    }
}

extension Substring {
    fileprivate func trimmingCharacters(in set: String) -> String {
        var s = self[...]
        while let c = s.first, set.contains(c) { s = s.dropFirst() }
        while let c = s.last, set.contains(c) { s = s.dropLast() }
        return String(s)
    }
}
