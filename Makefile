# Two commands do everything on a fresh machine: `make demo` (the main job) and `make test`.
# Each creates the virtual environment it needs. On a CPU machine torch==2.13.0 is the CPU build that
# pip takes from the local disk; it is installed first so nothing pulls a multi-GB CUDA build.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint clean

$(BIN)/specpilot: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

demo: $(BIN)/specpilot
	$(BIN)/specpilot bench --preset tiny --system ar --system stock

test: $(BIN)/specpilot
	$(BIN)/ruff check specpilot tests bench
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
