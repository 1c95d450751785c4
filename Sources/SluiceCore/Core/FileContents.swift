#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A small file read whole with `open`/`read`: a configuration, a script, a key, a users or
/// credentials file. Foundation's `FileManager` would do the same and bring its libraries
/// (and ICU's data) into every Sluice process (BENCHMARKS.md, "Memory at rest").
///
/// Threading: any thread; nothing is shared.
public enum FileContents {
    /// Files larger than this are refused (`EFBIG`): none of the files Sluice reads is near it.
    public static let defaultLimit = 16 << 20

    /// The file's bytes; nil when it cannot be opened or read, or is larger than `limit`
    /// (`errno` says why).
    public static func bytes(atPath path: String, limit: Int = defaultLimit) -> [UInt8]? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var out: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n < 0 {
                if errno == EINTR { continue }
                return nil
            }
            if n == 0 { return out }
            out += chunk[0..<n]
            if out.count > limit {
                errno = EFBIG
                return nil
            }
        }
    }

    /// The file's text; nil when it cannot be read or is not UTF-8.
    public static func text(atPath path: String, limit: Int = defaultLimit) -> String? {
        bytes(atPath: path, limit: limit).flatMap { String(validating: $0, as: UTF8.self) }
    }

    /// Whether this process may read the file (`access(2)`, as `FileManager.isReadableFile`).
    public static func isReadable(atPath path: String) -> Bool { access(path, R_OK) == 0 }

    /// The path's last component (`/etc/sluice/sign.lua` → `sign.lua`).
    public static func lastComponent(of path: String) -> String {
        var trimmed = Substring(path)
        while trimmed.count > 1, trimmed.last == "/" { trimmed = trimmed.dropLast() }
        guard let slash = trimmed.lastIndex(of: "/"), trimmed.count > 1 else { return String(trimmed) }
        return String(trimmed[trimmed.index(after: slash)...])
    }

    /// `path` beside the file `file` (`/etc/sluice/sluice.yaml`, `sign.lua` →
    /// `/etc/sluice/sign.lua`); `path` itself when it is absolute or `file` has no directory.
    public static func path(_ path: String, besideFile file: String) -> String {
        guard !path.hasPrefix("/"), let slash = file.lastIndex(of: "/") else { return path }
        return String(file[...slash]) + path
    }

    /// The value of the environment variable `name`, if it is set.
    public static func environment(_ name: String) -> String? {
        getenv(name).map { String(cString: $0) }
    }
}
