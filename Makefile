# Thin wrapper around CMake so the README's commands stay short.
#   make test          build (debug, ASan+UBSan) and run the whole suite
#   make test-tsan     the suite under ThreadSanitizer
#   make test-valgrind the deterministic ("fast") tests and the daemon scripts under memcheck
#   make bench         release build, run the benchmarks
#   make fuzz          libFuzzer targets for a bounded time (FUZZ_SECONDS)
JOBS ?= $(shell nproc)
FUZZ_SECONDS ?= 60
CMAKE_FLAGS ?=

.PHONY: all deps deps-c test test-tsan test-valgrind release bench fuzz sim sim-soak soak demo bench-e2e bench-e2e-api bench-peers bench-vllm-tiers install clean format bench-hostile bench-attacks death-loop death-loop-asan partition-loop partition-loop-asan ucx122 test-ucx122 bench-ucx122

all: deps
	@cmake -S . -B build/debug -DCMAKE_BUILD_TYPE=Debug -DKVP_SANITIZE=address,undefined -DKVP_TEST_ROUTES=ON $(CMAKE_FLAGS) >/dev/null
	@cmake --build build/debug -j $(JOBS)

# deps-c: the C side from apt (all the demo, the daemon and the benches need);
# deps adds the project venv (vllm) for the vLLM tier's tests.
deps-c:
	@pkg-config --exists ucx libxxhash cmocka libsodium libmicrohttpd inih libcurl libzmq msgpack 2>/dev/null && \
	  command -v cmake >/dev/null && command -v valgrind >/dev/null || KVPEER_NO_VLLM=1 ./scripts/install-deps.sh

deps: deps-c
	@./scripts/install-py.sh

test: all
	cd build/debug && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

test-tsan: deps
	@cmake -S . -B build/tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVP_SANITIZE=thread -DKVP_TEST_ROUTES=ON $(CMAKE_FLAGS) >/dev/null
	@cmake --build build/tsan -j $(JOBS)
	cd build/tsan && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

test-valgrind: deps
	@cmake -S . -B build/valgrind -DCMAKE_BUILD_TYPE=Debug -DKVP_VALGRIND=ON -DKVP_TEST_ROUTES=ON $(CMAKE_FLAGS) >/dev/null
	@cmake --build build/valgrind -j $(JOBS)
	cd build/valgrind && ctest --output-on-failure -j $(JOBS) -L 'fast|daemon' $(CTEST_ARGS)

release: deps-c
	@cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	@cmake --build build/release -j $(JOBS)

bench: release
	@for b in build/release/bench/*/*_bench; do [ -x "$$b" ] && echo "== $$b" && "$$b" || true; done

fuzz: deps
	@CC=clang cmake -S . -B build/fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVP_FUZZ=ON -DKVP_SANITIZE=address,undefined $(CMAKE_FLAGS) >/dev/null
	@cmake --build build/fuzz -j $(JOBS)
	@./scripts/run-fuzz.sh build/fuzz $(FUZZ_SECONDS)

# The main job: three kvpeerd processes, fetches, injected faults, a report.
demo: release
	build/release/tools/kvpeer demo --kvpeerd build/release/tools/kvpeerd $(DEMO_ARGS)

# End-to-end benchmark (kvpeer bench): writes CSV + PNG to build/bench-out.
bench-e2e: release
	build/release/tools/kvpeer bench --kvpeerd build/release/tools/kvpeerd $(BENCH_ARGS)

# Engine-style end-to-end benchmark of the C API (bench/e2e, issue 17): K
# outstanding fetches between two processes next to the raw UCX put ceiling,
# ucx_perftest and memcpy of the same run. E2E_ARGS=--quick for ~1 minute.
# Writes build/bench-out/e2e.{csv,png}.
bench-e2e-api: release
	build/release/bench/e2e/e2e_bench --out build/bench-out $(E2E_ARGS)

# The peers on the same bytes (bench/e2e/peers): Mooncake Transfer Engine and
# NIXL from their PyPI wheels in build/peers-venv (created here on first use;
# needs PyPI), then kvpeer's e2e_bench on the same cells. PEERS_ARGS=--quick.
PEERS_VENV ?= build/peers-venv
bench-peers: release
	@[ -x $(PEERS_VENV)/bin/python ] || { /usr/bin/python3 -m venv $(PEERS_VENV) && \
	  $(PEERS_VENV)/bin/pip install --progress-bar off mooncake-transfer-engine-non-cuda nixl numpy; }
	$(PEERS_VENV)/bin/python bench/e2e/peers/peers_bench.py --e2e-bench build/release/bench/e2e/e2e_bench \
	  --out build/bench-out $(PEERS_ARGS)

# vLLM's own p2p tier (NIXL) next to kvpeer's tier through vLLM's
# TieringOffloadingManager, two engine processes per tier (python/bench/
# vllm_tiers.py). nixl goes into build/nixl-venv, made here on first use (needs
# PyPI): a venv layered on the project venv (.venv, scripts/install-py.sh) by a
# .pth naming its site-packages, so only nixl's own wheels (~0.5 GB) are added
# (--no-deps: numpy and torch, nixl's requirements, come from .venv).
# VLLM_TIERS_ARGS=--quick for a small run. issue 29: by default kvpeer-zc,
# kvpeer, p2p, kvcr, kvcr-shim at 64 KiB, 256 KiB and 2 MiB chunks, one
# request at a time and 4 open at a time (--inflight 1,4): a table per size and
# count with the zero-copy goal line (~7 min on the 2-core VM).
NIXL_VENV ?= build/nixl-venv
NIXL_VERSION ?= 1.5.1
# issue 28: vLLM's KVCR tier (PyPI kvcr; pins nixl 1.5.0) in its own venv,
# layered on .venv the same way; its engines run with that venv's python.
KVCR_VENV ?= build/kvcr-venv
KVCR_VERSION ?= 0.1.1
KVCR_NIXL ?= 1.5.0
bench-vllm-tiers: release
	@sh scripts/install-py.sh
	@[ -x $(NIXL_VENV)/bin/python ] || { /usr/bin/python3 -m venv $(NIXL_VENV) && \
	  $(NIXL_VENV)/bin/python -c 'import sysconfig,sys; print(sysconfig.get_paths()["purelib"])' | \
	  { read sp; readlink -f .venv/lib/python3*/site-packages > "$$sp/kvpeer-project-venv.pth"; } && \
	  $(NIXL_VENV)/bin/pip install --progress-bar off --no-deps \
	    nixl==$(NIXL_VERSION) nixl-cu12==$(NIXL_VERSION) nixl-cu13==$(NIXL_VERSION); }
	@[ -x $(KVCR_VENV)/bin/python ] || { /usr/bin/python3 -m venv $(KVCR_VENV) && \
	  $(KVCR_VENV)/bin/python -c 'import sysconfig,sys; print(sysconfig.get_paths()["purelib"])' | \
	  { read sp; readlink -f .venv/lib/python3*/site-packages > "$$sp/kvpeer-project-venv.pth"; } && \
	  $(KVCR_VENV)/bin/pip install --progress-bar off --no-deps kvcr==$(KVCR_VERSION) \
	    nixl==$(KVCR_NIXL) nixl-cu12==$(KVCR_NIXL) nixl-cu13==$(KVCR_NIXL); }
	KVPEER_LIB=build/release/libkvpeer.so $(NIXL_VENV)/bin/python python/bench/vllm_tiers.py \
	  --kvcr-python $(KVCR_VENV)/bin/python $(VLLM_TIERS_ARGS)

# issue 28: a request's lookup cost (LOOKUP frames, control bytes, scheduler
# time) against 1, 4, 16, 64 peers, with and without a router hint, through
# vLLM's TieringOffloadingManager (python/bench/lookup_cost.py; prints a table).
# issue 28: the vLLM tests against vllm 0.33.0 (CI runs 0.34.0 from .venv).
# build/vllm033-venv is layered on .venv like the nixl one, with vllm 0.33.0
# and what it needs beyond .venv (python/requirements-vllm033.txt, --no-deps;
# ~0.4 GB: 0.33.0 pins the same torch). Never touches .venv.
VLLM033_VENV ?= build/vllm033-venv
VLLM033_TESTS = python/tests/test_vllm.py python/tests/test_vllm_fleet.py \
  python/tests/test_vllm_observe.py python/tests/test_vllm_sched.py python/tests/test_vllm_events.py \
  python/tests/test_vllm_dns.py
.PHONY: test-vllm033
test-vllm033: release
	@sh scripts/install-py.sh
	@[ -f $(VLLM033_VENV)/.kvpeer-stamp ] && cmp -s $(VLLM033_VENV)/.kvpeer-stamp python/requirements-vllm033.txt || { \
	  rm -rf $(VLLM033_VENV) && /usr/bin/python3 -m venv $(VLLM033_VENV) && \
	  $(VLLM033_VENV)/bin/python -c 'import sysconfig,sys; print(sysconfig.get_paths()["purelib"])' | \
	  { read sp; readlink -f .venv/lib/python3*/site-packages > "$$sp/kvpeer-project-venv.pth"; } && \
	  $(VLLM033_VENV)/bin/pip install --progress-bar off --no-deps -r python/requirements-vllm033.txt && \
	  cp python/requirements-vllm033.txt $(VLLM033_VENV)/.kvpeer-stamp; }
	KVPEER_TEST_VLLM_VERSION=0.33.0 KVPEER_LIB=build/release/libkvpeer.so UCX_NET_DEVICES=lo \
	  KVPEERD=build/release/tools/kvpeerd $(VLLM033_VENV)/bin/python -m pytest -q -rs \
	  -p no:cacheprovider -o faulthandler_timeout=120 $(VLLM033_TESTS)
	KVPEER_LIB=build/release/libkvpeer.so UCX_NET_DEVICES=lo $(VLLM033_VENV)/bin/python \
	  python/tests/vllm_suite/run_suite.py --dest $(CURDIR)/build/vllm-sdist

.PHONY: bench-lookup-cost
bench-lookup-cost: release
	@sh scripts/install-py.sh
	KVPEER_LIB=build/release/libkvpeer.so UCX_NET_DEVICES=lo .venv/bin/python python/bench/lookup_cost.py $(LOOKUP_COST_ARGS)

# make install PREFIX=/usr/local
PREFIX ?= /usr/local
install: deps-c
	@cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=$(PREFIX) $(CMAKE_FLAGS) >/dev/null
	@cmake --build build/release -j $(JOBS)
	cmake --install build/release --prefix $(PREFIX)

# Soak: three kvpeerd under churn (SIGKILL/SIGTERM restarts), MINUTES long;
# prints RSS at start and end, operations, faults and violations.
MINUTES ?= 10
soak: release
	/usr/bin/python3 tests/reliability/soak.py build/release/tools/kvpeerd --seconds $$(( $(MINUTES) * 60 ))

# Hostile peers vs the good peer's throughput: alternating quiet/attack
# windows, longer than the ctest run's; prints "goal >= 0.80: met / NOT met".
bench-hostile: release
	/usr/bin/python3 tests/reliability/hostile.py build/release/tools/kvpeerd --bench $(HOSTILE_ARGS)

# Issue 27: a good peer's fetch rate quiet vs under each attack on every door.
bench-attacks: release
	/usr/bin/python3 tests/reliability/attack_bench.py build/release/tools/kvpeerd --bench $(ATTACK_ARGS)

# A peer's death never takes the process down (issue 14): RUNS SIGKILLs of the
# source and of the consumer mid-fetch, on tcp (kvpeer's AM path) and on shm;
# release build (death-loop) or the ASan+UBSan build (death-loop-asan).
# DEATH_ARGS=--external: both processes in external-slots mode (issue 29).
RUNS ?= 100
death-loop: release
	UCX_NET_DEVICES=lo /usr/bin/python3 tests/reliability/death_loop.py build/release/tests/node/e2e_node --runs $(RUNS) $(DEATH_ARGS)
death-loop-asan: all
	UCX_NET_DEVICES=lo KVPEER_TEST_TIME_SCALE=3 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/sanitizer/lsan.supp UBSAN_OPTIONS=halt_on_error=1 \
	  /usr/bin/python3 tests/reliability/death_loop.py build/debug/tests/node/e2e_node --runs $(RUNS) $(DEATH_ARGS)

# Partitions never crash a daemon (issue 14): RUNS runs of partition.py
# (needs root: network namespaces), PART_JOBS at a time; per run pass/fail and
# any daemon death with its crash site; last line "partition-loop: N runs, X
# daemon crashes, Y post-heal fetch failures". Release build, or the ASan+UBSan
# build (partition-loop-asan). Not a ctest test (about 60 s a run).
PART_JOBS ?= 1
partition-loop: release
	/usr/bin/python3 tests/reliability/partition_loop.py build/release/tools/kvpeerd --runs $(RUNS) --jobs $(PART_JOBS) $(PART_ARGS)
partition-loop-asan: all
	KVPEER_TEST_TIME_SCALE=3 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:disable_coredump=0 \
	  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/sanitizer/lsan.supp UBSAN_OPTIONS=halt_on_error=1 \
	  /usr/bin/python3 tests/reliability/partition_loop.py build/debug/tools/kvpeerd --runs $(RUNS) --jobs $(PART_JOBS) $(PART_ARGS)

# UCX 1.22 beside Debian's 1.13 (issue 30): UCX from PyPI's libucx-cu12 wheel
# in build/ucx122-venv (scripts/install-ucx122.sh: found through its
# pkg-config files, fixed up in build/ucx122-pkgconfig), kvpeer built against
# it in build/ucx122 (RelWithDebInfo, ASan+UBSan; the binaries' RUNPATH names
# the wheel's lib/, so they load that UCX, and UCX its modules from lib/ucx).
# test-ucx122 runs there: the UCX version check, the transport tests, the node
# end-to-end tests, the hostile data-plane tests, a short death loop (tcp and
# shm, both kill directions, UCX122_DEATH_RUNS runs each; and 2 in external-
# slots mode, issue 29) and the short demo.
UCX122_DIR ?= build/ucx122
UCX122_TESTS ?= ^(test_ucx.*|test_node_e2e|test_node_ops|test_node_cma_ucx|test_kvpeerd_two_nodes|reliability_hostile|reliability_hostile_fetchdone|reliability_hostile_tcpd|reliability_foreign_ucx|reliability_ucx_listen_netns|test_cli_demo)$$
UCX122_DEATH_RUNS ?= 5
# Only what those tests run is built (CI time): a test added to UCX122_TESTS
# whose program is not listed here fails as "Not Run" (UCX122_TARGETS= builds all).
UCX122_TARGETS ?= test_ucx test_ucx_fail test_ucx_wedge test_ucx_blob test_ucx_version test_ucx_proof test_ucx_log \
  test_ucx_cma test_node_cma_ucx test_node_e2e e2e_node test_node_ops kvpeerd kvpeer_cli kvpeer foreign_ucx foreign_uct
ucx122: deps-c
	@pc=$$(./scripts/install-ucx122.sh) && PKG_CONFIG_PATH="$$pc" cmake -S . -B $(UCX122_DIR) \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVP_SANITIZE=address,undefined $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(UCX122_DIR) -j $(JOBS) $(if $(strip $(UCX122_TARGETS)),--target $(UCX122_TARGETS))

test-ucx122: ucx122
	@ldd $(UCX122_DIR)/tools/kvpeerd | grep -E 'libuc[pts]\.' | sed 's/^[[:space:]]*/test-ucx122: kvpeerd loads /'
	@UCX_NET_DEVICES=lo $(UCX122_DIR)/tests/transport/test_ucx_version 2>&1 | sed -n 's/^# UCX/test-ucx122: UCX/p'
	cd $(UCX122_DIR) && ctest --output-on-failure -j $(JOBS) -R '$(UCX122_TESTS)' $(CTEST_ARGS)
	UCX_NET_DEVICES=lo KVPEER_TEST_TIME_SCALE=3 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/sanitizer/lsan.supp UBSAN_OPTIONS=halt_on_error=1 \
	  /usr/bin/python3 tests/reliability/death_loop.py $(UCX122_DIR)/tests/node/e2e_node \
	  --runs $(UCX122_DEATH_RUNS) --blocks 400 $(DEATH_ARGS)
	UCX_NET_DEVICES=lo KVPEER_TEST_TIME_SCALE=3 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/sanitizer/lsan.supp UBSAN_OPTIONS=halt_on_error=1 \
	  /usr/bin/python3 tests/reliability/death_loop.py $(UCX122_DIR)/tests/node/e2e_node \
	  --runs 2 --blocks 400 --kill-ms 10 --external

# e2e_bench --quick on the Debian UCX (release build) and on UCX 1.22 (a
# release build in build/ucx122-release), one after the other in one run;
# the 1.22 run's ceilings use the wheel's ucx_perftest (its own RUNPATH names
# the wheel builder's prefix: LD_LIBRARY_PATH).
bench-ucx122: release
	@pc=$$(./scripts/install-ucx122.sh) && PKG_CONFIG_PATH="$$pc" cmake -S . -B build/ucx122-release \
	  -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	@cmake --build build/ucx122-release -j $(JOBS) --target e2e_bench ucx_bench
	@echo "== UCX $$(pkg-config --modversion ucx) (build/release)"
	build/release/bench/e2e/e2e_bench --quick --out build/bench-out/ucx113 $(E2E_ARGS)
	@echo "== UCX 1.22 (build/ucx122-release)"
	w=$$(PKG_CONFIG_PATH=$$(./scripts/install-ucx122.sh) pkg-config --variable=prefix ucx) && \
	  PATH="$$w/bin:$$PATH" LD_LIBRARY_PATH="$$w/lib" \
	  build/ucx122-release/bench/e2e/e2e_bench --quick --out build/bench-out/ucx122 $(E2E_ARGS)

# The deterministic simulator: `make sim` runs SEEDS seeds (default 40),
# `make sim SEED=x` replays one seed verbosely, `make sim SOAK=60` soaks.
# `make sim-soak SEEDS=100000` runs that many seeds from FIRST (default: a
# random first seed, printed) on SIM_JOBS processes; prints seeds/s, wall
# time, faults by kind and violations (exit 1 on any).
SEEDS ?= 40
STEPS ?= 600
SIM_JOBS ?= $(JOBS)
sim: release
	@if [ -n "$(SEED)" ]; then build/release/tests/node/kvpeer_sim --seed $(SEED) --steps $(STEPS) --verbose; \
	elif [ -n "$(SOAK)" ]; then build/release/tests/node/kvpeer_sim --soak $(SOAK) --steps $(STEPS) --jobs $(SIM_JOBS); \
	else build/release/tests/node/kvpeer_sim --seeds $(SEEDS) --steps $(STEPS); fi

sim-soak: release
	@first="$(FIRST)"; [ -n "$$first" ] || first=$$(( $$(od -An -N4 -tu4 /dev/urandom) % 4000000000 + 1 )); \
	echo "sim-soak: $(SEEDS) seeds from $$first, $(STEPS) steps, $(SIM_JOBS) jobs"; \
	/usr/bin/time -f "sim-soak: wall %e s, CPU %U s user + %S s sys" \
	  build/release/tests/node/kvpeer_sim --first $$first --seeds $(SEEDS) --steps $(STEPS) --jobs $(SIM_JOBS)

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf build
