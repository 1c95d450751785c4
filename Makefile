# Sluice: `make run` runs the proxy with its embedded default config, `make test` runs every
# test. Both install whatever is missing first (Debian 12, as root or with sudo).
# `make build man && sudo make install` installs it (PREFIX=/usr/local, DESTDIR); `make deb`
# builds a Debian package in dist/; `make image` builds the container image (docker/).
# docs/operations.md, "Install" and "Container image".
SWIFT ?= swift
BIN := .build/release/sluice
# swift-argument-parser's generate-manual plugin writes the man page here
MAN := .build/plugins/GenerateManual/outputs/sluice/sluice.1
MAN_DATE := $(shell git log -1 --format=%cs 2>/dev/null)
# The .deb's and the image's binary carries the Swift runtime (--static-swift-stdlib); a
# scratch path of its own leaves $(BIN), the one the tests run, alone.
STATIC_SCRATCH := .build-static
STATIC_BIN := $(STATIC_SCRATCH)/release/sluice
DEBDIR ?= dist
IMAGE ?= sluice:latest

PREFIX ?= /usr/local
DESTDIR ?=
INSTALL_VARS = DESTDIR='$(DESTDIR)' PREFIX='$(PREFIX)' BINDIR='$(BINDIR)' SYSCONFDIR='$(SYSCONFDIR)' \
	UNITDIR='$(UNITDIR)' MANDIR='$(MANDIR)' DOCDIR='$(DOCDIR)' BASHCOMPDIR='$(BASHCOMPDIR)' \
	ZSHCOMPDIR='$(ZSHCOMPDIR)' FISHCOMPDIR='$(FISHCOMPDIR)'

.PHONY: run test build deps test-deps unit e2e e2e-curl e2e-native-tls bench bench-deps bench-unit clean man install uninstall deb image static fuzz sanitize \
	format lint

run: deps build
	$(BIN) run

build:
	$(SWIFT) build -c release

deps:
	scripts/install-deps.sh build

test-deps:
	scripts/install-deps.sh test

# One build serves both halves: the unit tests run in the release configuration (with
# testability), which also builds the `sluice` the e2e suite runs — a separate debug build
# for the unit tests alone took as long as the release build. `make build` (and `make bench`)
# build without testability. The tests' build keeps Swift's run-time exclusivity checks
# (SLUICE_EXCLUSIVITY_CHECKS=1; Package.swift, docs/architecture.md "Builds"); the products' do not.
test: test-deps unit e2e e2e-curl e2e-native-tls bench-unit

unit:
	SLUICE_EXCLUSIVITY_CHECKS=1 $(SWIFT) test -c release

# The e2e suite runs on E2E_JOBS pytest-xdist workers (its tests mostly wait on sockets and
# processes, so more workers than cores pay off: on 2 cores 6 took 1.9 min, 4 took 2.5, serial
# 9.9). `--dist loadgroup` keeps a module marked `xdist_group` on one worker.
E2E_JOBS ?= 6
e2e:
	SLUICE_BIN=$(abspath $(BIN)) python3 -m pytest Tests/e2e -q -n $(E2E_JOBS) --dist loadgroup

# The e2e modules that forward plain-http requests, once more with libcurl as the upstream
# engine (`e2e` runs them with the default, Sluice's native HTTP/1.1 client): SLUICE_E2E_ENGINE
# makes Tests/e2e/conftest.py add `upstream: { engine: curl }` to every config it writes.
E2E_CURL_MODULES := test_forward.py test_streaming.py test_retry.py test_faults.py test_failures.py \
	test_upstream_framing.py test_overload.py test_redirects.py test_cache.py
e2e-curl:
	SLUICE_E2E_ENGINE=curl SLUICE_BIN=$(abspath $(BIN)) python3 -m pytest $(addprefix Tests/e2e/,$(E2E_CURL_MODULES)) -q -n $(E2E_JOBS) --dist loadgroup

# The trust evaluators once more with every https try on the native transport (the default
# run sends an origin's first https request through libcurl, which asks it for h2 by ALPN).
e2e-native-tls:
	SLUICE_E2E_ENGINE=native SLUICE_BIN=$(abspath $(BIN)) python3 -m pytest Tests/e2e/test_trust.py -q -n $(E2E_JOBS) --dist loadgroup

# AddressSanitizer (with LeakSanitizer), then ThreadSanitizer: each builds sluice with it
# (.build-asan, .build-tsan) and runs the e2e suite's core modules against it; fails on a test
# failure or on any sanitizer report (printed). `make sanitize SANITIZER=thread` runs one.
# Not part of `make test`: on 2 shared cores the e2e run took ~4 min (ASan) and ~7 min (TSan),
# after a first build of 11-15 min each (later ones are incremental). scripts/sanitize.sh has more.
SANITIZER ?= address thread
sanitize: test-deps
	@for s in $(SANITIZER); do SLUICE_EXCLUSIVITY_CHECKS=1 scripts/sanitize.sh $$s || exit 1; done

# Installs what `make build` and `make man` made; it builds only what is missing, so that
# `sudo make install` does not leave root-owned files in .build.
install: $(BIN) $(MAN)
	@$(INSTALL_VARS) scripts/install.sh $(BIN) $(MAN)

# Removes what install put there except the files in /etc (the administrator's).
uninstall:
	@$(INSTALL_VARS) scripts/install.sh --uninstall

man: $(MAN)

$(BIN):
	$(SWIFT) build -c release

# swift-argument-parser's generate-manual tool (what its plugin runs) renders
# `sluice --experimental-dump-help` as an mdoc page. It is run on $(BIN) as it is: the plugin
# would build the package again first, and with other flags than `make unit`'s relink the
# binary while the e2e suite runs it (`make install` is one of its tests). It copies the
# blank lines that separate the paragraphs of a discussion; mdoc's paragraph break is .Pp.
$(MAN): $(BIN)
	$(SWIFT) build --product generate-manual
	mkdir -p $(dir $@)
	.build/debug/generate-manual $(BIN) --output-directory $(dir $@) $(if $(MAN_DATE),--date $(MAN_DATE))
	sed -i 's/^$$/.Pp/' $@

deb: $(MAN)
	$(SWIFT) build -c release --static-swift-stdlib --scratch-path $(STATIC_SCRATCH)
	scripts/build-deb.sh $(STATIC_BIN) $(MAN) $(DEBDIR)

# libFuzzer targets (Fuzz/README.md), each run for FUZZ_TIME seconds, two at a time; fails on
# any finding; the figures per target are printed at the end.
FUZZ_TIME ?= 300
fuzz: deps
	SLUICE_EXCLUSIVITY_CHECKS=1 FUZZ_TIME=$(FUZZ_TIME) SWIFT=$(SWIFT) scripts/fuzz.sh

# The benchmark (Benchmarks/, BENCHMARKS.md): a scenario of Benchmarks/scenarios.toml, one JSON
# result file in Benchmarks/results/; the headline scenario (at most 10 minutes on 2 cores) also
# regenerates BENCHMARKS.md's tables and chart from it. It measures the binary users run: the
# .deb's and the image's, with the Swift runtime linked statically (`make static`; the dynamically
# linked `make build` idles about 2 MiB higher). `make bench SLUICE_BIN=path` measures that
# binary and builds nothing; BENCH_SCENARIO=cachehit|ratelimit|fleet|http2|soak|full|quick runs another scenario.
BENCH_SCENARIO ?= headline
bench: $(if $(SLUICE_BIN),,static) bench-deps
	cd Benchmarks && python3 -m bench run $(BENCH_SCENARIO) --sluice $(abspath $(or $(SLUICE_BIN),$(STATIC_BIN))) \
		$(if $(filter headline,$(BENCH_SCENARIO)),--report)

bench-deps:
	scripts/install-deps.sh bench

# The harness's own unit tests (statistics, scenarios, the report), run by `make test`.
bench-unit:
	python3 -m pytest Benchmarks/tests -q -p no:cacheprovider

# The context is the repository root, cut down by .dockerignore to the files the Dockerfile
# copies. --format docker keeps HEALTHCHECK (OCI images have none); --layers reuses the
# package layer while the base image is unchanged (--no-cache in BUD_FLAGS refreshes it);
# chroot isolation needs no container runtime or namespaces of its own.
BUD_FLAGS ?= --layers
image: static
	scripts/install-deps.sh image
	docker/base-image.sh
	buildah bud --isolation=chroot --format docker $(BUD_FLAGS) -t $(IMAGE) -f docker/Dockerfile .

# Debug info stripped (the symbols stay, for backtraces): 83 MB -> 75 MB.
static: deps
	$(SWIFT) build -c release --static-swift-stdlib --scratch-path $(STATIC_SCRATCH)
	mkdir -p $(STATIC_SCRATCH)/image
	strip --strip-debug -o $(STATIC_SCRATCH)/image/sluice $(STATIC_SCRATCH)/release/sluice
	chmod 0755 $(STATIC_SCRATCH)/image/sluice

# swift format (it ships with the toolchain) with the checked-in .swift-format: `format`
# rewrites the Swift files in place, `lint` fails on any file it would change (CI runs it).
SWIFT_FILES = $(shell git ls-files '*.swift')
format:
	$(SWIFT) format format --in-place --configuration .swift-format $(SWIFT_FILES)

lint:
	$(SWIFT) format lint --strict --configuration .swift-format $(SWIFT_FILES)

clean:
	rm -rf .build $(STATIC_SCRATCH) $(DEBDIR) .build-fuzz .build-asan .build-tsan
