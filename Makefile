# Everything a developer or CI runs. The tests start real redis-server
# processes, so `test` installs Redis first when it is missing.

GO ?= go

.PHONY: all test e2e screenshot vet fmt bench-engine caddy xcaddy run demo-cluster bench-bins bench bench-quick bench-capacity soak

all: test

## test: install redis-server if needed, vet, then run every test with -race
# bench/ is a module of its own (its plotting library stays out of a
# plugin user's build), which ./... does not reach: it is run on its own.
test:
	./scripts/ensure-redis.sh
	$(GO) vet ./...
	cd bench && $(GO) vet ./...
	$(GO) test -race -count=1 -timeout 25m ./...
	cd bench && $(GO) test -race -count=1 ./...

## e2e: the chat and status pages in headless Chromium (chromium installed if needed) and the client libraries (npm ci) against real Caddy
# Its own target: the browser and npm installs and the libraries' retry
# waits would slow make test down. CI runs it after make test. e2e/ is a
# module of its own (its browser driver stays out of a plugin user's
# build), which ./... at the root does not reach.
e2e:
	./scripts/ensure-chromium.sh
	cd e2e && $(GO) vet -tags e2e ./...
	cd e2e && $(GO) test -tags e2e -count=1 -timeout 15m ./...

## screenshot: take docs/chat-waiting.png again (the chat page waiting in the queue, shown in the README)
screenshot:
	./scripts/ensure-chromium.sh
	cd e2e && CHAT_SCREENSHOT=docs/chat-waiting.png $(GO) test -tags e2e -count=1 -run TestChatPageShowsItsPlaceInTheQueue ./chat/

## soak: the model-based test of the queue under faults, long, on both stores (SOAK_CHECKS, SOAK_STEPS; a failure prints its -rapid.seed), then the reload chaos test through Caddy, long (SOAK_RELOADS; a failure prints its RELOAD_CHAOS_SEED)
# The package list comes before the -rapid flags: go test hands every flag
# after the first one it does not know to the test binaries.
# The reload chaos test reads its settings from the environment:
# RELOAD_CHAOS_SEED reruns a failure's configs, RELOAD_CHAOS_STRICT=1 adds
# the shapes today's code is known to break (reload_chaos_test.go).
soak:
	./scripts/ensure-redis.sh
	$(GO) test -race -count=1 -timeout 120m -run TestModel ./fairqueue/memstore/ ./fairqueue/redisstore/ \
		-rapid.checks=$(or $(SOAK_CHECKS),500) -rapid.steps=$(or $(SOAK_STEPS),100)
	RELOAD_CHAOS_RELOADS=$(or $(SOAK_RELOADS),300) $(GO) test -race -count=1 -timeout 60m -run TestReloadChaos ./integration/

## vet: go vet every package, of the bench and e2e modules too
vet:
	$(GO) vet ./...
	cd bench && $(GO) vet ./...
	cd e2e && $(GO) vet -tags e2e ./...

## fmt: gofmt every Go file in place
fmt:
	gofmt -w $$(git ls-files '*.go')

## bench-engine: benchmark the queue engine and the handler's own work a fixed number of iterations
bench-engine:
	$(GO) test -run '^$$' -bench . -benchtime 2000x . ./fairqueue/...

## caddy: build bin/caddy (Caddy + standard modules + fair_queue) with go build
caddy:
	$(GO) build -o bin/caddy ./cmd/caddy

# xcaddy builds from this checkout. The module path is not published, so
# the proxy refuses it: GOPROXY falls back to "off" and Go uses the local
# replacement. CADDY_VERSION follows go.mod.
XCADDY ?= github.com/caddyserver/xcaddy/cmd/xcaddy@v0.4.5
XCADDY_GOPROXY ?= $(shell $(GO) env GOPROXY | sed 's/,direct$$//; s/|off$$//')|off
CADDY_VERSION ?= $(shell $(GO) list -m -f '{{.Version}}' github.com/caddyserver/caddy/v2)

## xcaddy: build bin/caddy-xcaddy the way users do (xcaddy build --with this checkout)
xcaddy:
	GOPROXY='$(XCADDY_GOPROXY)' CADDY_VERSION=$(CADDY_VERSION) $(GO) run $(XCADDY) build \
		--with github.com/fair-queue/caddy-fair-queue=. --output bin/caddy-xcaddy

## run: build Caddy and the mock LLM, run them with Caddyfile.example on :8080 (Ctrl-C stops)
run:
	GO=$(GO) ./scripts/run.sh

## demo-cluster: Redis, 3 Caddy nodes sharing one queue over a pool of 3 mock replicas (1, 2, 3 permits), a burst of streams with live progress per replica
demo-cluster:
	GO=$(GO) ./scripts/demo-cluster.sh

bench-bins:
	./scripts/ensure-redis.sh
	./scripts/ensure-haproxy.sh || echo "bench: haproxy unavailable, the comparison leaves it out"
	$(GO) build -o bin/caddy ./cmd/caddy
	$(GO) build -o bin/mockllm ./cmd/mockllm
	cd bench && $(GO) build -o ../bin/bench .

## bench: fair_queue vs HAProxy vs reverse_proxy, full run; writes BENCHMARKS.md and bench-results/
bench: bench-bins
	bin/bench

## bench-quick: the same in about 4 minutes (the capacity scenario's short version included), for regressions; reports, never fails on a missed target
bench-quick: bench-bins
	bin/bench -quick

## bench-capacity: only the capacity scenario, short (about a minute): fixed permits in front of a GPU-shaped mock (mockllm -kv-tokens); writes bench-results/capacity/, not BENCHMARKS.md
# The full sweep (both workloads, permits 4-64, about 20 minutes) is part of make bench, or
# alone: bin/bench -systems capacity -out bench-results/capacity -md bench-results/capacity/CAPACITY.md
bench-capacity: bench-bins
	bin/bench -quick -systems capacity -out bench-results/capacity -md bench-results/capacity/CAPACITY.md
