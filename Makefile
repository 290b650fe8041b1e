# Kairon developer entry points. `make up` runs Kairon on this host; `make test`
# runs every test. Both install what the machine lacks first.
SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)

BIN        := $(CURDIR)/bin
GO         ?= go
GOFLAGS    ?=
DATA_DIR   ?= $(CURDIR)/.kairon
NODES      ?= 2
TEST_FLAGS ?= -race -timeout 30m -count=1
# The longest packages, named first so that go test starts them first
# instead of last (alphabetical) and the run ends with them, not after them.
TEST_FIRST := ./test/e2e/ ./test/images/ ./internal/controller/
CONTROLLER_GEN := $(BIN)/controller-gen
STATICCHECK    := $(BIN)/staticcheck

.PHONY: all deps tools guest generate build images push python-image up test test-unit lint bench bench-egress bench-exec bench-claim bench-clone bench-images bench-scale fmt clean help

all: build

help: ## Show the targets.
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/'

deps: ## Install the Debian packages Kairon needs (idempotent, as root).
	@hack/install-deps.sh

tools: ## Build the pinned Kubernetes control plane, etcd, helm and controller-gen into bin/.
	@hack/tools/build.sh $(BIN)

guest: ## Build the guest image (kernel + initramfs from Debian packages) into bin/guest.
	@hack/guest/build.sh $(BIN)/guest

generate: tools ## Regenerate deepcopy code and CRDs from api/; copy RBAC rules and admission policies into the chart.
	$(CONTROLLER_GEN) object paths=./api/...
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=config/crd/bases
	cp config/crd/bases/*.yaml charts/kairon/crds/
	cp config/rbac/*.yaml charts/kairon/files/rbac/
	cp config/admission/*.yaml charts/kairon/files/admission/

build: ## Build Kairon's commands into bin/.
	$(GO) build -o $(BIN)/ ./cmd/...

# The images' tag (the chart's appVersion by default, which its image.tag
# defaults to) and where they are named and pushed (the chart's image.registry).
VERSION  ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$$/\1/p' charts/kairon/Chart.yaml)
REGISTRY ?= ghcr.io/zyvor

images: deps guest ## Build the kairon-controller, kairon-ui and kairon-node OCI images into bin/images (no container daemon; docs/guides/helm.md).
	$(GO) run ./hack/images --out $(BIN)/images --guest-dir $(BIN)/guest --version $(VERSION) --registry $(REGISTRY)

push: ## Push the images of bin/images to $(REGISTRY) as <name>:$(VERSION) (credentials: docker/podman login).
	$(GO) run ./hack/images push --out $(BIN)/images --version $(VERSION) --registry $(REGISTRY)

python-image: deps ## Build kairon/python:3.11 from Debian packages into the image cache (~/.cache/kairon/images), once per lock; kairon-local up pushes it to its registry (docs/guides/images.md).
	$(GO) run ./hack/images python

up: deps tools guest build ## Run a whole single-host Kairon with state in $(DATA_DIR).
	$(BIN)/kairon-local up --data-dir $(DATA_DIR) --nodes $(NODES)

test: deps tools guest build python-image ## Install, build and run every test, with the race detector.
	$(GO) vet ./...
	set -o pipefail; KAIRON_BIN_DIR=$(BIN) $(GO) test $(TEST_FLAGS) $(TEST_FIRST) ./... 2>&1 | tee $(BIN)/test-output.log || \
		{ hack/test-failures.sh $(BIN)/test-output.log; exit 1; }

# The race detector needs cgo; test-unit runs without it where no C compiler is.
UNIT_RACE := $(shell command -v gcc >/dev/null 2>&1 && echo -race)

test-unit: ## Run the tests that need no root, QEMU, guest image or control plane (go test -short).
	$(GO) test -short $(UNIT_RACE) -count=1 ./...

$(STATICCHECK): hack/lint/go.mod hack/lint/go.sum
	cd hack/lint && $(GO) build -o $(STATICCHECK) honnef.co/go/tools/cmd/staticcheck

lint: $(STATICCHECK) ## go vet and the pinned staticcheck (hack/lint).
	$(GO) vet ./...
	$(STATICCHECK) ./...

bench: deps tools guest build ## Cold boot, evacuation and migration benchmarks (docs/benchmarks.md); the bench-* targets below cover the rest.
	KAIRON_BIN_DIR=$(BIN) $(GO) test -run '^$$' -bench MachineColdBoot -benchtime 10x ./test/e2e/
	KAIRON_BIN_DIR=$(BIN) $(GO) test -run '^$$' -bench EvacuateSim20 -benchtime 3x -timeout 15m ./test/e2e/
	KAIRON_BIN_DIR=$(BIN) $(GO) test -run '^$$' -bench ColdBoot -benchtime 3x ./internal/backend/qemu/
	KAIRON_BIN_DIR=$(BIN) $(GO) test -run '^$$' -bench Migration -benchtime 10x ./internal/backend/qemu/

# The bind benchmark's p99 over one run of 200 claims of each kind is its
# third slowest claim; the runs' claims are pooled in one file and the last
# run reports them together (docs/benchmarks.md).
EGRESS_BIND_RUNS ?= 6
EGRESS_BIND_CLAIMS ?= 200

bench-egress: deps tools ## Egress (real nftables): policy create to enforced, bind with and without spec.egress (EGRESS_BIND_RUNS runs pooled), TCP throughput.
	KAIRON_BIN_DIR=$(BIN) KAIRON_EGRESS_BENCH=1 $(GO) test -count=1 -run 'TestEgressEnforcementLatency$$' -v ./internal/node/
	samples=$$(mktemp) && trap 'rm -f $$samples' EXIT && for i in $$(seq $(EGRESS_BIND_RUNS)); do \
		uptime; \
		KAIRON_BIN_DIR=$(BIN) KAIRON_EGRESS_BENCH=1 KAIRON_EGRESS_BENCH_CLAIMS=$(EGRESS_BIND_CLAIMS) KAIRON_EGRESS_BENCH_SAMPLES=$$samples \
			$(GO) test -count=1 -run 'TestEgressBindLatency$$' -v ./internal/node/ || exit 1; \
	done
	KAIRON_EGRESS_BENCH=1 $(GO) test -count=1 -timeout 20m -run TestEgressThroughput -v ./internal/node/egress/

bench-exec: deps guest ## Guest agent on a real guest: exec round trip of `true` p50/p99, file copy MiB/s.
	KAIRON_BIN_DIR=$(BIN) $(GO) test -count=1 -run '^$$' -bench GuestAgent -benchtime 200x -v ./internal/backend/qemu/

bench-scale: deps tools build ## Control plane at scale on kairon-local: hollow nodes, warm pools, a claim storm with a controller restart (KAIRON_SCALE_SIZES=machines,nodes,pools,claims; default 5000,50,20,2000).
	uptime
	KAIRON_BIN_DIR=$(BIN) KAIRON_SCALE_BENCH=1 $(GO) test -count=1 -timeout 180m -run TestScaleBench -v ./test/e2e/
	uptime

bench-claim: deps tools guest build ## Warm claims on kairon-local (sim, C = 1/100/1000; QEMU, C = 1) against the cold path, API writes per bind.
	uptime
	KAIRON_BIN_DIR=$(BIN) KAIRON_CLAIM_BENCH=1 $(GO) test -count=1 -timeout 120m -run TestClaimBench -v ./test/e2e/
	uptime

bench-images: deps tools guest build python-image ## OCI images against the built-in guest, one run: pull+convert of kairon/python:3.11 (cold, warm cache), disk per image, cold boot and RSS, warm-claim bind (docs/benchmarks.md).
	uptime
	KAIRON_BIN_DIR=$(BIN) KAIRON_IMAGES_BENCH=1 $(GO) test -count=1 -timeout 60m -run TestImagesBench -v ./test/e2e/
	uptime

bench-clone: deps guest build ## Snapshot clones vs cold boots with QEMU, one run: pool refill rate and a claim against an empty pool.
	uptime
	KAIRON_BIN_DIR=$(BIN) KAIRON_CLONE_BENCH=1 $(GO) test -count=1 -timeout 30m -run TestCloneBench -v ./test/e2e/
	uptime

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf $(BIN)
