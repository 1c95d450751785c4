/// A whole Sluice configuration: the server settings (fixed for the process's life, apart
/// from listeners and routes) and the pipeline (swapped as a unit on reload).
public struct SluiceConfiguration: Sendable {
    public var server: ServerConfiguration
    public var pipeline: Pipeline

    public init(server: ServerConfiguration = ServerConfiguration(), pipeline: Pipeline = Pipeline()) {
        self.server = server
        self.pipeline = pipeline
    }
}
