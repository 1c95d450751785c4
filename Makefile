# Sluice: `make run` runs the proxy with its embedded default config, `make test` runs every
# test. Both install whatever is missing first (Debian 12, as root or with sudo).
# `make build man && sudo make install` installs it (PREFIX=/usr/local, DESTDIR); `make deb`
# builds a Debian package in dist/. docs/operations.md, "Install".
SWIFT ?= swift
BIN := .build/release/sluice
# swift-argument-parser's generate-manual plugin writes the man page here
MAN := .build/plugins/GenerateManual/outputs/sluice/sluice.1
MAN_DATE := $(shell git log -1 --format=%cs 2>/dev/null)
# The .deb's binary carries the Swift runtime (--static-swift-stdlib); a scratch path of its
# own leaves $(BIN) alone.
STATIC_SCRATCH := .build-static
STATIC_BIN := $(STATIC_SCRATCH)/release/sluice
DEBDIR ?= dist

PREFIX ?= /usr/local
DESTDIR ?=
INSTALL_VARS = DESTDIR='$(DESTDIR)' PREFIX='$(PREFIX)' BINDIR='$(BINDIR)' SYSCONFDIR='$(SYSCONFDIR)' \
	UNITDIR='$(UNITDIR)' MANDIR='$(MANDIR)' DOCDIR='$(DOCDIR)' BASHCOMPDIR='$(BASHCOMPDIR)' \
	ZSHCOMPDIR='$(ZSHCOMPDIR)' FISHCOMPDIR='$(FISHCOMPDIR)'

.PHONY: run test build deps test-deps unit e2e bench clean man install uninstall deb

run: deps build
	$(BIN) run

build:
	$(SWIFT) build -c release

deps:
	scripts/install-deps.sh build

test-deps:
	scripts/install-deps.sh test

test: test-deps build unit e2e

unit:
	$(SWIFT) test

e2e:
	SLUICE_BIN=$(abspath $(BIN)) python3 -m pytest Tests/e2e -q

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

# The plugin builds the package in release mode (nothing to do after `make build`), then
# renders `sluice --experimental-dump-help` as an mdoc page. It copies the blank lines that
# separate the paragraphs of a discussion; mdoc's paragraph break is .Pp.
$(MAN): $(BIN)
	$(SWIFT) package plugin generate-manual $(if $(MAN_DATE),--date $(MAN_DATE))
	sed -i 's/^$$/.Pp/' $@

deb: $(MAN)
	$(SWIFT) build -c release --static-swift-stdlib --scratch-path $(STATIC_SCRATCH)
	scripts/build-deb.sh $(STATIC_BIN) $(MAN) $(DEBDIR)

bench: build
	scripts/install-deps.sh bench
	SLUICE_BIN=$(abspath $(BIN)) Benchmarks/run.sh

clean:
	rm -rf .build $(STATIC_SCRATCH) $(DEBDIR)
