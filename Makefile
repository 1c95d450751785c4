# Sluice: `make run` runs the proxy with its embedded default config, `make test` runs every
# test. Both install whatever is missing first (Debian 12, as root or with sudo). `make image`
# builds the container image (docker/, docs/operations.md "Container image").
SWIFT ?= swift
BIN := .build/release/sluice
# The image's binary: Swift runtime and Foundation linked in, its own scratch path so that
# .build/release/sluice (the one the tests run) is untouched.
STATIC_SCRATCH := .build-static
IMAGE ?= sluice:latest

.PHONY: run test build deps test-deps unit e2e bench image static clean

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

clean:
	rm -rf .build $(STATIC_SCRATCH)
