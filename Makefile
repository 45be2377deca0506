# The two commands a new user types: `make demo` and `make test`.
# Both create .venv and install the project into it (editable, with dev tools) on first use.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-faults lint format fixtures lock clean

$(STAMP): pyproject.toml
	@echo "==> creating $(VENV) and installing bargein (first run only)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

# The policy scanner (checkov), pinned in pyproject.toml's `policy` extra, in a venv of its own:
# its dependency pins clash with the dev tools'.
CHECKOV_VENV := .tools/checkov
CHECKOV_STAMP := $(CHECKOV_VENV)/.installed

$(CHECKOV_STAMP): pyproject.toml
	@echo "==> installing the policy scanner into $(CHECKOV_VENV) (first run only)"
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install --quiet $$($(PYTHON) -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["policy"]))')
	@touch $(CHECKOV_STAMP)

## The main job: a whole conversation with a barge-in, printed as a live timeline.
demo: $(STAMP)
	$(BIN)/bargein demo

## Lint, type-check, then every test but the fault tests (integration tests need RabbitMQ and
## Redis; see README).
test: lint $(CHECKOV_STAMP)
	$(BIN)/pytest -m "not faults"

## The fault tests (tests/faults): the services on brokers of their own, killed, paused, restarted.
## They take minutes more than the rest, so they have a target of their own; CI runs both.
test-faults: $(STAMP)
	$(BIN)/pytest -m faults

lint: $(STAMP)
	$(BIN)/ruff check shared services tests scripts
	$(BIN)/ruff format --check shared services tests scripts
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

format: $(STAMP)
	$(BIN)/ruff check --fix shared services tests scripts
	$(BIN)/ruff format shared services tests scripts

## Regenerate the speech fixtures (needs espeak-ng and sox); the results are committed.
fixtures: $(STAMP)
	$(BIN)/python scripts/make_fixtures.py

## Pin what the container image installs (requirements.lock), after a change to pyproject.toml.
lock:
	rm -rf .lock-venv && python3 -m venv .lock-venv
	.lock-venv/bin/pip install --quiet '.[stt]'
	{ head -n 2 requirements.lock; .lock-venv/bin/pip freeze --exclude-editable | grep -v '^bargein'; } > requirements.lock.new
	mv requirements.lock.new requirements.lock && rm -rf .lock-venv

clean:
	rm -rf $(VENV) .tools .pytest_cache .mypy_cache .ruff_cache
