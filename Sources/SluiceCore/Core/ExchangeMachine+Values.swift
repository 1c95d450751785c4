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

    /// The monitor events one event reports, in order: the first inline, any more boxed (a
    /// trust failure's event and the retry's: rare, and allocated only then).
    public struct Reports: RandomAccessCollection {
        /// The most one event reports: a trust failure's event and the retry's.
        public static let capacity = 3
        // The first event inline and the rest boxed rather than three inline events: every
        // step of every exchange returns a `Reports` (inside its `Answer`), and three inline
        // events made it 300 bytes, copied with `memcpy` on every return (measured: 900
        // instructions a request). The box is a nil reference on the common path (an empty
        // array would still be retained and released with every copy).
        @usableFromInline var first: ProxyEvent?
        /// The second and third events; a box is never changed once made (a copy of the
        /// reports shares it).
        @usableFromInline var more: Box<[ProxyEvent]>?

        public var endIndex: Int { first == nil ? 0 : 1 + (more?.value.count ?? 0) }
        public var startIndex: Int { 0 }

        public init() {}

        public subscript(position: Int) -> ProxyEvent {
            precondition(position >= 0 && position < endIndex, "report index out of range")
            return position == 0 ? first! : more!.value[position - 1]
        }

        mutating func append(_ event: ProxyEvent) {
            precondition(endIndex < Self.capacity, "more than \(Self.capacity) reports for one event")
            if first == nil {
                first = event
            } else {
                more = Box((more?.value ?? []) + [event])
            }
        }

        /// Calls `body` with each event, in order (no iterator: this runs for every exchange
        /// a monitor watches; inlined into the caller, the common case is one test).
        @inlinable
        public func forEachEvent(_ body: (ProxyEvent) -> Void) {
            guard let first else { return }
            body(first)
            guard let more else { return }
            for event in more.value { body(event) }
        }
    }

    /// What one event answers: its reports, then at most one command of the event's own type
    /// (nil: nothing to do, as for an event out of turn).
    public struct Answer<Command> {
        public internal(set) var reports = Reports()
        public internal(set) var command: Command?
        init() {}

        /// Built from its parts where it is returned: a local `var answer` returned whole was
        /// copied through the type's value witness and destroyed (~300 instructions a step),
        /// because its events and commands are enums too complex to copy inline.
        init(reports: consuming Reports, command: consuming Command?) {
            self.reports = reports
            self.command = command
        }
    }
}
