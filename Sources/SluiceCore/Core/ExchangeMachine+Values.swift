/// The values an `ExchangeMachine` exchanges with the I/O around it: where a try goes, the
/// facts of a response head, and the fixed-size list of actions one event returns.
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

    /// What one event asks for, in order; a fixed-size value (no allocation).
    public struct Actions: RandomAccessCollection {
        public static let capacity = 4
        // Four stored properties rather than a tuple: the compiler copies and destroys a
        // struct's fields with direct code, a tuple of enums through the runtime's generic
        // tuple witnesses (measured: 2.2k instructions a request more).
        private var a0: Action?
        private var a1: Action?
        private var a2: Action?
        private var a3: Action?
        public private(set) var endIndex = 0
        public var startIndex: Int { 0 }

        public init() {}

        public subscript(position: Int) -> Action {
            precondition(position >= 0 && position < endIndex, "action index out of range")
            switch position {
            case 0: return a0!
            case 1: return a1!
            case 2: return a2!
            default: return a3!
            }
        }

        mutating func append(_ action: Action) {
            switch endIndex {
            case 0: a0 = action
            case 1: a1 = action
            case 2: a2 = action
            case 3: a3 = action
            default: preconditionFailure("more than \(Self.capacity) actions for one event")
            }
            endIndex += 1
        }

        /// Calls `body` with each reported event, in order (no iterator or copy of the
        /// other actions: this runs for every exchange a monitor watches).
        public func forEachReport(_ body: (ProxyEvent) -> Void) {
            if case .report(let event)? = a0 { body(event) } else { return }
            if case .report(let event)? = a1 { body(event) } else { return }
            if case .report(let event)? = a2 { body(event) } else { return }
            if case .report(let event)? = a3 { body(event) }
        }

        /// The action other than a report, if any (it comes after the reports).
        public var command: Action? {
            let last: Action?
            switch endIndex {
            case 0: return nil
            case 1: last = a0
            case 2: last = a1
            case 3: last = a2
            default: last = a3
            }
            guard let last, !last.isReport else { return nil }
            return last
        }
    }
}
