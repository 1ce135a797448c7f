# The two commands a newcomer needs: `make run` and `make test`.
SHELL := /bin/bash
GO    ?= go
PKG   := github.com/better-compute/better-compute
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -s -w -X $(PKG)/internal/buildinfo.Version=$(VERSION) -X $(PKG)/internal/buildinfo.Commit=$(COMMIT)
# The whole suite, integration tests included; stays under 15 minutes on 2 cores.
TEST_TIMEOUT ?= 14m
# How long `make test` fuzzes the call envelope (api.FuzzEnvelope) after the
# suite; its first ~10 s start the server and replay the corpus.
FUZZ_TIME ?= 20s
# go-nvml's cgo preamble uses NVML calls its headers mark deprecated.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

.PHONY: all build run test lint bench clean

all: build

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/better-compute ./cmd/better-compute
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/bcd ./cmd/bcd

# Everything on this machine: PostgreSQL, Temporal and its UI, the API, a worker.
run: build
	./bin/better-compute dev

test:
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./...
	$(GO) test -run '^$$' -fuzz '^FuzzEnvelope$$' -fuzztime $(FUZZ_TIME) ./api/

# gofmt, vet, and the direction of imports (tools/importcheck holds the rules).
lint:
	@bad=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$bad" ]; then echo "gofmt would change:"; echo "$$bad"; exit 1; fi
	$(GO) vet ./...
	$(GO) run ./tools/importcheck

bench:
	$(GO) test -run '^$$' -bench . -benchmem -timeout 30m ./...

clean:
	rm -rf bin
