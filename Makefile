# Two commands do all set-up on a fresh machine with Python 3.11: `make demo`, `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
EXTRAS := test,progress,plot
STAMP = $(VENV)/.installed-$(EXTRAS)

.PHONY: demo test test-blas-kernel bench docs venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]"
	touch $@

demo: $(STAMP)
	$(BIN)/python examples/demo.py

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/python -m mypy
	$(BIN)/python -m pytest -q -n auto --maxprocesses=4 --dist loadgroup --durations=20 tests

# The comparisons with scipy's own runs under another OpenBLAS kernel than the machine's
# (CI runs it after `make test`): a test must hold whatever BLAS kernel scipy runs on.
test-blas-kernel: $(STAMP)
	OPENBLAS_CORETYPE=Haswell OPENBLAS_L2_SIZE=512 $(BIN)/python -m pytest -q -n auto \
		--maxprocesses=4 tests/backends/scipy/test_scipy_backend.py \
		tests/backends/constrained/test_interior_point.py::test_agrees_with_scipy_slsqp_and_the_kkt_multipliers \
		"tests/docs/test_docs.py::test_code_blocks_run[guides/constraints.md]"

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

bench:
	$(MAKE) venv EXTRAS=test,progress,plot,bench
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache
