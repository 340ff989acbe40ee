# make demo   set up .venv and run the default cell (tiny Mistral on CPU)
# make test   set up .venv and run the test suite (CPU; GPU tests skip without CUDA)
# TORCH=...   the torch requirement to install first: the default is the CPU build that this
#             workplace keeps on disk; on a GPU machine use e.g. `make demo TORCH=torch`.
TORCH ?= torch==2.13.0
PY := .venv/bin/python

.venv/.installed: pyproject.toml
	python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

demo: .venv/.installed
	$(PY) train.py

test: .venv/.installed
	$(PY) -m pytest -n 2 --dist worksteal  # worksteal: the long tests do not queue behind one worker

.PHONY: demo test
