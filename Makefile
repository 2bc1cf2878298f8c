# Two set-up commands: `make demo` runs the ingestion DAG end to end on the sample PDFs with the local
# CPU OCR engine; `make test` runs the whole test suite. Both create the virtualenv themselves and
# install the Debian packages they need (tesseract-ocr; chromium for the browser test; postgresql and
# redis-server when no PostgreSQL / Redis answers on 127.0.0.1, for the deployment tests) with apt.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# Tiers (pytest markers) whose tests share one package-scoped deployment: `make test` runs each as a
# pytest process of its own, in order, beside the rest of the suite, and fails if one ran in more than
# one process or started its deployment twice (scripts/run-tests.sh). Another such tier (a marker, also
# listed in tests/conftest.py's ONE_PROCESS_TIERS) is added here.
SOLO_TIERS := deployment
# One-process tiers run in the foreground after the rest of the suite (still beside the solo tiers):
# the compose tier builds images and starts a whole stack, the vllm tier runs vLLM's CPU build (~3 GiB,
# both cores), which the rest would otherwise compete with on 2 cores. Also listed in ONE_PROCESS_TIERS.
LATER_TIERS := vllm compose
# pytest-xdist processes for the rest of the suite, beside the tiers' one process each: two processes
# in all on a 2-core machine.
TEST_WORKERS ?= 1
UV_VERSION := 0.13.9

.PHONY: demo test up up-cluster bench lint lock clean prerequisites system-packages

demo: prerequisites $(STAMP)
	@scripts/system-packages.sh tesseract-ocr
	$(BIN)/python scripts/demo.py

test: prerequisites $(STAMP)
	@scripts/system-packages.sh tesseract-ocr chromium docker.io mmdebstrap $$(scripts/service-packages.sh)
	@SOLO_TIERS="$(SOLO_TIERS)" LATER_TIERS="$(LATER_TIERS)" TEST_WORKERS=$(TEST_WORKERS) scripts/run-tests.sh $(PYTEST_ARGS)

up: prerequisites $(STAMP)
	@scripts/system-packages.sh tesseract-ocr
	$(BIN)/python scripts/up.py

# The multi-process Celery deployment the deployment tests run, on the local PostgreSQL and Redis, with
# Airflow's production heartbeat timings (UP_CLUSTER_ARGS=--test-timings: the test deployment's).
UP_CLUSTER_ARGS ?=
up-cluster: prerequisites $(STAMP)
	@scripts/system-packages.sh tesseract-ocr $$(scripts/service-packages.sh)
	$(BIN)/python scripts/up.py --cluster $(UP_CLUSTER_ARGS)

bench: prerequisites $(STAMP)
	$(BIN)/python bench/run_all.py

# The compose tier (tests/compose): builds docker/'s images from a local Debian base (no registry
# needed), runs the compose stack with host networking, one REST-triggered conversion and the UI in
# Chromium, then `docker compose down -v`. Installs docker.io and mmdebstrap with apt and starts dockerd
# when missing (as root); keeps the base image, the built images and the layer cache in Docker's store.
.PHONY: test-compose
test-compose: prerequisites $(STAMP)
	@scripts/system-packages.sh chromium docker.io mmdebstrap
	flock /tmp/olmocr-compose.lock $(BIN)/python -m pytest tests/compose -m compose -p no:xdist $(PYTEST_ARGS)

# docker/.env for docker/compose.yaml: a fresh secret for every change-me value of docker/.env.example,
# keeping the values already set (the stack's init refuses placeholders). Standard library only.
.PHONY: docker-env
docker-env:
	$(PYTHON) scripts/docker-env.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

prerequisites:
	@scripts/prerequisites.sh $(PYTHON)

# Installs come from the lock (constraints.txt): the same versions on every machine and in CI.
$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)
	@# Bytecode compiled at install: every Airflow subprocess would otherwise recompile its imports when
	@# PYTHONDONTWRITEBYTECODE is set (as on some CI machines).
	$(BIN)/uv pip install --quiet --compile-bytecode -p $(BIN)/python -e ".[airflow,deploy,s3,test]" \
		-c constraints.txt
	@# The test kit (olmocr_testkit/: the tests, bench/, scripts/, make up-cluster) is not in the wheel,
	@# so the editable install leaves it out too: the checkout on the virtualenv's path makes it
	@# importable from every process started with this virtualenv, whatever its working directory.
	$(BIN)/python -c 'import pathlib, sysconfig; pathlib.Path(sysconfig.get_path("purelib"), "olmocr-checkout.pth").write_text("$(CURDIR)\n")'
	@touch $(STAMP)

# Re-resolves pyproject.toml's ranges to the newest releases and rewrites the lock; review the diff, run
# make test, commit both.
lock: $(STAMP)
	@{ sed -n '1,3p' constraints.txt; $(BIN)/uv pip compile pyproject.toml --extra airflow --extra deploy \
		--extra s3 --extra test --extra cpu --python-version 3.11 --universal --no-header -q; } > constraints.txt.new
	@mv constraints.txt.new constraints.txt

clean:
	rm -rf $(VENV) .airflow .airflow-cluster demo-output test-output .pytest_cache
