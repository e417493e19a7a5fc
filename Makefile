# Two entry points on a fresh machine:  `make run`  and  `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-fast lint venv docs bench clean browser

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned: the project's own range must never pull a multi-GB CUDA build
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[torch,dev]'
	# byte-compile once: every later start of the CLI then skips compiling the sources
	$(BIN)/python -m compileall -q src $(VENV)/lib > /dev/null || true
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)  ## set up and audit this machine (findings exit 1 from torchdoctor, not from make)
	@$(BIN)/torchdoctor check; status=$$?; [ $$status -le 1 ] || exit $$status

test: $(STAMP) browser  ## set up and run the whole test suite (the long lab scenarios too)
	$(BIN)/python -m pytest
	$(BIN)/python -m pytest -m slow -q

# The watch report's browser test opens the HTML in headless Chromium. Installed from Debian when
# missing and we are root; never fails `make test` itself: without it that test fails (as root with
# apt) or skips (otherwise), saying why. apt-get update only when the install fails (stale lists).
APT_CHROMIUM := DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium

browser:  ## install Chromium for the report's browser test (Debian, root; quiet, idempotent)
	@command -v chromium > /dev/null 2>&1 || { \
	  if [ "$$(id -u)" != 0 ] || ! command -v apt-get > /dev/null 2>&1; then \
	    echo "make browser: chromium missing; not root or no apt-get: the browser test will skip" >&2; exit 0; fi; \
	  log=$$(mktemp); echo "make browser: installing chromium (apt-get) for the browser test..." >&2; \
	  { $(APT_CHROMIUM) || { apt-get update -q && $(APT_CHROMIUM); }; } > "$$log" 2>&1 \
	  || { tail -n 20 "$$log" >&2; echo "make browser: could not install chromium: the browser test will fail" >&2; }; \
	  rm -f "$$log"; }

test-fast: $(STAMP) browser  ## the default run only, without the long lab scenarios
	$(BIN)/python -m pytest

lint: $(STAMP)  ## mypy, ruff and ruff format --check, as CI runs them
	$(BIN)/mypy
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/ruff format --check src tests benchmarks scripts

docs: $(STAMP)  ## regenerate docs/codes.md and docs/families.md from the catalogue
	$(BIN)/torchdoctor codes --format markdown > docs/codes.md
	$(BIN)/python -m torchdoctor.report.families > docs/families.md

bench: $(STAMP)
	$(BIN)/python benchmarks/check_latency.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
