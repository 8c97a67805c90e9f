# Thin wrapper over CMake. `make test` and `make demo` install what they need first.
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
BUILD ?= build
DEMO_MODEL ?= models/tiny-random
DEMO_TEXT ?= Hello from drama.c. This is a tiny random model, so expect noise.

.PHONY: all deps build test test-fast test-asan test-fuzz demo bench clean

all: build

deps:
	./scripts/install-deps.sh

build:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	cmake --build $(BUILD) -j$(JOBS)

# Whole suite: release build (unit, golden, e2e, valgrind), then the unit tests under
# ASan+UBSan, then the libFuzzer targets for a bounded time each.
test: deps build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)
	$(MAKE) test-asan
	$(MAKE) test-fuzz

test-fast: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS) -LE valgrind

test-asan:
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DDRAMA_SANITIZE=ON >/dev/null
	cmake --build build-asan -j$(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		ctest --output-on-failure -j$(JOBS) -L 'unit|e2e'

test-fuzz:
	CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDRAMA_FUZZ=ON >/dev/null
	cmake --build build-fuzz -j$(JOBS)
	cd build-fuzz && ctest --output-on-failure -j$(JOBS) -L fuzz

# The demo needs only the CLI: build that target, not the tests and benchmarks.
demo: deps
	@echo "demo: building drama (log: $(BUILD)/demo-build.log)"
	@mkdir -p $(BUILD) && cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >$(BUILD)/demo-build.log 2>&1 || { cat $(BUILD)/demo-build.log; exit 1; }
	@cmake --build $(BUILD) -j$(JOBS) --target drama >>$(BUILD)/demo-build.log 2>&1 || { tail -40 $(BUILD)/demo-build.log; exit 1; }
	@test -f $(DEMO_MODEL)/config.json || ./$(BUILD)/drama make-model $(DEMO_MODEL) --shape tiny --seed 1
	@./$(BUILD)/drama inspect $(DEMO_MODEL) >$(BUILD)/demo-inspect.txt 2>&1 || { cat $(BUILD)/demo-inspect.txt; exit 1; }
	@echo "demo: $$(tail -1 $(BUILD)/demo-inspect.txt) (full report: $(BUILD)/demo-inspect.txt)"
	./$(BUILD)/drama synthesize --model $(DEMO_MODEL) --text "$(DEMO_TEXT)" --frames 40 --seed 7 -o demo.wav
	@echo "wrote demo.wav (random weights: expect noise; see README for real weights)"

bench: deps build
	./scripts/run-benches.sh $(BUILD)

clean:
	rm -rf $(BUILD) build-asan build-fuzz
