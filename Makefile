# Browser Grid for Caddy. `make run` starts a whole local grid; `make test`
# is everything CI runs. See README.md.

SHELL       := /bin/bash
GO          ?= go
BIN         := bin
GOTESTFLAGS ?=
# Where apt-get runs as root; otherwise through sudo when there is one.
SUDO        := $(shell [ "$$(id -u)" = 0 ] || command -v sudo >/dev/null && [ "$$(id -u)" != 0 ] && echo sudo)

# `make run` knobs.
WORKERS      ?= 4
HTTPS_PORT   ?= 8443
HTTP_PORT    ?= 8080
ADMIN_PORT   ?= 2019
REDIS_PORT   ?= 6390
MAX_LIFETIME ?= 6
MAX_CONCURRENT ?= 2
SESSIONS     ?= 36
CLIENTS      ?= 3
# Playwright versions of the workers (in turn) and the demo's clients.
PLAYWRIGHT_VERSIONS ?= 1.64,1.65

.PHONY: all deps deps-apt deps-node build run test test-go fuzz chaos chaos-short bench fmt lint examples deploy-check xcaddy clean

all: build

## deps: install what is missing (redis-server, chromium and its headless shell, ffmpeg via apt; playwright-core via npm ci).
deps: deps-apt deps-node

deps-apt:
	@missing=""; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v redis-cli >/dev/null || missing="$$missing redis-tools"; \
	[ -x /usr/bin/chromium ] || missing="$$missing chromium"; \
	command -v ffmpeg >/dev/null || missing="$$missing ffmpeg"; \
	command -v node >/dev/null || missing="$$missing nodejs"; \
	command -v npm >/dev/null || missing="$$missing npm"; \
	if [ -n "$$missing" ]; then \
		echo "deps: installing$$missing"; \
		$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi
	@# the headless shell only speeds headless browsers up: a release without the package still runs
	@[ -x /usr/bin/chromium-headless-shell ] || DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium-headless-shell >/dev/null 2>&1 || \
		echo "deps: no chromium-headless-shell package here; headless browsers run on the full Chromium"

deps-node: playwright/node_modules/.package-lock.json

playwright/node_modules/.package-lock.json: playwright/package.json playwright/package-lock.json
	cd playwright && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

## build: every binary into bin/.
build:
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./cmd/...

## run: a whole local grid with a demo Playwright client (Ctrl-C stops everything).
run: deps build
	$(BIN)/griddemo -workers $(WORKERS) -https-port $(HTTPS_PORT) -http-port $(HTTP_PORT) \
		-admin-port $(ADMIN_PORT) -redis-port $(REDIS_PORT) -max-lifetime $(MAX_LIFETIME) \
		-max-concurrent $(MAX_CONCURRENT) -sessions $(SESSIONS) -clients $(CLIENTS) \
		-playwright-versions '$(PLAYWRIGHT_VERSIONS)'

## test: everything CI runs (vet, Go tests with real Redis/Chromium/Caddy, examples, fuzzing, the chaos short form).
test: deps build lint examples deploy-check test-go fuzz chaos-short

test-go:
	$(GO) test -count=1 -timeout 18m $(GOTESTFLAGS) ./...

## fuzz: each fuzz target for a number of inputs (their seed corpora run in every go test).
# Counts, not durations: with a duration, Go 1.26's fuzz coordinator may fail a target with a
# bare "context deadline exceeded" as the time runs out (golang/go#75804, fixed in Go 1.27),
# which a loaded CI machine hits now and then. About 10 s each here.
FUZZTIME          ?= 25000x
FUZZTIME_REGISTRY ?= 120000x
FUZZ_TARGETS = FuzzClientRequest FuzzAdminAPI FuzzClientKey
# what the agent reads off its listener, and the records Caddy dials
FUZZ_REGISTRY = FuzzParseTicket FuzzDecodeRecord
fuzz:
	@set -e; for f in $(FUZZ_TARGETS); do \
		$(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) ./caddygrid; \
	done; for f in $(FUZZ_REGISTRY); do \
		$(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME_REGISTRY) ./registry; \
	done

## chaos: every reliability scenario under client traffic, full length; prints one table and
## fails when a figure is off (docs/reliability.md). One scenario: make chaos CHAOSFLAGS='-only redis-restart'.
chaos: deps-apt build
	$(BIN)/gridchaos $(CHAOSFLAGS)

# The same scenarios and expectations with shorter phases (about 4–5 min), run by make test
# after the Go tests so that its timings do not share the CPU with them.
chaos-short: build
	$(BIN)/gridchaos -short $(CHAOSFLAGS)

## bench: Go benchmarks and cmd/gridbench, printed as ratio tables (docs/performance.md).
## One section: make bench BENCHFLAGS='-only relay' (gridbench -list names them).
BENCHFLAGS ?=
bench: deps build
	$(GO) test -run "^$$" -bench . -benchmem ./selection/... ./registry/... ./workeragent/...
	$(BIN)/gridbench $(BENCHFLAGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change: $$out"; exit 1; fi
	$(GO) vet ./...

## examples: adapt and validate every Caddyfile in caddyfile-examples/, and check its formatting.
# auth-basic.Caddyfile reads its password hash from the environment when it
# loads, as --validate does: validate it with a throwaway one.
examples: build
	@set -e; export GRID_PASSWORD_HASH="$$($(BIN)/caddy hash-password --plaintext make-examples --bcrypt-cost 4)"; \
	for f in caddyfile-examples/*.Caddyfile; do \
		echo "examples: $$f"; \
		GRID_WORKER_SECRET=$${GRID_WORKER_SECRET:-examples-only} $(BIN)/caddy adapt --config $$f --adapter caddyfile --validate >/dev/null; \
		$(BIN)/caddy fmt --diff $$f >/dev/null || { $(BIN)/caddy fmt --diff $$f; exit 1; }; \
	done

## deploy-check: check deploy/ without a Docker daemon or a cluster: the Dockerfiles with
## BuildKit's parser, compose.yaml with compose-go, k8s/ decoded strictly into the k8s.io/api
## types and KEDA's CRD schema, every grid-worker flag and variable against bin/grid-worker
## -help, every Caddyfile adapted by bin/caddy. deploy/ is a module of its own (go test ./...
## above does not enter it); go fetches its modules and KEDA's through the module proxy.
deploy-check: build
	cd deploy && $(GO) vet ./... && \
		GRID_WORKER_BIN=$(CURDIR)/$(BIN)/grid-worker GRID_CADDY_BIN=$(CURDIR)/$(BIN)/caddy \
		$(GO) test -count=1 $(GOTESTFLAGS) ./...

## xcaddy: build Caddy with xcaddy from this checkout and check it lists every module.
XCADDY_GOPROXY = $(shell $(GO) env GOPROXY | cut -d, -f1)|off
xcaddy:
	@mkdir -p $(BIN)/xcaddy
	GOPROXY='$(XCADDY_GOPROXY)' XCADDY_SKIP_CLEANUP=0 CADDY_VERSION=v2.11.9 \
		$(GO) tool xcaddy build --output $(BIN)/xcaddy/caddy --with github.com/browsergrid/caddy-browser-grid=.

clean:
	rm -rf $(BIN)
