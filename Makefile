# Two commands on a fresh machine: `make demo` and `make test`.
PY := $(shell scripts/find-python)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint test-sqlite test-pg admin bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python manage.py demo

admin: $(STAMP)
	$(BIN)/python manage.py serveadmin

# The test suite: semantic tests on SQLite and PostgreSQL, process tests on PostgreSQL.
test: $(STAMP)
	$(BIN)/python manage.py check
	$(BIN)/python manage.py makemigrations --check --dry-run --noinput
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy .

bench: $(STAMP)
	$(BIN)/python bench/drain.py

clean:
	rm -rf $(VENV) db.sqlite3
