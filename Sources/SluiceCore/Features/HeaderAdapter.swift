import HTTPTypes

/// The `headers` adapter: removes, then sets (replacing), then adds request fields.
public struct HeaderAdapter: HeaderEditingAdapter {
    public var name: String { "headers" }
    public let set: [(HTTPField.Name, String)]
    public let add: [(HTTPField.Name, String)]
    public let remove: [HTTPField.Name]

    public init(
        set: [(HTTPField.Name, String)] = [], add: [(HTTPField.Name, String)] = [],
        remove: [HTTPField.Name] = []
    ) {
        self.set = set
        self.add = add
        self.remove = remove
    }

    public var headerEdits: [HeaderEdit]? {
        remove.map { .remove($0) } + set.map { .set($0.0, $0.1) } + add.map { .add($0.0, $0.1) }
    }

    public func adaptInPlace(_ request: inout ProxyRequest) throws(AdaptationError) -> Bool {
        for name in remove { request.headerFields[name] = nil }
        for (name, value) in set { request.headerFields[name] = value }
        for (name, value) in add { request.headerFields.append(HTTPField(name: name, value: value)) }
        return true
    }
}

extension RequestAdapter where Self == HeaderAdapter {
    /// Sets one field, replacing any existing ones.
    public static func header(_ name: HTTPField.Name, _ value: String) -> HeaderAdapter {
        HeaderAdapter(set: [(name, value)])
    }
}
