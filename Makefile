# Sluice: every target installs what it needs on a fresh machine.
#   make demo   - generate a 1 GiB checkpoint, load it cold with safetensors and Sluice
#   make test   - fmt, clippy, ruff, Rust tests, Python tests (what CI runs)
#   make bench-load - the full loader benchmark (4 GiB, cold and warm, vs peers)
#   make bench-sim  - simulator replay throughput vs libCacheSim (10 M requests)
#   make bench-warm - page-cache policies under an unmodified loader (root; ~20 min)
#   make numa-test  - the warm plane's tests in a two-NUMA-node Linux 6.1 VM (part of test)

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
CARGO ?= cargo
# Stamps record that a set-up step is done and redo it when its inputs change.
STAMP := $(VENV)/.stamps

.PHONY: all demo test lint rust-test py-test numa-test build develop bench-load bench-sim bench-warm bench-deps fuzz clean

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
	$(CARGO) build --release --bin sluice

lint: $(STAMP)/deps $(STAMP)/rust
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

rust-test: $(STAMP)/rust
	$(CARGO) test --workspace --exclude sluice-py

py-test: $(STAMP)/develop build
	SLUICE_BIN=$(CURDIR)/target/release/sluice $(PY) -m pytest python/tests -q

# This machine has one NUMA node and a recent kernel, so the warm plane's own
# tests also run in a qemu VM with two nodes and Debian's Linux 6.1 (no
# cachestat, no pre-content events): NUMA placement, and the fallbacks for
# older kernels. scripts/numa-vm.sh installs qemu and fetches the kernel on
# first use (about a minute). A VM that never gets to start the tests here
# is reported and skipped; a failing or hanging test fails the target.
numa-test: $(STAMP)/rust
	bin=$$($(CARGO) test -p sluice-warm --lib --no-run --message-format=json 2>/dev/null \
	  | python3 -c 'import json, sys; print([m["executable"] for m in map(json.loads, sys.stdin) if m.get("executable")][-1])'); \
	rc=0; scripts/numa-vm.sh --timeout 300 "$$bin" > target/numa-test.log 2>&1 || rc=$$?; \
	grep -E '^numa-vm: (node|guest|running)|^test result' target/numa-test.log || true; \
	if [ $$rc -ne 0 ] && ! grep -q '^numa-vm: running' target/numa-test.log; then \
	  echo "numa-test SKIPPED: the VM did not start the tests:"; tail -n 5 target/numa-test.log; \
	elif [ $$rc -ne 0 ]; then \
	  grep -E 'FAILED|panicked|timed out' -A4 target/numa-test.log; exit 1; \
	fi

test: lint rust-test py-test numa-test

demo: $(STAMP)/develop build
	$(PY) benches/demo.py

$(STAMP)/bench-deps: $(STAMP)/deps requirements-bench.txt
	$(PIP) install --quiet -r requirements-bench.txt
	command -v fio >/dev/null || { apt-get update -qq && apt-get install -y -qq fio; }
	touch $@

bench-load: $(STAMP)/develop $(STAMP)/bench-deps
	$(PY) benches/bench_load.py --data bench-data/ckpt-4g --size-gib 4 --runs 3 --out docs/

bench-sim: $(STAMP)/develop
	$(PY) benches/bench_sim.py --out docs/

bench-warm: $(STAMP)/develop build
	$(PY) benches/bench_warm.py --data bench-data/warm --size-gib 4 --runs 3 --out docs/

fuzz:
	cd fuzz && $(CARGO) +nightly fuzz run parse_header -- -max_total_time=60

clean:
	rm -rf target $(VENV) bench-data demo-data
