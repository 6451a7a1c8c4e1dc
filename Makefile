# sbench developer entry points. `make demo` and `make test` do all their own set-up.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-fast lint docs browser trainer-envs cluster cluster-stop pg pg-stop bench gpu-wheels gpu-check clean

$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	# The CPU build of torch first: a looser requirement would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	# DeepSpeed (distributed_backend DEEPSPEED) builds from source and imports torch while it does.
	$(BIN)/pip install -q --no-build-isolation 'deepspeed>=0.16'
	touch $(STAMP)

setup: $(STAMP)

## demo: a LoRA sweep on the tiny model with the local executor (CPU), collected into DuckDB, results printed
demo: setup
	$(BIN)/sbench model tiny -o results/models/tiny --if-missing
	$(BIN)/sbench submit sweeps/demo-cpu.yaml --executor local --wait
	$(BIN)/sbench collect
	$(BIN)/sbench query "select model_name, number_gpus, batch_size, distributed_backend, round(train_runtime, 2) as runtime_s, round(dataset_tokens_per_second, 1) as dataset_tok_s, round(train_tokens_per_gpu_per_second, 1) as tok_s_per_gpu, round(cpu_compute_utilization, 1) as cpu_pct, is_valid from measurements where campaign = 'demo-cpu' order by number_gpus, batch_size"

## test: the house's shape (layers, no cycles, lint, types), system packages, the fms-hf-tuning environment, the
## real test SLURM cluster and the test Postgres (the shared store's catalog, tests/pg/pg.sh), then the whole test suite on $(TEST_WORKERS) xdist workers (tests/schedule.py: the users
## of an expensive module fixture together, costliest first, at most two groups on the test cluster at a time, and
## the tests marked alone with the cluster to themselves); a few tests that failed there run once more, one at a
## time (tests/run_suite.sh: a test that fails again fails the run; one that passes alone is named FLAKY)
TEST_WORKERS ?= 4
test: setup lint browser trainer-envs
	bash tests/cluster/cluster.sh start
	bash tests/pg/pg.sh start
	BIN=$(BIN) TEST_WORKERS=$(TEST_WORKERS) bash tests/run_suite.sh

## lint: import-linter's contracts (pyproject.toml: layers, the runner's limits, no cycles), ruff and mypy
lint: setup
	$(BIN)/lint-imports
	$(BIN)/ruff check harness tests bench
	$(BIN)/mypy

## docs: docs/cli.md, the command-line reference, written again from the command tree (harness/cli/reference.py);
## tests/test_docs.py fails until it matches
docs: setup
	$(BIN)/python -m harness.cli.reference > docs/cli.md.tmp && mv docs/cli.md.tmp docs/cli.md

## trainer-envs: the fms-hf-tuning release the tests run, in its own environment (built once; cached in
## ~/.cache/sbench/envs or $$SBENCH_ENVS_DIR, so later runs find it ready)
trainer-envs: setup
	@t0=$$(date +%s); $(BIN)/sbench env build fms-hf-tuning==3.2.2 --extras fms-accel; \
	echo "trainer environment ready after $$(( $$(date +%s) - t0 )) s"

## browser: headless Chromium (Debian package) for the report's rendering test
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || echo "note: chromium not installed (needs root); the report rendering test will be skipped"; }

## test-fast: everything that needs neither the SLURM cluster, nor training, nor more than a few seconds
test-fast: setup
	SBENCH_SKIP_SLURM=1 $(BIN)/pytest -q -n 2 --dist loadgroup -m "not slurm and not train and not slow"

cluster:
	bash tests/cluster/cluster.sh start

cluster-stop:
	bash tests/cluster/cluster.sh stop

## pg: the test Postgres that holds shared stores' catalogs (127.0.0.1:55432; `bash tests/pg/pg.sh env` prints
## the client settings to source)
pg:
	bash tests/pg/pg.sh start

pg-stop:
	bash tests/pg/pg.sh stop

bench: setup browser
	$(BIN)/python bench/overhead.py
	$(BIN)/python bench/collect.py
	$(BIN)/python bench/startup.py
	$(BIN)/python bench/submit.py
	$(BIN)/python bench/scale.py
	$(BIN)/python bench/trainers.py
	$(BIN)/python bench/prepare_check.py
	$(BIN)/python bench/report_page.py

## gpu-wheels: what bench/gpu_check.sh installs on a GPU machine without network: the wheels of sbench's
## dependencies that machine lacks (CPython 3.12, manylinux x86_64; never torch) in .wheels/, checked, with the
## size it and the tree travel at (docs/gpu-check.md)
gpu-wheels: setup
	$(BIN)/python bench/gpu_wheels.py download --dest .wheels

## gpu-check: sbench end to end on this machine's NVIDIA GPU, each GPU measurement checked, results in
## OUT (default results/gpu-check); REHEARSE=1: the same on the CPU with the tiny model (docs/gpu-check.md)
gpu-check:
	bash bench/gpu_check.sh $(if $(REHEARSE),--rehearse) "$(or $(OUT),results/gpu-check)"

clean:
	rm -rf results/runs results/results.duckdb results/datasets results/models
