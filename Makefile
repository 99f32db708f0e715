# Two commands: `make reproduce` (quick presets of every experiment) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LAB_OVERRIDES := tools/jupyterlab/overrides.json

.PHONY: venv reproduce test test-fast lint clean-venv football export-tools

venv: $(STAMP)

# torch 2.13.0 (CPU, from local disk) first; then rlq[all,dev] constrained so nothing swaps torch for a CUDA build.
# JupyterLab's settings overrides (tools/jupyterlab/overrides.json): no news prompt over the figures, no update check.
$(STAMP): pyproject.toml constraints.txt setup.py $(wildcard rlq/*/*.c) $(LAB_OVERRIDES)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[all,dev]'
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (rlq)" >/dev/null
	mkdir -p $(VENV)/share/jupyter/lab/settings
	cp $(LAB_OVERRIDES) $(VENV)/share/jupyter/lab/settings/overrides.json
	touch $(STAMP)

# the report is built even when an experiment failed (it lists failed runs); the exit status is reproduce's
reproduce: $(STAMP)
	$(BIN)/rlq reproduce --preset quick; status=$$?; $(BIN)/rlq report; exit $$status

# Google Research Football (optional): Debian build packages, a gfootball wheel built once into
# ~/.cache/rlq (about 8 min), then installed from there (seconds). See tools/football.sh.
football: $(STAMP)
	bash tools/football.sh

# Cortex-M export (optional): arm-none-eabi-gcc, newlib and qemu-system-arm from Debian, for
# rlq.deploy.cortex_m and its tests. See tools/export_tools.sh.
export-tools:
	bash tools/export_tools.sh

test: $(STAMP)
	$(BIN)/python -m pytest -q

# the tests not marked slow (no notebook, rlq-command, Ray or browser runs): minutes, for the edit-test loop
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check rlq tests benchmarks notebooks
	$(BIN)/ruff format --check rlq tests benchmarks

clean-venv:
	rm -rf $(VENV)
