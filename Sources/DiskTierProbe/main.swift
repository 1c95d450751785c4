import COpenSSL
import SluiceServer

// A test-only driver of `DiskCacheTier` in a process of its own, for what a unit test cannot
// do in-process: be killed with SIGKILL mid-store (Tests/e2e/test_disk_tier.py), run with a
// file-size limit, and measure hit reads. Not installed, not part of `sluice`.
//
//   DiskTierProbe store DIR KEY SIZE SEED ROUNDS   store ROUNDS entries under KEY (seeds SEED,
//                                                  SEED+1, ...), printing "committed SEED"
//   DiskTierProbe check DIR KEY...                 one JSON line per key: hit, metadata, length,
//                                                  sha256 of the body as read; then the scan
//   DiskTierProbe fsize-limit DIR                  writes under RLIMIT_FSIZE: failures, then recovery
//   DiskTierProbe bench DIR                        hit read MB/s and per-open cost
//
// Body content of a seed: 64 KiB blocks; block i is bytes 0...255 repeated, rotated by
// (seed * 7 + i) % 256, its first 16 bytes replaced by "%08x%08x" of (seed, i) in ASCII.
#if canImport(Glibc)
    import Glibc
#endif

func say(_ line: String) {
    let bytes = Array((line + "\n").utf8)
    _ = bytes.withUnsafeBytes { write(1, $0.baseAddress, $0.count) }
}

func hex8(_ v: UInt64) -> String {
    let s = String(v & 0xffff_ffff, radix: 16)
    return String(repeating: "0", count: 8 - s.count) + s
}

func block(seed: UInt64, index: UInt64) -> [UInt8] {
    let r = Int((seed &* 7 &+ index) % 256)
    var out = [UInt8](repeating: 0, count: 65536)
    for j in 0..<65536 { out[j] = UInt8((j + r) & 255) }
    let stamp = Array((hex8(seed) + hex8(index)).utf8)
    for j in 0..<16 { out[j] = stamp[j] }
    return out
}

final class SHA256Stream {
    let ctx = EVP_MD_CTX_new()
    init() { EVP_DigestInit_ex(ctx, EVP_sha256(), nil) }
    deinit { EVP_MD_CTX_free(ctx) }
    func update(_ bytes: [UInt8]) { bytes.withUnsafeBytes { _ = EVP_DigestUpdate(ctx, $0.baseAddress, $0.count) } }
    func hex() -> String {
        var md = [UInt8](repeating: 0, count: 32)
        var n: UInt32 = 0
        EVP_DigestFinal_ex(ctx, &md, &n)
        return md.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
    }
}

func openTier(
    _ dir: String, capacity: UInt64 = 4 << 30, log: @escaping @Sendable (String) -> Void = { say("LOG " + $0) }
) -> DiskCacheTier {
    do {
        return try DiskCacheTier(directory: dir, capacity: capacity, log: log)
    } catch {
        say("OPEN-ERROR \(error)")
        exit(2)
    }
}

func store(_ tier: DiskCacheTier, key: String, size: UInt64, seed: UInt64) -> Bool {
    guard let writer = tier.beginWrite(key: key, metadata: Array("seed=\(seed) size=\(size)".utf8)) else { return false }
    var done: UInt64 = 0
    var index: UInt64 = 0
    while done < size {
        var chunk = block(seed: seed, index: index)
        if UInt64(chunk.count) > size - done { chunk = Array(chunk[0..<Int(size - done)]) }
        guard writer.append(chunk) else { return false }
        done += UInt64(chunk.count)
        index += 1
    }
    return writer.commit()
}

func jsonString(_ s: String) -> String {
    "\"" + s.replacing("\\", with: "\\\\").replacing("\"", with: "\\\"") + "\""
}

func now() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
}

let args = CommandLine.arguments
guard args.count >= 3 else {
    say("usage: DiskTierProbe store|check|fsize-limit|bench DIR ...")
    exit(2)
}
let dir = args[2]
switch args[1] {
case "store" where args.count == 7:
    let tier = openTier(dir)
    let size = UInt64(args[4])!
    let seed = UInt64(args[5])!
    let rounds = UInt64(args[6])!
    say("opened")
    for s in seed..<seed + rounds {
        say(store(tier, key: args[3], size: size, seed: s) ? "committed \(s)" : "failed \(s)")
    }
case "check":
    let tier = openTier(dir)
    for key in args[3...] {
        guard let reader = tier.open(key: key) else {
            say("{\"key\": \(jsonString(key)), \"hit\": false}")
            continue
        }
        let hash = SHA256Stream()
        var length: UInt64 = 0
        var corrupt = false
        do {
            while let chunk = try reader.next() {
                hash.update(chunk)
                length += UInt64(chunk.count)
            }
        } catch {
            corrupt = true
        }
        say(
            "{\"key\": \(jsonString(key)), \"hit\": true, \"metadata\": \(jsonString(String(decoding: reader.metadata, as: UTF8.self))), "
                + "\"length\": \(length), \"declared\": \(reader.bodyLength), \"corrupt\": \(corrupt), \"sha256\": \"\(hash.hex())\"}"
        )
    }
    let s = tier.startScan
    say(
        "{\"scan\": {\"kept\": \(s.kept), \"dropped\": \(s.dropped), \"temporaries\": \(s.temporaries), \"evicted\": \(s.evicted)}}"
    )
case "fsize-limit":
    // Writes past RLIMIT_FSIZE fail with EFBIG (SIGXFSZ ignored): the same path as ENOSPC.
    signal(SIGXFSZ, SIG_IGN)
    var limit = rlimit(rlim_cur: 1 << 20, rlim_max: 1 << 20)
    setrlimit(Int32(RLIMIT_FSIZE.rawValue), &limit)
    let tier = openTier(dir)
    for i in 0..<3 { say("big \(i): \(store(tier, key: "big\(i)", size: 3 << 20, seed: UInt64(i)) ? "committed" : "failed")") }
    for i in 0..<2 {
        say("small \(i): \(store(tier, key: "small\(i)", size: 100_000, seed: UInt64(i)) ? "committed" : "failed")")
    }
    say("big again: \(store(tier, key: "big9", size: 3 << 20, seed: 9) ? "committed" : "failed")")
    say("usage \(tier.usage.entries) \(tier.usage.bytes)")
case "bench":
    let tier = openTier(dir, log: { _ in })
    let size: UInt64 = 64 << 20
    let chunk = block(seed: 1, index: 0)
    var t = now()
    guard let writer = tier.beginWrite(key: "big", metadata: []) else { exit(1) }
    for _ in 0..<Int(size) / chunk.count { writer.append(chunk) }
    guard writer.commit() else { exit(1) }
    say("store 64 MiB in 64 KiB chunks: \(Int(Double(size) / (now() - t) / 1e6)) MB/s")
    let rounds = 8
    t = now()
    for _ in 0..<rounds {
        guard let r = tier.open(key: "big") else { exit(1) }
        while let chunk = try! r.next() { _ = chunk.count }
    }
    say("hit read 64 MiB x\(rounds), next(): \(Int(Double(size) * Double(rounds) / (now() - t) / 1e6)) MB/s")
    t = now()
    for _ in 0..<rounds {
        guard let r = tier.open(key: "big") else { exit(1) }
        while try! r.withNextBlock({ $0.count }) != nil {}
    }
    say("hit read 64 MiB x\(rounds), withNextBlock: \(Int(Double(size) * Double(rounds) / (now() - t) / 1e6)) MB/s")
    let small = 2000
    for i in 0..<small { _ = store(tier, key: "small\(i)", size: 1024, seed: UInt64(i)) }
    t = now()
    for i in 0..<small {
        guard let r = tier.open(key: "small\(i)") else { exit(1) }
        while let chunk = try! r.next() { _ = chunk.count }
    }
    say("open + read 1 KiB entry: \(Int((now() - t) / Double(small) * 1e6)) us each")
    t = now()
    for i in 0..<small { _ = tier.open(key: "absent\(i)") }
    say("miss: \(Int((now() - t) / Double(small) * 1e9)) ns each")
default:
    say("unknown command")
    exit(2)
}
