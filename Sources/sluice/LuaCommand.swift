import ArgumentParser
import SluiceConfig

#if canImport(Glibc)
    import Glibc
#endif

/// `sluice lua …`: tools for `lua` scripts (docs/scripting.md).
struct LuaCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "lua",
        abstract: "Tools for lua scripts (docs/scripting.md).",
        subcommands: [Test.self])

    struct Test: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Run a script's hooks against HTTP/1.1 messages in files and print what they made of them.",
            discussion: """
                Runs on_request on the request in --request (raw HTTP/1.1: request line, headers, \
                an empty line, the body), on_response on the response in --response if given, then \
                on_log; prints the request and response after the hooks, and each call's access-log \
                `lua` field with ctx.vars. --config is the lua entry's `config` map (YAML or JSON). \
                With --allow-host (the entry's allow_hosts), sluice.http calls are answered by the \
                --http files in order, each call printed as it is made. \
                Exit status 1 when the script does not load or a hook fails, so scripts can have \
                their own tests.
                """)

        @Argument(help: "The script file.")
        var script: String

        @Option(name: .long, help: "A file holding the request, as HTTP/1.1 text.")
        var request: String

        @Option(name: .long, help: "A file holding the origin's response, as HTTP/1.1 text.")
        var response: String?

        @Option(name: .long, help: "A YAML or JSON file holding the lua entry's `config` map (ctx.config).")
        var config: String?

        @Option(name: .long, help: "A host or host:port sluice.http may call (the entry's allow_hosts); repeatable.")
        var allowHost: [String] = []

        @Option(name: .long, help: "A file holding the answer to the next sluice.http call, as HTTP/1.1 text; repeatable.")
        var http: [String] = []

        func run() throws {
            bootstrapLogging()
            do {
                let report = try LuaScriptTest.run(
                    script: script, request: request, response: response, config: config, allowHosts: allowHost, http: http)
                var text = report.text
                text.withUTF8 { _ = write(1, $0.baseAddress, $0.count) }
                if report.failed { throw ExitCode(1) }
            } catch let failure as LuaScriptTest.Failure {
                printError(failure.description)
                throw ExitCode(1)
            }
        }
    }
}
