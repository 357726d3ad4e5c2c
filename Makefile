# Two commands on a fresh machine: `make demo` and `make test`.
PY := $(shell scripts/find-python)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint test-sqlite test-pg test-pg-tiers test-pg-rest test-fast test-django52 simulate admin bench docs clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,docs,umt]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python manage.py demo

admin: $(STAMP)
	$(BIN)/python manage.py serveadmin

# The test suite: every test on PostgreSQL and, at the same time, on SQLite those whose
# behaviour can depend on the database (real worker processes included; tests marked one_db do
# not depend on the dialect and run on the PostgreSQL pass only, ONE_DB_TESTS_ON_PG=1; tests
# that need PostgreSQL itself -- NOTIFY latency, pg_terminate_backend, a throwaway cluster --
# are marked postgres_only and skip there with their reason; the rule: tests/conftest.py).
# The passes wait on worker processes, sleeps and servers more than they compute, so they run
# side by side (scripts/at-once), the PostgreSQL pass in its two parts (test-pg-tiers,
# test-pg-rest): each writes a log of its own, printed whole when it ends; make test fails if
# any does. Without a reachable PostgreSQL at PG_URL,
# the SQLite pass alone, every test in it, saying what that leaves out.
PG_URL ?= postgres://postgres@127.0.0.1:5432/umt
SQLITE_URL ?= sqlite:///$(CURDIR)/db.sqlite3
SQLITE_ONLY_NOTE := PostgreSQL is not reachable at $(PG_URL): running the suite on SQLite alone. \
This leaves out the PostgreSQL pass and every test that needs PostgreSQL itself (postgres_only: \
LISTEN/NOTIFY, pg_terminate_backend, group commit; tests/faults and the PgBouncer test on a \
throwaway cluster; the fresh project on PostgreSQL); they are reported as skipped.
test: $(STAMP)
	DATABASE_URL=$(SQLITE_URL) $(BIN)/python manage.py check
	DATABASE_URL=$(SQLITE_URL) $(BIN)/python manage.py makemigrations --check --dry-run --noinput
	@if $(BIN)/python scripts/pg-reachable '$(PG_URL)'; then \
		scripts/at-once \
			postgresql-tiers '$(MAKE) --no-print-directory test-pg-tiers' \
			postgresql-rest '$(MAKE) --no-print-directory test-pg-rest' \
			sqlite '$(MAKE) --no-print-directory test-sqlite ONE_DB_TESTS_ON_PG=1' \
			django52 '$(MAKE) --no-print-directory test-django52'; \
	elif [ -n "$$CI" ]; then \
		echo 'CI: PostgreSQL is not reachable at $(PG_URL); CI runs every test, so this fails' >&2; \
		exit 1; \
	else \
		echo '$(SQLITE_ONLY_NOTE)'; \
		$(MAKE) --no-print-directory test-sqlite test-django52; \
	fi

test-pg: $(STAMP)
	DATABASE_URL=$(PG_URL) $(BIN)/python -m pytest $(PYTEST_ARGS)

# make test's PostgreSQL pass, in two parts run at once: the tiers that bring servers of their
# own or build things (fault clusters, PgBouncer, qBittorrent, the simulation, the fresh
# project, the browser), on a test database of their own (TEST_DATABASE_SUFFIX,
# tests/settings.py), and every other test. The same list picks the first part and leaves it
# out of the second, so together they are test-pg's tests, each once.
PG_OWN_SERVER_TIERS := tests/faults tests/qbittorrent tests/simulation tests/fresh tests/browser \
	tests/engine/db/test_pgbouncer.py
test-pg-tiers: $(STAMP)
	DATABASE_URL=$(PG_URL) TEST_DATABASE_SUFFIX=tiers $(BIN)/python -m pytest \
		$(PG_OWN_SERVER_TIERS) $(PYTEST_ARGS)

test-pg-rest: $(STAMP)
	DATABASE_URL=$(PG_URL) $(BIN)/python -m pytest \
		$(PG_OWN_SERVER_TIERS:%=--ignore=%) $(PYTEST_ARGS)

test-sqlite: $(STAMP)
	DATABASE_URL=$(SQLITE_URL) ONE_DB_TESTS_ON_PG=$(ONE_DB_TESTS_ON_PG) $(BIN)/python -m pytest $(PYTEST_ARGS)

# The in-process tiers alone, on one database (SQLite unless DATABASE_URL says otherwise), for
# the edit-test loop: no worker processes (tests/process, tests marked process), no fault,
# browser, qBittorrent, fresh-project or simulation tier, nothing marked slow. Not a substitute
# for `make test`, which runs every test, on both databases unless it is marked one_db.
FAST_TIERS_LEFT_OUT := process faults browser qbittorrent fresh simulation
test-fast: $(STAMP)
	DATABASE_URL=$(or $(DATABASE_URL),$(SQLITE_URL)) $(BIN)/python -m pytest \
		-m 'not slow and not process' $(FAST_TIERS_LEFT_OUT:%=--ignore=tests/%) $(PYTEST_ARGS)

# Django 5.2 LTS, the oldest Django the engine supports (pyproject: django>=5.2,<6.2): the
# fast tier above in a second virtualenv that holds Django 5.2, built once (its stamp follows
# pyproject.toml), on PostgreSQL when it is reachable, else SQLite. `make test` runs it beside its
# two passes on the newest Django; the django.tasks backend's tests are left out (6.0+), and so,
# to keep this pass near three minutes, are the PgBouncer tests (a throwaway pooler: two
# minutes of the pass, about the pooler rather than Django) and the check of make test's passes.
DJANGO52_LEFT_OUT := engine/db/test_pgbouncer.py test_suite_databases.py
VENV52 := .venv-django52
STAMP52 := $(VENV52)/.installed
$(STAMP52): pyproject.toml
	$(PY) -m venv $(VENV52)
	$(VENV52)/bin/pip install --quiet --upgrade pip
	$(VENV52)/bin/pip install --quiet -e '.[dev,umt]' 'django>=5.2,<5.3'
	touch $(STAMP52)

test-django52: $(STAMP52)
	@if $(VENV52)/bin/python scripts/pg-reachable '$(PG_URL)'; then url='$(PG_URL)'; \
	else url='$(SQLITE_URL)'; fi; \
	DATABASE_URL=$$url TEST_DATABASE_SUFFIX=django52 $(VENV52)/bin/python -m pytest \
		-m 'not slow and not process' $(FAST_TIERS_LEFT_OUT:%=--ignore=tests/%) \
		$(DJANGO52_LEFT_OUT:%=--ignore=tests/%) $(PYTEST_ARGS)

# The engine simulation, long: SIM_EXAMPLES examples (default 20,000) on each database; failing
# examples are kept in /tmp/umt-sim-examples and replayed first next time. `make test` runs a
# bounded budget of the same simulation (HYPOTHESIS_PROFILE=ci, 150 examples).
simulate: $(STAMP)
	HYPOTHESIS_PROFILE=long DATABASE_URL=$(PG_URL) $(BIN)/python -m pytest tests/simulation -s $(PYTEST_ARGS)
	HYPOTHESIS_PROFILE=long DATABASE_URL=$(SQLITE_URL) $(BIN)/python -m pytest tests/simulation -s $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy .
	$(BIN)/lint-imports

# Ours vs PgQueuer, Procrastinate, DBOS and django-tasks-db on a throwaway cluster (peers in
# bench/.venv-peers): about 20 min on the shared 2-core machine, peers install included; writes
# bench/results.md, results.png and results.json and README.md's benchmark sentence.
# BASELINE=<git ref>: also ours at that commit, alternating, with an "ours ÷ baseline" table
# (about 25 min: our rows twice, the drains outside the headline once).
# QUICK=1: 2,000 jobs, one repetition, into bench/out/quick (checks the harness, not a result).
bench: $(STAMP)
	$(BIN)/python bench/run_all.py $(if $(BASELINE),--baseline $(BASELINE)) $(if $(QUICK),--quick)

# The documentation site (MkDocs, Material theme); --strict: a broken link or a page missing
# from the nav fails the build (not --quiet: it hides the warnings strict mode counts). Output
# in site/.
docs: $(STAMP)
	scripts/fetch-mermaid
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) $(VENV52) db.sqlite3 site
