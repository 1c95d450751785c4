// swift-tools-version:6.0
import PackageDescription

// Swift checks at run time that no two accesses to a class's stored property overlap (one
// modifying): 5,700 instructions per forwarded request, 8 % of them (callgrind, 70,909 →
// 65,185). The builds the tests run keep the checks, so an overlap anywhere the suites
// reach traps there (`make unit`, `make fuzz`, `make sanitize` set SLUICE_EXCLUSIVITY_CHECKS=1); the products
// (`make build`, the .deb, the image, the benchmarks) leave them out of the two targets that
// run per request, as the standard library itself is built. docs/architecture.md, "Builds".
let perRequestTargets: [SwiftSetting] =
    Context.environment["SLUICE_EXCLUSIVITY_CHECKS"] == "1" ? [] : [.unsafeFlags(["-enforce-exclusivity=unchecked"])]

let package = Package(
    name: "Sluice",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "sluice", targets: ["sluice"]),
        .library(name: "SluiceCore", targets: ["SluiceCore"]),
        .library(name: "SluiceConfig", targets: ["SluiceConfig"]),
        .library(name: "SluiceServer", targets: ["SluiceServer"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-http-types.git", from: "1.8.0"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.4.1"),
    ],
    targets: [
        // One system-library target per C library (module map + pkg-config).
        .systemLibrary(name: "CLibEvent", pkgConfig: "libevent_pthreads", providers: [.apt(["libevent-dev"])]),
        // Headers only: libcurl is opened on first use (Sources/CShims/curl_loader.c), not linked.
        .systemLibrary(name: "CCurl", providers: [.apt(["libcurl4-openssl-dev"])]),
        .systemLibrary(name: "COpenSSL", pkgConfig: "openssl", providers: [.apt(["libssl-dev"])]),
        .systemLibrary(name: "CZlib", pkgConfig: "zlib", providers: [.apt(["zlib1g-dev"])]),
        .systemLibrary(name: "CSystemd", pkgConfig: "libsystemd", providers: [.apt(["libsystemd-dev"])]),
        // libxcrypt's crypt_r: bcrypt and SHA-256 crypt for access.proxy_auth's users file.
        .systemLibrary(name: "CCrypt", pkgConfig: "libcrypt", providers: [.apt(["libcrypt-dev"])]),
        // hiredis 0.14's asynchronous API on each worker's event_base (fleet:, docs/fleet.md).
        // (No pkgConfig: hiredis.pc adds -D_FILE_OFFSET_BITS=64, a flag SwiftPM refuses.)
        .systemLibrary(name: "CHiredis", providers: [.apt(["libhiredis-dev"])]),
        // PUC Lua 5.4 for the `lua` interceptor (Sources/SluiceCore/Lua/); its shim.h holds the
        // allocator, count hook and trampoline that keep Lua errors out of Swift frames.
        .systemLibrary(name: "CLua", pkgConfig: "lua5.4", providers: [.apt(["liblua5.4-dev"])]),
        // Typed wrappers for the variadic C calls and macros Swift cannot import.
        .target(name: "CShims", dependencies: ["CCurl", "CLibEvent", "COpenSSL"]),
        // The thread-local reading behind SluiceCore's `LoopClock`.
        .target(name: "CLoopClock"),
        .target(
            name: "SluiceCore",
            dependencies: [
                "CZlib", "COpenSSL", "CCrypt", "CLua", "CLoopClock", .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
            ], swiftSettings: perRequestTargets),
        .target(
            name: "SluiceConfig",
            dependencies: [
                "SluiceCore", .product(name: "HTTPTypes", package: "swift-http-types"),
            ],
            resources: [.embedInCode("default.yaml")]),
        .target(
            name: "SluiceServer",
            dependencies: [
                "SluiceCore", "SluiceConfig", "CShims", "CLibEvent", "CCurl", "COpenSSL",
                "CSystemd", "CHiredis", .product(name: "Logging", package: "swift-log"),
            ], swiftSettings: perRequestTargets),
        .executableTarget(
            name: "sluice",
            dependencies: [
                "SluiceServer", "SluiceConfig", "SluiceCore",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ]),
        // Test-only: drives the disk cache tier in a process of its own (kill -9, RLIMIT_FSIZE,
        // benchmark) for Tests/e2e/test_disk_tier.py. Not a product; not installed.
        // Test-only: the Lua engine's cost per call under callgrind (Sources/LuaProbe/main.swift).
        // Not a product; not installed.
        .executableTarget(
            name: "LuaProbe", dependencies: ["SluiceCore", .product(name: "HTTPTypes", package: "swift-http-types")]),
        .executableTarget(name: "DiskTierProbe", dependencies: ["SluiceServer", "COpenSSL"]),
        .testTarget(
            name: "SluiceServerTests",
            dependencies: [
                "SluiceServer", "SluiceCore", "CLibEvent",
                .product(name: "HTTPTypes", package: "swift-http-types"),
            ]),
        // Vectors/: published test suites (AWS SigV4, RFC 9421), read by path.
        .testTarget(name: "SluiceConfigTests", dependencies: ["SluiceConfig", "SluiceCore"], exclude: ["Vectors"]),
        .testTarget(
            name: "SluiceCoreTests",
            dependencies: [
                "SluiceCore", "CZlib",
                .product(name: "HTTPTypes", package: "swift-http-types"),
            ]),
    ],
    swiftLanguageModes: [.v6]
)
