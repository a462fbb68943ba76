# Targets say what they do; `make help` lists them.
GO            ?= go
STATICCHECK   ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: help build test test-short lint fmt demo dev-kafka bench

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

build: ## build the outbox binary into ./bin/outbox
	$(GO) build -o bin/outbox ./cmd/outbox

test: ## run every test with the race detector against the local Postgres (the README's test command)
	$(GO) test -race -count=1 -timeout 20m ./...

test-short: ## skip the slowest tests (million-row cleanup and long fault runs)
	$(GO) test -race -count=1 -short ./...

lint: ## gofmt, go vet and staticcheck
	@test -z "$$(gofmt -l .)" || (echo "gofmt needed on:"; gofmt -l .; exit 1)
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

fmt: ## format the code
	gofmt -w .

demo: ## run the end-to-end demo on the local Postgres and an embedded broker
	$(GO) run ./cmd/outbox demo

dev-kafka: ## run the embedded Kafka-compatible dev broker on 127.0.0.1:9092
	$(GO) run ./cmd/outbox dev-kafka

bench: ## run the Go benchmarks of the hot paths
	$(GO) test -run '^$$' -bench . -benchmem ./...
