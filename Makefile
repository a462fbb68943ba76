# Targets say what they do; `make help` lists them.
GO            ?= go
STATICCHECK   ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: help build test test-short lint fmt demo dev-kafka bench

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

build: ## build the outbox binary into ./bin/outbox
	$(GO) build -o bin/outbox ./cmd/outbox

# The tests' Postgres: DATABASE_URL, else TEST_DATABASE_URL (internal/pgtest
# has the same default). The database is created when it is missing; each
# test works in a schema of its own and drops it.
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/test?sslmode=disable
# Say which server, without a password the URL may hold.
SAY_TEST_DB = @echo "tests use $${DATABASE_URL:-$(TEST_DATABASE_URL)}" | sed -E 's|(://[^:@/]*):[^@/]*@|\1:***@|'

test: export DATABASE_URL ?= $(TEST_DATABASE_URL)
test: ## run every test with the race detector against DATABASE_URL (default: the local server's database "test", created when missing); the test command of README.md and docs/testing.md
	$(SAY_TEST_DB)
	$(GO) test -race -count=1 -timeout 20m ./...

test-short: export DATABASE_URL ?= $(TEST_DATABASE_URL)
test-short: ## skip the slowest tests (million-row cleanup and long fault runs)
	$(SAY_TEST_DB)
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
