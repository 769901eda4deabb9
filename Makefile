# Two commands for a fresh machine; each does its own (idempotent) setup.
#   make demo   the CPU demo: async RL of a tiny model (ARGS="mode=sync" etc. to override)
#   make test   ruff, mypy + the whole test suite (unit, integration with real Redis/vLLM, e2e)
VENV ?= .venv
ARGS ?=
PYTEST_ARGS ?=
# two pytest workers, one test file each at a time (docs/reliability.md, "Fresh-machine CI");
# PYTEST_WORKERS=0 runs the suite in one process
PYTEST_WORKERS ?= 2

.PHONY: setup demo test test-faults-full lint format clean

setup:
	@bash scripts/setup.sh

demo: setup
	$(VENV)/bin/asyncrl run $(ARGS)

test: setup lint
	$(VENV)/bin/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The fault-injection tests at the full counts of docs/reliability.md (long: ~1.5 hours, of
# which the chaos run of tests/faults/chaos, 3 seeds on one host and across hosts, ~35 min).
test-faults-full: setup
	ASYNCRL_FAULTS_FULL=1 $(VENV)/bin/python -m pytest -m faults tests/faults $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy  # the files of pyproject.toml's [tool.mypy]

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf runs .pytest_cache .ruff_cache .mypy_cache
