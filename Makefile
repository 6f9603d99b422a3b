# Thin wrapper over CMake: `make`, `make check`, `make bench`.
JOBS ?= $(shell nproc)
BUILD ?= build
CMAKE ?= cmake
BENCH_ARGS ?=

.PHONY: all deps check check-fast check-asan check-tsan check-python check-build-types \
  check-aarch64 bench fuzz format clean

all: deps $(BUILD)/Makefile
	$(CMAKE) --build $(BUILD) -j $(JOBS)

# Installs missing build/test packages (apt-get); a no-op when everything is there.
deps:
	@scripts/install-deps

$(BUILD)/Makefile:
	$(CMAKE) -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo

build-asan/Makefile:
	$(CMAKE) -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DFERRY_SANITIZE=address,undefined

build-tsan/Makefile:
	$(CMAKE) -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DFERRY_SANITIZE=thread

# Every test: the C suite in the normal build and in the ASan+UBSan and TSan builds, every
# build type with gcc and clang, the aarch64 cross build and its tests under qemu-user, then
# the Python package's tests (pip installs numpy, pytest and scikit-build-core).
check: check-fast check-asan check-tsan check-build-types check-aarch64 check-python

check-python: all
	python/run-tests

check-fast: all
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# intercept_tls_get_addr=0: the leak check's scan of dynamic TLS (the TLS of libraries loaded
# by dlopen, such as UCX's transports) guesses the glibc layout and sometimes crashes on it
# ("Tracer caught signal 11" then "LeakSanitizer has encountered a fatal error", in any
# process that loaded UCX). Without it the check skips that TLS: a pointer kept only there
# would be reported as a leak, never hidden. A helper process that aborts fails its test
# (tests/procs.c), so that its report is never lost.
check-asan: deps build-asan/Makefile
	$(CMAKE) --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:intercept_tls_get_addr=0 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:abort_on_error=1 \
	  ctest --output-on-failure -j $(JOBS)

check-tsan: deps build-tsan/Makefile
	$(CMAKE) --build build-tsan -j $(JOBS)
	cd build-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	  ctest --output-on-failure -j $(JOBS)

# Every build type a user may pick builds without a warning (-Werror, and none from the
# linker either), with gcc and with clang: build-types/<compiler>-<type>, built (library,
# CLI, tests), not run.
BUILD_TYPES ?= Debug Release RelWithDebInfo MinSizeRel
BUILD_TYPE_COMPILERS ?= gcc clang
check-build-types: deps
	@set -e; for cc in $(BUILD_TYPE_COMPILERS); do for type in $(BUILD_TYPES); do \
	  dir=build-types/$$cc-$$type; echo "check-build-types: $$dir"; \
	  $(CMAKE) -S . -B $$dir -DCMAKE_C_COMPILER=$$cc -DCMAKE_BUILD_TYPE=$$type >/dev/null; \
	  if ! $(CMAKE) --build $$dir -j $(JOBS) >$$dir/build.log 2>&1 || \
	     grep -q 'warning:' $$dir/build.log; then \
	    grep -E -B2 -A6 'warning:|error:' $$dir/build.log || tail -40 $$dir/build.log; \
	    echo "check-build-types: $$dir failed (log: $$dir/build.log)" >&2; exit 1; \
	  fi; \
	done; done

# aarch64 as a checked target (scripts/check-aarch64): a cross build with Debian's
# gcc-aarch64-linux-gnu under -Werror, then the C tests under qemu-aarch64 where qemu-user is
# installed (skipped with a message where it is not).
check-aarch64: deps
	JOBS=$(JOBS) scripts/check-aarch64

# The main job: producer and consumers through ferry against the same-run floor, then the
# allocator against a list scan.
bench: all
	./$(BUILD)/ferry bench --backend host --consumers 4 --items 2000 --item-size 256KiB-4MiB $(BENCH_ARGS)
	./$(BUILD)/ferry-alloc-bench

# libFuzzer over the descriptor decoder and the remote wire format's decoders (clang), each
# for FUZZ_SECONDS: make fuzz FUZZ_SECONDS=60
FUZZ_SECONDS ?= 30
fuzz:
	@scripts/install-deps --fuzz
	$(CMAKE) -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Debug \
	  -DFERRY_SANITIZE=address,undefined -DFERRY_FUZZ=ON
	$(CMAKE) --build build-fuzz -j $(JOBS) --target fuzz_descriptor fuzz_remote
	@set -e; for t in descriptor remote; do mkdir -p build-fuzz/corpus-$$t; \
	  ./build-fuzz/tests/fuzz_$$t build-fuzz/corpus-$$t tests/corpus/$$t \
	    -max_total_time=$(FUZZ_SECONDS); done

format:
	clang-format -i include/*.h src/*/*.[ch] tools/*/*.[ch] tests/*.[ch] bench/*.c examples/c/*.c

clean:
	rm -rf $(BUILD) build-asan build-tsan build-fuzz build-types build-aarch64 python/build
