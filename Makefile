# shardwise: the obvious verbs. `make test` sets up everything it needs (virtual environments
# and a compiler cache outside the clone, keyed by what determines them), builds, and runs the
# C++ and Python tests.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := test

PYTHON ?= python3
CACHE ?= $(HOME)/.cache/shardwise
key = $(shell { $(PYTHON) --version; cat $(1); } | sha256sum | cut -c1-16)
VENV ?= $(CACHE)/venv-$(call key,requirements/dev.txt)
CPU_VENV ?= $(CACHE)/venv-cpu-$(call key,requirements/libtorch-cpu.txt)
OLDEST_VENV ?= $(CACHE)/venv-oldest-$(call key,requirements/torch-oldest.txt)
PY := $(VENV)/bin/python
CPU_PY := $(CPU_VENV)/bin/python
OLDEST_PY := $(OLDEST_VENV)/bin/python
CMAKE_BUILD ?= build/cmake
JOBS ?= $(shell nproc)
# Each suite's command runs through scripts/suite_times.py: `make test` ends with the table of
# what ran, how long and how many tests (build/suite-times.tsv).
TIMED = $(PYTHON) $(CURDIR)/scripts/suite_times.py run
export SUITE_TIMES ?= $(CURDIR)/build/suite-times.tsv

export CCACHE_DIR ?= $(CACHE)/ccache
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1
# -B moves only where the linker looks (tests/toolchain/static-runtime): out of the cache's key, so
# test-cpu-torch's library objects are test-cpp's, compiled once (the same sources, flags, torch).
export CCACHE_IGNOREOPTIONS := -B*
# The precompiled torch headers (CMakeLists.txt's SHARDWISE_PRECOMPILE_HEADERS): the cache keys a
# file on the .gch it loads, and caches the .gch itself; ccache needs these two to do either.
export CCACHE_SLOPPINESS := pch_defines,time_macros
# torch >= 2.13's cpp_extension puts `ccache` in front of the compiler it is given. Given
# test-cpu-torch's static-runtime wrapper, ccache then keyed the Python module's objects on that
# script's file time, new in every clone: its 9 sources compiled in every run, and again (as plain
# c++) in test-package's prebuilt-library test. The masquerade above already caches every compile.
export TORCH_NO_COMPILER_WRAPPER := 1
export MAX_JOBS ?= $(JOBS)
# Debian's ccache masquerade directory (installed by system-deps, so it may not exist yet): CMake
# finds c++ there, so every build compiles through ccache with the real compiler in its key.
# (ccache as CMake's launcher in front of that c++ keyed the objects on ccache's own binary: the
# same sources compiled by pip's build of the library missed them.)
export PATH := /usr/lib/ccache:$(PATH)
ifneq ($(wildcard /usr/local/cuda/bin/nvcc),)
export CUDA_HOME ?= /usr/local/cuda
endif
ifdef CUDA_HOME
export PYTORCH_NVCC ?= ccache $(CUDA_HOME)/bin/nvcc
endif

.PHONY: demo demo-cpp test test-all test-prediction test-cpp test-python test-cpu-torch test-torch-oldest test-package test-package-slow build venv \
	cpu-venv oldest-venv venvs times-reset later-builds build-deepspeed-ops build-cpu-torch build-torch-oldest build-sanitize-core \
	test-conformance test-conformance-world8 test-conformance-ci test-conformance-hosts test-sanitize test-sanitize-core fuzz fuzz-build fuzz-ci soak \
	system-deps bench bench-hosts bench-hosts-training bench-zeropp test-gpu gpu-diagnose gpu-wheels train-fsdp \
	format lint clean

test: times-reset venvs build lint test-cpp later-builds test-python test-cpu-torch test-torch-oldest test-package test-conformance-ci test-sanitize-core fuzz-ci ## build, then run every test suite
	@$(PYTHON) scripts/suite_times.py report

# The later suites' builds run at idle priority beside the suites before them, from test-python
# on (scripts/later_builds.py): test-python leaves a core idle for much of its time. Each later
# suite waits for its own build there; run alone, it builds it itself. First the DeepSpeed ops
# test-python's DeepSpeed tests load (they wait on the op's lock if it is still building).
LATER_BUILDS := build-deepspeed-ops build-cpu-torch build-torch-oldest build-sanitize-core fuzz-build
test: export SHARDWISE_LATER_BUILDS := $(CURDIR)/build/later-builds
later = $(PYTHON) $(CURDIR)/scripts/later_builds.py take $(1) -- $(MAKE) --no-print-directory $(1)
later-builds: system-deps cpu-venv oldest-venv
	$(PYTHON) scripts/later_builds.py start --watch $$PPID $(LATER_BUILDS)

build-deepspeed-ops: venv ## DeepSpeed's CPU ops the DeepSpeed tests load, compiled ahead of them
	$(TIMED) "build: DeepSpeed's CPU ops" -- $(PY) scripts/build_deepspeed_ops.py

times-reset:
	@$(PYTHON) scripts/suite_times.py reset

demo: build ## 2-process CPU training of the bundled GPT (FSDP, bf16), ~2 minutes: outputs/demo/
	rm -rf outputs/demo
	OMP_NUM_THREADS=1 $(VENV)/bin/torchrun --standalone --nproc_per_node=2 -m shardwise.train \
		--config examples/configs/demo.yaml
	$(VENV)/bin/shardwise-plot outputs/demo

# The FSDP guide's launch line on whatever this machine has: one process per GPU, else one per
# CPU core (torchrun's --nproc_per_node=auto); ARGS adds flags or overrides (training.max_steps=5).
train-fsdp: build ## FSDP training of the small GPT on every GPU here, else every CPU core: outputs/fsdp/
	OMP_NUM_THREADS=1 $(VENV)/bin/torchrun --standalone --nproc_per_node=auto -m shardwise.train \
		--config examples/configs/fsdp.yaml --use-fsdp $(ARGS)

TRAIN_GPT_BUILD := build/train_gpt
demo-cpp: build ## the C++ GPT trainer (examples/cpp/train_gpt) against the installed package, 2 processes
	cmake -S examples/cpp/train_gpt -B $(TRAIN_GPT_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release \
		$(if $(CUDA_HOME),-DCUDA_TOOLKIT_ROOT_DIR=$(CUDA_HOME) \
		-DCMAKE_CUDA_COMPILER=$(CUDA_HOME)/bin/nvcc) \
		-DCMAKE_PREFIX_PATH="$$($(PY) -c 'import torch, shardwise; \
		print(torch.utils.cmake_prefix_path + ";" + shardwise.cmake_prefix_path)')"
	cmake --build $(TRAIN_GPT_BUILD)
	mkdir -p outputs && $(PY) -m shardwise.train.data outputs/corpus.txt
	OMP_NUM_THREADS=1 $(VENV)/bin/torchrun --no-python --standalone --nproc_per_node=2 \
		$(TRAIN_GPT_BUILD)/train_gpt --data outputs/corpus.txt --steps 200 --log-every 20

system-deps: ## compilers' companions from Debian: GoogleTest, ccache, CMake, Ninja, clang (fuzzing)
	@bash scripts/install_system_deps.sh

venv: $(VENV)/.complete
cpu-venv: $(CPU_VENV)/.complete
oldest-venv: $(OLDEST_VENV)/.complete
# The three are independent, so `make test` makes the missing ones side by side before its first
# build: pip spends much of an install reading indexes and unpacking, not computing.
venvs:
	@$(MAKE) --no-print-directory -j3 venv cpu-venv oldest-venv

# A venv is usable only once its stamp exists; an interrupted install is started over.
$(CACHE)/venv-%/.complete:
	rm -rf $(@D)
	$(PYTHON) -m venv $(@D)
	$(@D)/bin/pip install -q --upgrade pip
	$(TIMED) "setup: $(notdir $(@D))" -- $(@D)/bin/pip install -q -r $(if $(findstring venv-cpu-,$(@D)),requirements/libtorch-cpu.txt,$(if \
		$(findstring venv-oldest-,$(@D)),requirements/torch-oldest.txt,requirements/dev.txt))
	touch $@

# Test-only packages, installed into the dev venv under their own stamp (keyed by their file).
EXTRAS := $(VENV)/.extras-$(call key,requirements/test-extras.txt)
$(EXTRAS): $(VENV)/.complete
	$(PY) -m pip install -q -r requirements/test-extras.txt
	touch $@

build: system-deps venv $(EXTRAS) ## the Python extension, editable, CUDA sources included when possible
	$(TIMED) "build: extension" -- $(PY) -m pip install -q --no-build-isolation --no-deps -e .
	$(PY) -c "import shardwise; print('shardwise', shardwise.__version__, 'CPU ISA', shardwise.detected_cpu_isa())"

test-cpp: system-deps cpu-venv ## GoogleTest: the torch-free core and the LibTorch-linked library
	cmake -S . -B $(CMAKE_BUILD) -G Ninja \
		-DCMAKE_PREFIX_PATH="$$($(CPU_PY) -c 'import torch; print(torch.utils.cmake_prefix_path)')"
	$(TIMED) "build: test-cpp" -- cmake --build $(CMAKE_BUILD) -j $(JOBS)
	$(TIMED) test-cpp -- ctest --test-dir $(CMAKE_BUILD) --output-on-failure -j $(JOBS)

# The C++ package from its users' side (tests/package): examples/cpp/train_gpt built out of tree
# against cmake --install's prefix and pip's copy (CPU torch), against the editable install (CUDA
# torch), and refused by name against a torch of the other minor version.
test-package: test-cpp test-cpu-torch build ## the installed C++ package, consumed out of tree
	cmake --install $(CMAKE_BUILD) --prefix $(CMAKE_BUILD)/install > /dev/null
	SHARDWISE_INSTALL_PREFIX=$(CURDIR)/$(CMAKE_BUILD)/install \
	SHARDWISE_OTHER_TORCH="$$($(PY) -c 'import torch; print(torch.utils.cmake_prefix_path)')" \
		$(TIMED) "test-package (CPU torch)" -- $(CPU_PY) -m pytest -ra -p no:cacheprovider -m "not slow" tests/package
	SHARDWISE_OTHER_TORCH="$$($(CPU_PY) -c 'import torch; print(torch.utils.cmake_prefix_path)')" \
		$(TIMED) "test-package (dev torch)" -- $(PY) -m pytest -ra -p no:cacheprovider -m "not slow" tests/package

test-package-slow: test-cpp build ## tests/package's 8-process checks: both trainers place dp x pp x tp alike
	$(PY) -m pytest -ra -p no:cacheprovider -m slow tests/package

test-all: test test-package-slow test-prediction ## every suite, the 8-process ones too (deterministic training at world 8)
	SHARDWISE_TEST_ALL=1 $(PY) -m pytest -ra -p no:cacheprovider \
		tests/distributed/test_train_deterministic.py -k world_8

test-prediction: build ## the planner's predicted step and peak RSS against two runs, the step asserted too (a quiet machine)
	SHARDWISE_TEST_STEP_TIME=1 $(PY) -m pytest -ra -s -p no:cacheprovider \
		tests/distributed/test_train_prediction.py

test-python: build ## pytest: ops, exhaustive casts, distributed (multi-process)
	$(TIMED) test-python -- $(PY) -m pytest -ra --durations=30 tests/python $(wildcard tests/distributed) || { rc=$$?; \
		[ $$rc -eq 5 ] && echo "pytest collected no tests: that is a failure here"; exit $$rc; }

# PyTorch's own distributed suite (torch/testing/_internal/distributed/distributed_test.py from the
# installed wheel, gated so shardwise counts as gloo) on shardwise and on gloo: every test that
# passes on gloo passes on shardwise or is listed in tests/conformance/known_differences.txt.
CONFORMANCE := build/conformance
test-conformance: build ## torch's distributed suite: every CPU test at world 2, samples at 3 and 4, the 8-rank tests (~1.5 h)
	$(PY) tests/conformance/run.py --out $(CONFORMANCE)
	$(PY) tests/conformance/run.py --out $(CONFORMANCE) --world 3 --subset world3
	$(PY) tests/conformance/run.py --out $(CONFORMANCE) --world 4 --subset world4
	$(MAKE) test-conformance-world8

test-conformance-world8: build ## torch's tests that need 8 ranks (skip_if_small_worldsize), both backends
	$(PY) tests/conformance/run.py --out $(CONFORMANCE) --world 8 --decorated skip_if_small_worldsize

test-conformance-ci: build ## the CI sample of torch's distributed suite (tests/conformance/ci_subset.txt)
	$(TIMED) test-conformance-ci -- $(PY) tests/conformance/run.py --out $(CONFORMANCE)/ci --subset ci

test-conformance-hosts: build ## the CI sample at world 4, shardwise's ranks as if on 2 hosts (~6 min)
	$(PY) tests/conformance/run.py --out $(CONFORMANCE)/hosts --subset ci --world 4 --hosts 2

# Sanitizers (GCC): the torch-free core and its tests under AddressSanitizer + UndefinedBehavior-
# Sanitizer, and the transports and collectives under ThreadSanitizer (in make test); the
# LibTorch-linked library and its tests under ASan + UBSan too (test-sanitize; LibTorch itself is
# not instrumented). Every report is fatal (-fno-sanitize-recover), so a report fails the run.
SANITIZE_BUILD := build/sanitize
# -O1 -g1, the optimisation the sanitizers' own documentation recommends, with line tables only:
# a report still names every frame's file and line, and the build takes about half the time of
# RelWithDebInfo's -O2 -g (the core under ASan on 2 cores, nothing cached: 103 s against 180 s;
# its tests 61 s against 62 s).
SANITIZE_FLAGS := -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG"
SANITIZE_CMAKE = cmake -S . -G Ninja $(SANITIZE_FLAGS)
export ASAN_OPTIONS ?= detect_leaks=1:abort_on_error=1:strict_string_checks=1
export UBSAN_OPTIONS ?= print_stacktrace=1
export TSAN_OPTIONS ?= halt_on_error=1:second_deadlock_stack=1
TSAN_TESTS := Collectives|ShmTransport|TcpTransport|StreamOrder
# The exhaustive casts (every float, ~16 minutes under ASan): in test-sanitize, not in make test.
SANITIZE_SLOW := OnAllFloats|MatchesCompilerConversion
build-sanitize-core: system-deps
	$(SANITIZE_CMAKE) -B $(SANITIZE_BUILD)/address -DSHARDWISE_WITH_TORCH=OFF -DSHARDWISE_SANITIZE=address,undefined
	$(TIMED) "build: asan" -- cmake --build $(SANITIZE_BUILD)/address -j $(JOBS)
	$(SANITIZE_CMAKE) -B $(SANITIZE_BUILD)/thread -DSHARDWISE_WITH_TORCH=OFF -DSHARDWISE_SANITIZE=thread
	$(TIMED) "build: tsan" -- cmake --build $(SANITIZE_BUILD)/thread -j $(JOBS)

test-sanitize-core: system-deps ## ASan+UBSan on the torch-free core's tests, TSan on its transports/collectives
	$(call later,build-sanitize-core)
	$(TIMED) "test-sanitize-core (asan)" -- ctest --test-dir $(SANITIZE_BUILD)/address --output-on-failure -j $(JOBS) -E '$(SANITIZE_SLOW)'
	$(TIMED) "test-sanitize-core (tsan)" -- ctest --test-dir $(SANITIZE_BUILD)/thread --output-on-failure -j $(JOBS) -R '$(TSAN_TESTS)'

test-sanitize: test-sanitize-core cpu-venv ## the above, the exhaustive casts, and the LibTorch library and its tests under ASan+UBSan (~45 min)
	$(SANITIZE_CMAKE) -B $(SANITIZE_BUILD)/torch -DSHARDWISE_SANITIZE=address,undefined \
		-DCMAKE_PREFIX_PATH="$$($(CPU_PY) -c 'import torch; print(torch.utils.cmake_prefix_path)')"
	ctest --test-dir $(SANITIZE_BUILD)/address --output-on-failure -j $(JOBS) -R '$(SANITIZE_SLOW)'
	cmake --build $(SANITIZE_BUILD)/torch -j $(JOBS)
	ASAN_OPTIONS=$(ASAN_OPTIONS):detect_leaks=0 ctest --test-dir $(SANITIZE_BUILD)/torch --output-on-failure -j $(JOBS) -E 'Sweep/'

# libFuzzer (clang): tests/fuzz/fuzz_*.cc, built with ASan + UBSan. fuzz-ci (in make test) runs
# each target for seconds, fuzz for FUZZ_SECONDS (default 10 minutes) each.
FUZZ_BUILD := build/fuzz
FUZZ_SECONDS ?= 600
fuzz-build: system-deps
	cmake -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_CXX_COMPILER=clang++-14 $(SANITIZE_FLAGS) \
		-DSHARDWISE_WITH_TORCH=OFF -DSHARDWISE_BUILD_TESTS=OFF -DSHARDWISE_FUZZ=ON \
		-DSHARDWISE_SANITIZE=address,undefined
	$(TIMED) "build: fuzz" -- cmake --build $(FUZZ_BUILD) -j $(JOBS)

fuzz: fuzz-build ## every fuzz target for FUZZ_SECONDS (600) each, after its regression inputs
	scripts/run_fuzzers.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

fuzz-ci: system-deps ## every fuzz target for 20 s, after its regression inputs
	$(call later,fuzz-build)
	$(TIMED) fuzz-ci -- scripts/run_fuzzers.sh $(FUZZ_BUILD) 20

# Fault soak (outside CI): SOAK_TRIALS runs of shardwise-train at 2-4 ranks, a random rank
# SIGKILLed at a random moment, then SOAK_LINK_CUTS runs over TCP between two network namespaces
# whose link is cut mid-training, then SOAK_ASYNC kills with asynchronous checkpoints (mostly
# while the background writer writes); the table lands in $(SOAK)/soak.md (tests/soak/soak.py).
SOAK := build/soak
SOAK_TRIALS ?= 100
SOAK_LINK_CUTS ?= 10
SOAK_ASYNC ?= 30
soak: build ## SIGKILL and link-cut trials: hangs, leaks, lost checkpoints, detection (~1-2 h)
	$(PY) tests/soak/soak.py --trials $(SOAK_TRIALS) --link-cuts $(SOAK_LINK_CUTS) \
		--async-saves $(SOAK_ASYNC) --out $(SOAK)

# Built with tests/toolchain/static-runtime/{gcc,c++}: this machine's compilers finding the C++
# runtime as a GPU image's compiler wrapper does (libstdc++.a first), so that the op tests, and
# the exception paths of test_cxx_runtime.py, run against such a build here too. c++ is the name
# test-cpp's build compiles with, so the compiler cache serves its objects here.
STATIC_RUNTIME_CC := $(CURDIR)/tests/toolchain/static-runtime
build-cpu-torch: system-deps cpu-venv
	CC=$(STATIC_RUNTIME_CC)/gcc CXX=$(STATIC_RUNTIME_CC)/c++ SHARDWISE_WITH_CUDA=0 \
		$(TIMED) "build: CPU torch" -- $(CPU_PY) -m pip install -q --no-build-isolation --no-deps .

test-cpu-torch: system-deps cpu-venv ## the CPU-only build (GPU image's toolchain) against the CPU torch, and its op tests
	$(call later,build-cpu-torch)
	cd tests && $(TIMED) test-cpu-torch -- $(CPU_PY) -m pytest -ra -m "not slow" python/test_cast_ops.py \
		python/test_cxx_runtime.py

# The oldest supported torch (requirements/torch-oldest.txt), CPU-only build: the op tests, the
# C++ runtime's exception paths, and FSDP against one process and FSDP2 at world 2.
build-torch-oldest: system-deps oldest-venv
	SHARDWISE_WITH_CUDA=0 $(TIMED) "build: oldest torch" -- $(OLDEST_PY) -m pip install -q --no-build-isolation --no-deps .

test-torch-oldest: system-deps oldest-venv ## the build and the op and FSDP tests against the oldest supported torch
	$(call later,build-torch-oldest)
	cd tests && $(TIMED) test-torch-oldest -- $(OLDEST_PY) -m pytest -ra -m "not slow" python/test_cast_ops.py \
		python/test_cxx_runtime.py python/test_torch_versions.py distributed/test_fsdp.py -k "not -4]"

bench: build ## benchmarks (with OpenMPI as an anchor); results land in benchmarks/results/
	bash scripts/install_bench_deps.sh
	$(VENV)/bin/pip install -q -r requirements/bench.txt
	$(PY) benchmarks/bench_cast.py --output benchmarks/results/$$(date +%Y-%m-%d)-cast-cpu.md
	$(PY) benchmarks/bench_collectives.py \
		--output benchmarks/results/$$(date +%Y-%m-%d)-collectives-cpu.md
	$(PY) benchmarks/bench_shard_copies.py \
		--output benchmarks/results/$$(date +%Y-%m-%d)-shard-copies-cpu.md
	$(PY) benchmarks/bench_fsdp.py --output benchmarks/results/$$(date +%Y-%m-%d)-fsdp-cpu.md
	$(PY) benchmarks/bench_optim.py --output benchmarks/results/$$(date +%Y-%m-%d)-optim-cpu.md
	$(PY) benchmarks/bench_zero.py --output benchmarks/results/$$(date +%Y-%m-%d)-zero-cpu.md
	$(PY) benchmarks/bench_deepspeed.py \
		--output benchmarks/results/$$(date +%Y-%m-%d)-deepspeed-cpu.md
	$(PY) benchmarks/bench_planner.py --output benchmarks/results/$$(date +%Y-%m-%d)-planner-cpu.md
	$(PY) benchmarks/bench_tensor_parallel.py \
		--output benchmarks/results/$$(date +%Y-%m-%d)-tensor-parallel-cpu.md
	cd benchmarks && $(PY) bench_pipeline.py --output results/$$(date +%Y-%m-%d)-pipeline-cpu.md \
		--png results/$$(date +%Y-%m-%d)-pipeline-zb-h1-timeline.png

# Collectives on 4 emulated hosts x 2 ranks (tests/distributed/hosts.py: namespaces on a bridge,
# needs root), each host's link shaped with tc's tbf to 1 Gbit/s, then 10 Gbit/s: shardwise
# (hierarchical across hosts, and the flat ring) beside gloo, interleaved fresh launches (~15 min).
bench-hosts: build ## collectives across 4 emulated hosts x 2 ranks at 1 and 10 Gbit/s
	for rate in 1gbit 10gbit; do $(PY) benchmarks/bench_hosts.py --hosts 4 --ranks-per-host 2 \
		--rate $$rate --output benchmarks/results/$$(date +%Y-%m-%d)-hosts-4x2-$$rate-cpu.md; done

# Training on 4 emulated hosts x 2 ranks at 1 and 10 Gbit/s: shardwise's FSDP hybrid, ZeRO-3 and
# the ZeRO++ keys beside torch FSDP2 HSDP and DeepSpeed ZeRO-3 (over gloo and over shardwise's
# backend), and the compute-only limit, interleaved fresh launches (~40 min per rate).
bench-hosts-training: build ## training across 4 emulated hosts x 2 ranks beside FSDP2 HSDP and DeepSpeed ZeRO-3
	for rate in 1gbit 10gbit; do $(PY) benchmarks/bench_hosts_training.py --hosts 4 \
		--ranks-per-host 2 --rate $$rate \
		--output benchmarks/results/$$(date +%Y-%m-%d)-hosts-training-4x2-$$rate-cpu.md; done

# The planner against measured runs: per-rank model state (bench_planner.py) and the predicted
# step time and peak RSS of the example configs (bench_step_time.py, ~12 min).
bench-planner: build ## the planner's memory and step-time predictions beside measured runs
	$(PY) benchmarks/bench_planner.py --output benchmarks/results/$$(date +%Y-%m-%d)-planner-cpu.md
	$(PY) benchmarks/bench_step_time.py --launches 3 \
		--output benchmarks/results/$$(date +%Y-%m-%d)-step-time-cpu.md
	$(PY) benchmarks/bench_planner_h200.py --output benchmarks/results/$$(date +%Y-%m-%d)-planner-h200.md
	$(PY) benchmarks/bench_step_time_hosts.py --launches 2 \
		--output benchmarks/results/$$(date +%Y-%m-%d)-step-time-hosts-2x1-cpu.md

bench-zeropp: build ## ZeRO-3 with and without DeepSpeed's ZeRO++ keys across 2 emulated hosts x 2 ranks
	$(PY) benchmarks/bench_zeropp.py --hosts 2 --ranks-per-host 2 --rate 1gbit \
		--output benchmarks/results/$$(date +%Y-%m-%d)-zeropp-2x2-1gbit-cpu.md

test-gpu: ## on a GPU machine (its own CUDA torch, PYTHON): build, every CUDA test, GPU benchmarks
	PY=$(PYTHON) bash scripts/test_gpu.sh

gpu-diagnose: ## on a GPU machine: why C++ exceptions would crash there (toolchain, runtimes, backtrace), ~4 min
	PY=$(PYTHON) bash scripts/gpu_diagnose.sh

# The trainer's packages a bare GPU image may lack, as wheels for test-gpu (Python 3.12, x86-64).
GPU_WHEELS := omegaconf==2.4.0 pydantic==2.14.3 pydantic_core==2.50.4 annotated-types==0.8.0 \
	typing-inspection==0.4.5
gpu-wheels: venv ## where PyPI is reachable: .whl/ with what test-gpu needs beyond a GPU image
	rm -rf .whl && $(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
		--implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		-d .whl $(GPU_WHEELS)

format: venv ## clang-format and ruff format, in place
	$(VENV)/bin/clang-format -i $$(git ls-files 'csrc/*.h' 'csrc/*.hpp' 'csrc/*.cc' 'csrc/*.cpp' 'csrc/*.cu' 'csrc/*.cuh' 'tests/cpp/*.h' 'tests/cpp/*.cc' 'tests/fuzz/*.cc' 'examples/cpp/*.cc' 'examples/cpp/*.cpp' 'examples/cpp/*.h')
	$(VENV)/bin/ruff format python tests benchmarks examples setup.py
	$(VENV)/bin/ruff check --fix python tests benchmarks examples setup.py scripts

lint: venv ## the same checks, changing nothing, and the house rules (scripts/check_structure.py)
	$(VENV)/bin/clang-format --dry-run -Werror $$(git ls-files 'csrc/*.h' 'csrc/*.hpp' 'csrc/*.cc' 'csrc/*.cpp' 'csrc/*.cu' 'csrc/*.cuh' 'tests/cpp/*.h' 'tests/cpp/*.cc' 'tests/fuzz/*.cc' 'examples/cpp/*.cc' 'examples/cpp/*.cpp' 'examples/cpp/*.h')
	$(VENV)/bin/ruff format --check python tests benchmarks examples setup.py
	$(VENV)/bin/ruff check python tests benchmarks examples setup.py scripts
	$(VENV)/bin/python scripts/check_structure.py

clean: ## build outputs in the clone (the caches under $(CACHE) stay)
	rm -rf build python/shardwise/*.so python/shardwise/lib python/shardwise/include \
		python/shardwise/share python/*.egg-info
