# Everything a developer or CI runs. The tests start real redis-server
# processes, so `test` installs Redis first when it is missing.

GO ?= go

.PHONY: all test vet fmt bench-engine

all: test

## test: install redis-server if needed, vet, then run every test with -race
test:
	./scripts/ensure-redis.sh
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 25m ./...

## vet: go vet every package
vet:
	$(GO) vet ./...

## fmt: gofmt every Go file in place
fmt:
	gofmt -w $$(git ls-files '*.go')

## bench-engine: benchmark the queue engine a fixed number of iterations
bench-engine:
	$(GO) test -run '^$$' -bench . -benchtime 2000x ./fairqueue/...

# TODO: run (Caddy with the plugin and mockllm), demo-cluster and bench
# targets are added by the owners of those parts.
