import CZlib
import HTTPTypes

/// The `deflate` adapter (Alamofire's `DeflateRequestCompressor`): compresses the request
/// body with zlib-wrapped deflate (RFC 1950, what `Content-Encoding: deflate` means) as it
/// streams — the body never has to fit in memory — and sets `Content-Encoding: deflate`.
public struct DeflateRequestCompressor: SynchronousRequestAdapter, BodyEncoderFactory {
    /// What to do when the request already has a `Content-Encoding` (Alamofire's
    /// `DuplicateHeaderBehavior`).
    public enum DuplicateHeaderBehavior: String, Sendable {
        /// Fail the request: double encoding is almost always a mistake. The default.
        case error
        /// Compress anyway and replace the existing value.
        case replace
        /// Leave the request untouched.
        case skip
    }

    /// `0` by default: every body is compressed.
    public static let defaultMinBytes: Int64 = 0
    public static let defaultDuplicateHeaderBehavior = DuplicateHeaderBehavior.error

    public var name: String { "deflate" }
    /// Bodies whose `Content-Length` is below this are sent as they are. A body of unknown
    /// length (chunked) is always compressed, since its size is known only at its end.
    public let minBytes: Int64
    public let duplicateHeaderBehavior: DuplicateHeaderBehavior

    public init(
        minBytes: Int64 = Self.defaultMinBytes,
        duplicateHeaderBehavior: DuplicateHeaderBehavior = Self.defaultDuplicateHeaderBehavior
    ) {
        self.minBytes = minBytes
        self.duplicateHeaderBehavior = duplicateHeaderBehavior
    }

    public func adaptInPlace(_ request: inout ProxyRequest) throws(AdaptationError) -> Bool {
        switch request.body {
        case .none, .length(0): return true
        case .length(let n) where n < minBytes: return true
        default: break
        }
        if request.headerFields[.contentEncoding] != nil {
            switch duplicateHeaderBehavior {
            case .error:
                throw AdaptationError(adapter: name, reason: "the request already has a Content-Encoding header")
            case .skip:
                return true
            case .replace:
                break
            }
        }
        request.headerFields[.contentEncoding] = "deflate"
        request.body = .streamed
        request.bodyEncoders.append(self)
        return true
    }

    public func makeEncoder() -> any BodyEncoder { DeflateEncoder() }
}

extension RequestAdapter where Self == DeflateRequestCompressor {
    public static var deflateCompressor: DeflateRequestCompressor { DeflateRequestCompressor() }
}

/// One zlib stream. Owned by one exchange; not thread-safe.
final class DeflateEncoder: BodyEncoder {
    private var stream = z_stream()
    private var finished = false
    private static let chunk = 64 * 1024

    init() {
        let rc = deflateInit_(&stream, Z_DEFAULT_COMPRESSION, ZLIB_VERSION, Int32(MemoryLayout<z_stream>.size))
        precondition(rc == Z_OK, "deflateInit failed: \(rc)")
    }

    deinit { deflateEnd(&stream) }

    struct ZlibError: Error, CustomStringConvertible {
        let code: Int32
        var description: String { "zlib error \(code)" }
    }

    func encode(_ input: UnsafeRawBufferPointer, finish: Bool, into output: inout [UInt8]) throws {
        guard !finished else { return }
        let flush = finish ? Z_FINISH : Z_NO_FLUSH
        stream.next_in = UnsafeMutablePointer(mutating: input.baseAddress?.assumingMemoryBound(to: Bytef.self))
        stream.avail_in = UInt32(input.count)
        while true {
            let start = output.count
            output.append(contentsOf: repeatElement(0, count: Self.chunk))
            let rc: Int32 = output.withUnsafeMutableBufferPointer { buf in
                stream.next_out = buf.baseAddress! + start
                stream.avail_out = UInt32(Self.chunk)
                return deflate(&stream, flush)
            }
            output.removeLast(Int(stream.avail_out))
            if rc == Z_STREAM_END {
                finished = true
                return
            }
            guard rc == Z_OK || rc == Z_BUF_ERROR else { throw ZlibError(code: rc) }
            if stream.avail_in == 0 && stream.avail_out != 0 && !finish { return }
            if rc == Z_BUF_ERROR && stream.avail_in == 0 && !finish { return }
        }
    }
}
