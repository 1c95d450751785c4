/// Whether a worker may ask Redis now (`fleet:`, docs/fleet.md): a command that misses its
/// timeout, or fails, counts; after `failuresToPause` in a row the worker stops asking for a
/// pause that doubles from `firstPause` up to `maxPause` while the failures go on, and one
/// success ends the episode. Episodes are what the log reports (once each way) and what the
/// fallback counter counts by.
///
/// Threading: a value; each worker's `RedisClient` owns one.
public struct RedisHealth: Sendable, Equatable {
    public static let failuresToPause = 3
    public static let firstPause = 100
    public static let maxPause = 5000

    public private(set) var consecutiveFailures = 0
    /// Monotonic ms until which no command is sent (0: none).
    public private(set) var pausedUntil = 0
    private var nextPause = RedisHealth.firstPause
    /// Failures have started an episode that no success has ended yet.
    public private(set) var inEpisode = false

    public init() {}

    /// Whether a command may be sent at `now` (monotonic ms).
    public func usable(now: Int) -> Bool { now >= pausedUntil }

    /// A command failed (or the connection did): true when this starts an episode.
    public mutating func failed(now: Int) -> Bool {
        consecutiveFailures += 1
        guard consecutiveFailures >= Self.failuresToPause else { return false }
        pausedUntil = now + nextPause
        nextPause = min(nextPause * 2, Self.maxPause)
        consecutiveFailures = 0
        defer { inEpisode = true }
        return !inEpisode
    }

    /// A command answered in time: true when this ends an episode.
    public mutating func succeeded() -> Bool {
        consecutiveFailures = 0
        nextPause = Self.firstPause
        pausedUntil = 0
        defer { inEpisode = false }
        return inEpisode
    }
}
