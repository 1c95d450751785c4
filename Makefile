# Sluice: `make run` runs the proxy with its embedded default config, `make test` runs every
# test. Both install whatever is missing first (Debian 12, as root or with sudo).
SWIFT ?= swift
BIN := .build/release/sluice

.PHONY: run test build deps test-deps unit e2e bench clean

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

bench: build
	scripts/install-deps.sh bench
	SLUICE_BIN=$(abspath $(BIN)) Benchmarks/run.sh

clean:
	rm -rf .build
