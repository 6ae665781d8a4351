# convmem: `make serve` runs the server on ./data (`make serve PORT=9000` picks the port; CONVMEM_PORT
# works too), `make test` runs the whole suite.
# Dependencies install from requirements.lock (pinned, with hashes); `make lock` remakes it
# from pyproject.toml's version ranges after a dependency changes.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
LOCK   := requirements.lock
UV_VERSION := 0.13.9

.PHONY: serve test lint bench bench-quick clean lock check-lock

$(STAMP): pyproject.toml $(LOCK) .ci/lockfile.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PYTHON) .ci/lockfile.py check-lock
	$(BIN)/python -m pip install --quiet --require-hashes -r $(LOCK)
	$(BIN)/python -m pip install --quiet --no-deps --config-settings editable_mode=compat -e .
	touch $(STAMP)

check-lock:
	$(PYTHON) .ci/lockfile.py check-lock

serve: $(STAMP)
	$(BIN)/convmem serve --data-dir ./data --demo-site $(if $(PORT),--port $(PORT))

# The suite runs on two pytest-xdist workers, a test file per worker at a time (its module fixtures stay
# in one process); `pytest -q tests/...` alone runs serially.
test: check-lock $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=25

lint: $(STAMP)
	$(BIN)/ruff check .

lock:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	test -x $(BIN)/uv || $(BIN)/python -m pip install --quiet uv==$(UV_VERSION)
	$(BIN)/uv pip compile pyproject.toml --all-extras --generate-hashes --universal --python-version 3.11 \
		--no-header --quiet --output-file $(LOCK).compiled
	$(BIN)/python .ci/lockfile.py stamp-lock $(LOCK).compiled
	rm -f $(LOCK).compiled

bench: $(STAMP)
	$(BIN)/python -m bench --json bench-results.json

bench-quick: $(STAMP)
	$(BIN)/python -m bench --quick

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .benchmarks
