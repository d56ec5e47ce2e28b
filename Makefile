# changelake: `make demo` runs the whole flow on one machine; `make test` runs the test suite.
# Both install what they need on first use (Python deps, Delta jars, a local PostgreSQL).
SHELL := /bin/bash
# The interpreter the venv is made from: Debian's python3.11 when it has venv (built with PGO and LTO;
# ingest's decode loop, one core of Python, takes 10-15 % less CPU than under pyenv's plain build of
# 3.11.7: BENCHMARKS.md, P1), else python3. An existing .venv is kept: delete it to switch.
PYTHON ?= $(shell /usr/bin/python3.11 -c 'import venv, ensurepip' >/dev/null 2>&1 && echo /usr/bin/python3.11 || echo python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat requirements.txt examples/dagster/requirements.txt pyproject.toml | sha1sum | cut -c1-12)
# The compiled pgoutput row decoder (native/, Rust + PyO3, built by maturin): rebuilt when its
# sources change. cargo comes with the machine (rustup); crates from crates.io.
NATIVE_STAMP := $(VENV)/.native-$(shell cat native/Cargo.toml native/Cargo.lock native/pyproject.toml native/src/*.rs | sha1sum | cut -c1-12)
export CHANGELAKE_WAREHOUSE ?= $(CURDIR)/warehouse
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
# dbt reads profiles.yml from the project directory
export DBT_PROFILES_DIR ?= $(CURDIR)

.PHONY: setup pg demo test test-pg-matrix test-fast test-unit test-integration test-cluster lint bench clean pg-stop \
	cluster-up cluster-down cluster-status engine-up engine-down

$(STAMP): requirements.txt examples/dagster/requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "setup: installing pinned Python dependencies into $(VENV) (first run builds pyspark, ~2 min)"
	@$(PY) -m pip install -q --upgrade pip wheel
	@# The Dagster example (examples/dagster/) resolved with the rest: dbt-core bounds its protobuf
	@$(PY) -m pip install -q -r requirements.txt -r examples/dagster/requirements.txt
	@$(PY) -m pip install -q --no-deps -e .
	@bash scripts/delta_jars.sh $(PY)
	@bash scripts/mongo_java_server.sh >/dev/null
	@rm -f $(VENV)/.installed-*; touch $@

$(NATIVE_STAMP): $(STAMP) native/Cargo.toml native/Cargo.lock native/pyproject.toml $(wildcard native/src/*.rs)
	@echo "setup: building the compiled pgoutput decoder (native/, ~1 min the first time)"
	@$(PY) -m pip install -q ./native
	@rm -f $(VENV)/.native-*; touch $@

setup: $(STAMP) $(NATIVE_STAMP)
	@bash scripts/delta_jars.sh $(PY)
	@bash scripts/mongo_java_server.sh >/dev/null
	@# PostgreSQL 13, 14, 16, 17, 18 for the version matrix (tests/integration/test_pg_versions.py), ~20 s once
	@bash scripts/pg_versions.sh install
	@# The driver JVM's class archive (scripts/driver_archive.py), ~40 s when missing or stale. Optional: JVMs
	@# start without it, ~8 s slower, so a failure to build it is reported and does not stop setup.
	@$(PY) scripts/driver_archive.py || echo "setup: driver class archive not built (optional; see the error above)" >&2

# The source DSN: CHANGELAKE_PG_DSN if you give one, else the project-owned cluster (started here).
pg:
	@if [ -z "$$CHANGELAKE_PG_DSN" ]; then bash scripts/pg.sh start >/dev/null; fi

demo: setup pg
	@bash scripts/demo.sh

test: setup pg
	@bash scripts/test.sh

# The PostgreSQL-facing integration tests on 13 (its refusal), 14, 16, 17 and 18, each on a cluster of its own
# (scripts/test_pg_matrix.sh; `make test` runs 14 and 18; on 13 the refusal). MAJORS="16 17" picks some.
test-pg-matrix: setup
	@bash scripts/test_pg_matrix.sh $(MAJORS)

test-unit: setup
	@$(PY) -m pytest tests/unit -q

# The edit loop: Python lint, types and the unit tests (no servers, no Spark), well under 2 minutes.
# `make lint` adds sqlfluff (it starts Spark for the dbt templater); `make test` runs everything.
test-fast: setup
	@$(VENV)/bin/ruff check ingest tests bench demo
	@$(VENV)/bin/mypy
	@$(PY) -m pytest tests/unit -q -p no:cacheprovider

# The cluster test alone (it starts and stops a cluster of its own on free ports).
test-cluster: setup pg
	@CHANGELAKE_PG_DSN="$${CHANGELAKE_PG_DSN:-$$(bash scripts/pg.sh dsn)}" $(PY) -m pytest tests/cluster -q -p no:cacheprovider

lint: setup
	@$(VENV)/bin/ruff check ingest tests bench demo
	@$(VENV)/bin/mypy
	@bash scripts/sqlfluff.sh

bench: setup pg
	@$(PY) bench/ingest_throughput.py
	@$(PY) bench/decode_ceiling.py

# A Spark standalone master + worker + Thrift server on loopback for `dbt build --target cluster`
# and config/cluster.yml (docs/cluster.md). Ports and sizes: see scripts/cluster.sh.
cluster-up: setup
	@bash scripts/cluster.sh up
	@bash scripts/cluster.sh env

cluster-down:
	@bash scripts/cluster.sh down

# The warm engine: a Spark Thrift server on local[2] for dbt's `engine` target (docs/dbt.md, "A
# warm engine"); ops/scheduled_job.sh uses it while it runs. Stopped by `make engine-down`.
engine-up: setup
	@CHANGELAKE_SPARK_LOCAL=1 bash scripts/cluster.sh up

engine-down:
	@bash scripts/cluster.sh down

cluster-status:
	@bash scripts/cluster.sh status

pg-stop:
	@bash scripts/pg.sh stop

clean:
	rm -rf warehouse target logs
