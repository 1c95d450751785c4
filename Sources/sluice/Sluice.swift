import ArgumentParser
import Logging
import SluiceConfig
import SluiceCore
import SluiceServer

#if canImport(Glibc)
    import Glibc
#endif

@main
struct Sluice: ParsableCommand {
    static let version = "0.1.0"

    static let configuration = CommandConfiguration(
        commandName: "sluice",
        abstract: "A local HTTP proxy daemon with a per-host interceptor pipeline.",
        discussion: """
            Point clients at it: export HTTP_PROXY=http://127.0.0.1:3128 (and HTTPS_PROXY)

            Without --config, `sluice run` uses the embedded default: loopback only, port 3128, \
            one worker per core. `sluice check` validates a file and reports every problem with \
            its file, line and column.

            As a service (systemd/sluice.service, installed by `make install` or the .deb), \
            Sluice reads /etc/sluice/sluice.yaml, takes ${NAME} secrets from \
            /etc/sluice/sluice.env and keeps its state (the interception CA) in /var/lib/sluice.

            Shell completions: sluice --generate-completion-script bash|zsh|fish
            """,
        version: version,
        subcommands: [Run.self, Check.self, CA.self, Top.self, LuaCommand.self],
        defaultSubcommand: nil
    )
}

/// Sends Sluice's diagnostics (`Log`) through `DiagnosticLogHandler`: each subcommand calls
/// it once, first.
func bootstrapLogging() {
    LoggingSystem.bootstrap(DiagnosticLogHandler.init)
}

/// Prints to standard error (Swift 6 rejects the C `stderr` global).
func printError(_ text: String) {
    var line = text + "\n"
    line.withUTF8 { _ = write(2, $0.baseAddress, $0.count) }
}

func loadConfiguration(_ path: String?) throws -> SluiceConfiguration {
    if let path { return try ConfigLoader.load(path: path) }
    return try ConfigLoader.parse(yaml: ConfigLoader.embeddedDefault, file: ConfigLoader.embeddedDefaultName)
}

struct Run: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run the proxy until SIGTERM or SIGINT (a second signal stops without draining).",
        discussion: """
            SIGHUP re-reads --config (a bad file changes nothing); SIGUSR1 reopens the access-log \
            files; SIGTERM or SIGINT stops accepting and lets in-flight requests finish for up to \
            timeouts.drain. Under systemd (Type=notify) it reports readiness, reloads, stopping \
            and the watchdog through sd_notify.
            """)

    @Option(name: .shortAndLong, help: "YAML configuration file (default: the embedded default).")
    var config: String?

    func run() throws {
        ProxyServer.blockControlSignals()  // before any thread (log writers, workers) exists
        bootstrapLogging()
        let configuration: SluiceConfiguration
        do {
            configuration = try loadConfiguration(config)
        } catch let error as ConfigError {
            printError(error.description)
            throw ExitCode(1)
        }
        Log.apply(configuration.server)
        let server = ProxyServer(configuration: configuration, configPath: config)
        do {
            try server.runUntilSignalled()
        } catch let error as ServerError {
            printError("sluice: \(error.description)")
            throw ExitCode(1)
        }
        Log.info("stopped")
    }
}

struct Check: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Validate a configuration file: exit 0 if it is valid, else print every error and exit 1.",
        discussion:
            "With --host NAME, also print the policy that host gets: the matched entry, its adapters in order (secrets redacted), redirects and monitors."
    )

    @Option(name: .shortAndLong, help: "YAML configuration file to validate.")
    var config: String

    @Option(name: .long, help: "Also print the effective policy for this host name.")
    var host: String?

    func run() throws {
        bootstrapLogging()
        do {
            let configuration = try ConfigLoader.load(path: config)
            let server = configuration.server
            print(
                "\(config): OK (listen \(server.listen.joined(separator: ", ")), "
                    + "workers \(server.workers.map(String.init) ?? "auto"), "
                    + "\(server.routes.count) route(s))")
            if let host {
                print(PolicyDescription.describe(configuration.pipeline, host: host))
            }
        } catch let error as ConfigError {
            printError(error.description)
            throw ExitCode(1)
        }
    }
}

struct CA: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ca",
        abstract: "Manage the local CA that signs the certificates of intercepted hosts (intercept: true).",
        discussion: """
            The default directory is $STATE_DIRECTORY/ca under systemd (StateDirectory=sluice),
            else /var/lib/sluice/ca; tls.ca_dir in the configuration must name the same one.
            """,
        subcommands: [Init.self, Export.self])

    static func directory(_ option: String?) -> String {
        option.map(LocalCA.absolutePath) ?? LocalCA.defaultDirectory()
    }

    struct Init: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Create the CA: ca.key (mode 0600) and ca.pem. Refuses to replace an existing CA without --force.")

        @Option(name: .long, help: "Directory for ca.pem and ca.key (created with mode 0700).")
        var dir: String?

        @Flag(name: .long, help: "Replace an existing CA (clients trusting the old one must be given the new one).")
        var force = false

        func run() throws {
            bootstrapLogging()
            let directory = CA.directory(dir)
            do {
                let ca = try LocalCA.create(directory: directory, force: force)
                print("certificate: \(ca.certificatePath)")
                print("key:         \(ca.keyPath) (mode 0600)")
                print("SHA-256 fingerprint: \(ca.fingerprint)")
                print("Clients must trust the certificate: sluice ca export --dir \(directory) > sluice-ca.pem")
            } catch {
                printError("sluice: \(error.description)")
                throw ExitCode(1)
            }
        }
    }

    struct Export: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Print the CA certificate (PEM) for clients to trust.")

        @Option(name: .long, help: "Directory holding ca.pem and ca.key.")
        var dir: String?

        func run() throws {
            bootstrapLogging()
            let directory = CA.directory(dir)
            do {
                var text = try LocalCA.exportCertificate(directory: directory)
                text.withUTF8 { _ = write(1, $0.baseAddress, $0.count) }
            } catch {
                printError("sluice: \(error.description)")
                throw ExitCode(1)
            }
        }
    }
}
