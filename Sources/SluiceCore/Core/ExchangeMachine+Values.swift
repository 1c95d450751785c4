/// The values an `ExchangeMachine` exchanges with the I/O around it: where a try goes, the
/// facts of a response head, and the fixed-size answer one event returns.
extension ExchangeMachine {
    /// Where a try goes, as the I/O parsed it (`RequestTarget`).
    public struct Target: Sendable, Equatable {
        /// As written in the URL, without brackets for an IPv6 literal.
        public var host: String
        public var port: Int
        public var url: String
        public init(host: String, port: Int, url: String) {
            self.host = host
            self.port = port
            self.url = url
        }
        /// `host:port`, an IPv6 literal in brackets (as error messages print it).
        public var authority: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
    }

    /// A try's final response head, with the fields the machine asked for
    /// (`responseFields(for:)`); a field not asked for may be left nil.
    public struct ResponseHead: Sendable, Equatable {
        public var status: Int
        public var retryAfter: String?
        public var contentType: String?
        public var location: String?
        public init(status: Int, retryAfter: String? = nil, contentType: String? = nil, location: String? = nil) {
            self.status = status
            self.retryAfter = retryAfter
            self.contentType = contentType
            self.location = location
        }
    }

    /// The response fields a decision about a status needs.
    public struct ResponseFields: OptionSet, Sendable {
        public let rawValue: UInt8
        public init(rawValue: UInt8) { self.rawValue = rawValue }
        public static let retryAfter = ResponseFields(rawValue: 1)
        public static let contentType = ResponseFields(rawValue: 2)
        public static let location = ResponseFields(rawValue: 4)
    }

    /// The monitor events one event reports, in order; a fixed-size value (no allocation).
    public struct Reports: RandomAccessCollection {
        /// The most one event reports: a trust failure's event and the retry's.
        public static let capacity = 3
        // Stored properties rather than a tuple: the compiler copies and destroys a struct's
        // fields with direct code, a tuple of enums through the runtime's generic tuple
        // witnesses (measured: 2.2k instructions a request more).
        private var r0: ProxyEvent?
        private var r1: ProxyEvent?
        private var r2: ProxyEvent?
        public private(set) var endIndex = 0
        public var startIndex: Int { 0 }

        public init() {}

        public subscript(position: Int) -> ProxyEvent {
            precondition(position >= 0 && position < endIndex, "report index out of range")
            switch position {
            case 0: return r0!
            case 1: return r1!
            default: return r2!
            }
        }

        mutating func append(_ event: ProxyEvent) {
            switch endIndex {
            case 0: r0 = event
            case 1: r1 = event
            case 2: r2 = event
            default: preconditionFailure("more than \(Self.capacity) reports for one event")
            }
            endIndex += 1
        }

        /// Calls `body` with each event, in order (no iterator: this runs for every exchange
        /// a monitor watches).
        public func forEachEvent(_ body: (ProxyEvent) -> Void) {
            guard let r0 else { return }
            body(r0)
            guard let r1 else { return }
            body(r1)
            if let r2 { body(r2) }
        }
    }

    /// What one event answers: its reports, then at most one command of the event's own type
    /// (nil: nothing to do, as for an event out of turn).
    public struct Answer<Command> {
        public internal(set) var reports = Reports()
        public internal(set) var command: Command?
        init() {}
    }
}
