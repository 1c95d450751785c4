// swift-tools-version:6.0
import PackageDescription

/// Sluice's libFuzzer targets, a package of their own so that `swift build` and `swift test`
/// of the main package never see them. Each target is built with
/// `-sanitize=fuzzer,address` against the main package's modules (`@testable import`, so the
/// build adds `-enable-testing`); `make fuzz` (scripts/fuzz.sh) builds and runs them.
/// `Fuzz/README.md` says what each target checks.
let package = Package(
    name: "SluiceFuzz",
    platforms: [.macOS(.v15)],
    dependencies: [.package(name: "Sluice", path: "..")],
    targets: [
        // libFuzzer's own entry point, `LLVMFuzzerRunDriver` (linked by -sanitize=fuzzer).
        .systemLibrary(name: "CLibFuzzer"),
        .target(
            name: "FuzzSupport",
            dependencies: [
                "CLibFuzzer", .product(name: "SluiceServer", package: "Sluice"),
                .product(name: "SluiceCore", package: "Sluice"),
            ]),
        .executableTarget(
            name: "fuzz-request-head",
            dependencies: [
                "FuzzSupport",
                .product(name: "SluiceServer", package: "Sluice"),
                .product(name: "SluiceCore", package: "Sluice"),
            ]),
        .executableTarget(
            name: "fuzz-chunked-body",
            dependencies: [
                "FuzzSupport",
                .product(name: "SluiceServer", package: "Sluice"),
                .product(name: "SluiceCore", package: "Sluice"),
            ]),
        .executableTarget(
            name: "fuzz-response-head",
            dependencies: [
                "FuzzSupport",
                .product(name: "SluiceServer", package: "Sluice"),
            ]),
        .executableTarget(
            name: "fuzz-response-parser",
            dependencies: [
                "FuzzSupport",
                .product(name: "SluiceServer", package: "Sluice"),
            ]),
        .executableTarget(
            name: "fuzz-request-target",
            dependencies: [
                "FuzzSupport",
                .product(name: "SluiceServer", package: "Sluice"),
                .product(name: "SluiceCore", package: "Sluice"),
            ]),
        .executableTarget(
            name: "fuzz-config",
            dependencies: [
                "FuzzSupport",
                .product(name: "SluiceConfig", package: "Sluice"),
            ]),
    ],
    swiftLanguageModes: [.v6]
)
