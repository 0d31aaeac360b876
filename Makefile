# fedstream — the two commands a newcomer needs are `make run` and `make test`.
GO        ?= go
BIN       := bin/fedstream
PKGS      := ./...
export PATH := $(shell $(GO) env GOPATH)/bin:$(PATH)

.PHONY: all build run test soak org-tls federation-tls test-short bench pgo proto vet fmt clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/fedstream

## run: start a whole federation in one process and show a query producing results
run: build
	./$(BIN) dev

## test: every unit, cluster and integration test (integration tests build the binary themselves)
##
## The four slowest packages (~100-220 s each on 2 cores; the rest together
## ~90 s) are named first: go test runs packages GOMAXPROCS at a time, in the
## order given, and listed alphabetically worker/runtime came last and ran
## alone for minutes while the other slot idled. Longest first, the two slots
## end close together. A package named twice runs once.
SLOW_PKGS := ./worker/runtime ./integration ./coordinator ./cmd/fedstream
test:
	$(GO) vet $(PKGS)
	$(GO) test -count=1 -timeout 15m $(SLOW_PKGS) $(PKGS)

## soak: opt-in, not part of test: the soak tests (integration/soak_test.go, build tag soak)
## run a query on an org of processes for SOAK_DURATION each (three at once) under worker
## pauses and kills, live moves and reconfigurations, and fail on a stall, a lost, wrong or
## duplicate result, or growing goroutines or open files; samples and logs go to SOAK_EVIDENCE
SOAK_DURATION ?= 10m
SOAK_EVIDENCE ?= $(CURDIR)/soak-evidence
soak:
	mkdir -p $(SOAK_EVIDENCE)
	$(GO) test -tags soak -count=1 -v -run '^TestSoak' -parallel 3 -timeout 2h ./integration \
		-soak.duration=$(SOAK_DURATION) -soak.evidence=$(SOAK_EVIDENCE)

## org-tls: the CA, certificates and gossip key of the example org in examples/org (not committed)
org-tls: build
	test -f examples/org/tls/ca.pem || ./$(BIN) tls init --org acme --out examples/org/tls
	test -f examples/org/tls/gossip.key || (umask 077 && ./$(BIN) keygen > examples/org/tls/gossip.key)

## federation-tls: CAs, certificates and gossip keys of the three example orgs in
## examples/federation, and the federation pool's key (not committed)
federation-tls: build
	for org in alpha beta gamma; do \
	  test -f examples/federation/tls/$$org/ca.pem || ./$(BIN) tls init --org $$org --out examples/federation/tls/$$org --coordinators c1; \
	  test -f examples/federation/tls/$$org/gossip.key || (umask 077 && ./$(BIN) keygen > examples/federation/tls/$$org/gossip.key); \
	done
	test -f examples/federation/tls/federation.key || (umask 077 && ./$(BIN) keygen > examples/federation/tls/federation.key)

test-short:
	$(GO) test -short -count=1 $(PKGS)

bench: build
	./$(BIN) bench dataplane
	$(GO) test -run '^$$' -bench . -benchtime 1x ./coordinator/...

## pgo: refresh cmd/fedstream/default.pgo, the CPU profile `go build` optimises the binary
## with (profile-guided optimisation), from both workers of a data-plane benchmark run
pgo: build
	tmp=$$(mktemp -d) && \
	./$(BIN) bench dataplane --rounds 3 --cpuprofile-dir $$tmp >/dev/null && \
	$(GO) tool pprof -proto $$tmp/bench-worker-1.cpu $$tmp/bench-worker-2.cpu > cmd/fedstream/default.pgo.new && \
	mv cmd/fedstream/default.pgo.new cmd/fedstream/default.pgo && rm -rf $$tmp

## proto: regenerate rpc/fedstreampb from rpc/*.proto (protoc from Debian's protobuf-compiler,
## plugins from the Go module proxy at pinned versions)
proto:
	@command -v protoc >/dev/null || { echo "protoc missing: apt-get install -y protobuf-compiler"; exit 1; }
	$(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	$(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.5.1
	protoc -I rpc --go_out=rpc --go_opt=paths=source_relative \
		--go-grpc_out=rpc --go-grpc_opt=paths=source_relative rpc/fedstream.proto
	mkdir -p rpc/fedstreampb && mv rpc/fedstream.pb.go rpc/fedstream_grpc.pb.go rpc/fedstreampb/

vet:
	$(GO) vet $(PKGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf bin
