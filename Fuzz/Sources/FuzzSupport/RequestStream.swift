import SluiceCore
import SluiceServer

/// What an `HTTPRequestParser` made of a byte stream, flattened so that two runs over the
/// same bytes cut differently can be compared.
public struct RequestStream: Equatable {
    public struct Head: Equatable {
        public var bytes: [UInt8]
        public var framing: HTTPRequestHead.BodyFraming
    }

    public var heads: [Head] = []
    /// One decoded body per head that has one (possibly unfinished).
    public var bodies: [[UInt8]] = []
    public var ends = 0
    /// The error that stopped the stream, as text (`ProxyError` is not `Equatable`).
    public var error: String?
    /// Bytes consumed when the stream ended without an error (0 after an error: how far a
    /// failing parser got depends on the cuts).
    public var consumed = 0
    /// Where the parser stood idle (after `.end` or a bodiless head): the starts of the
    /// requests that followed.
    public var idleOffsets: [Int] = []

    /// Feeds `input` to a parser with `limits`, revealing it in pieces of the sizes `cuts`
    /// yields (nil: all at once), and running the parser until it wants more after each piece,
    /// as `ClientConnection` does. Checks the parser's contract on every call: it never
    /// consumes more than it was given, body ranges lie within the bytes consumed by that call,
    /// and it makes progress (a call that consumes nothing and reports nothing ends the round).
    public static func parse(
        _ input: UnsafeRawBufferPointer, limits: HTTPRequestParser.Limits,
        cuts: ((Int) -> Int)? = nil
    ) -> RequestStream {
        var parser = HTTPRequestParser(limits: limits)
        var out = RequestStream()
        var start = 0  // first byte not consumed
        var available = 0  // bytes revealed so far
        var calls = 0
        while available < input.count || available == 0 {
            available = min(input.count, available + max(1, cuts?(available) ?? input.count))
            while true {
                calls += 1
                fuzzCheck(calls <= 4 * input.count + 16, "parser makes no progress")
                let window = UnsafeRawBufferPointer(rebasing: input[start..<available])
                let consumed: Int
                let event: HTTPRequestParser.Event?
                do {
                    (consumed, event) = try parser.parse(window)
                } catch {
                    out.error = "\(error)"
                    return out
                }
                fuzzCheck(consumed >= 0 && consumed <= window.count, "consumed \(consumed) of \(window.count)")
                switch event {
                case .head(let head)?:
                    out.heads.append(Head(bytes: head.bytes, framing: head.framing))
                    if head.hasBody { out.bodies.append([]) }
                case .body(let range)?:
                    fuzzCheck(
                        range.lowerBound >= 0 && range.upperBound <= consumed && !range.isEmpty,
                        "body range \(range) outside the \(consumed) bytes consumed")
                    fuzzCheck(!out.bodies.isEmpty, "body before a head with a body")
                    out.bodies[out.bodies.count - 1] += window[range]
                case .end?:
                    fuzzCheck(!out.bodies.isEmpty, "end before a head with a body")
                    out.ends += 1
                case nil:
                    break
                }
                start += consumed
                if parser.isIdle, event != nil { out.idleOffsets.append(start) }
                if event == nil && consumed == 0 { break }
                if start == available && event == nil { break }
            }
            if input.isEmpty { break }
        }
        out.consumed = start
        return out
    }
}

/// A small deterministic generator (SplitMix64) for cut sizes derived from the input.
public struct SplitMix {
    var state: UInt64
    public init(seed: UInt64) { state = seed }
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
