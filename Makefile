# One entry point for users, CI and developers. `make test` works on a fresh Debian machine:
# it installs the Debian packages the tests need (prometheus, alertmanager, node-exporter)
# when missing, builds .venv pinned by constraints.txt and runs the whole suite.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
APT_PKGS := prometheus prometheus-alertmanager prometheus-node-exporter chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: routers test test-fast test-live planner-validation test-fleet test-deploy image container-debs fleet fleet-down fleet-debs venv debs demo run bench mutation lint fmt golden generate docs dashboards dashboards-check alerts-test stack stack-down clean

venv: $(STAMP)
$(STAMP): pyproject.toml constraints.txt
	@$(PY) -c "import ensurepip" 2>/dev/null || { \
	  echo "installing python3-venv (Debian ships ensurepip, which venv needs, apart from python3)"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends python3-venv; }
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# Installs only what is missing, so a machine that has them makes no network call.
debs:
	@missing=""; \
	command -v promtool >/dev/null 2>&1 || missing="$$missing prometheus"; \
	command -v prometheus-alertmanager >/dev/null 2>&1 || command -v alertmanager >/dev/null 2>&1 || missing="$$missing prometheus-alertmanager"; \
	command -v prometheus-node-exporter >/dev/null 2>&1 || missing="$$missing prometheus-node-exporter"; \
	[ -x /usr/bin/chromium ] || missing="$$missing chromium"; \
	command -v ip >/dev/null 2>&1 || missing="$$missing iproute2"; \
	command -v unshare >/dev/null 2>&1 || missing="$$missing util-linux"; \
	ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1 || missing="$$missing libfaketime"; \
	command -v kubectl >/dev/null 2>&1 || missing="$$missing kubectl"; \
	command -v systemd-analyze >/dev/null 2>&1 || missing="$$missing systemd"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	  if [ -d /run/systemd/system ]; then \
	    for svc in $$missing; do case $$svc in prometheus*) \
	      echo "stopping the $$svc service the package started (the tests run their own, on free ports)"; \
	      $(SUDO) systemctl disable --now $$svc >/dev/null 2>&1 || true;; esac; done; \
	  fi; \
	fi

test: venv debs routers
	$(BIN)/ruff check exporter tests bench dashboards alerts
	$(BIN)/python -m pytest
# vllm-router and sglang-router (Rust binaries in wheels, about 30 s) into the engine cache, keyed by version
# (tests/routers.py): tests/test_routers_live.py runs them in front of twins.
routers: venv
	$(BIN)/python -m tests.routers install

test-fast: venv
	$(BIN)/python -m pytest -m "not slow"

# Real engines (vLLM CPU, llama.cpp) installed into a cache outside the checkout, keyed by version
# ($$LLM_EXPORTER_ENGINE_CACHE, default ~/.cache/llm-exporter/engines): the first run installs them
# (about 10 min on 2 cores: the llama-server build 7.6 min, the vLLM venv 2 min); later runs start at
# once. tests/live/README.md says what runs.
test-live: venv
	$(BIN)/python -m tests.live.engines install
	$(BIN)/python -m tests.routers install
	LLM_EXPORTER_LIVE=1 $(BIN)/python -m pytest tests/live -p no:cacheprovider -v

# The planner's full validation on real engines, outside CI (15.8 min on 2 loaded cores): every configuration
# of tests/live/test_planner_live.py measured in interleaved rounds of the long steps, each beside its noise
# floor. The table is printed and written to $LLM_EXPORTER_PLAN_TABLE (default .plan-validation.md);
# docs/planner.md "Measured accuracy on real engines" carries one. make test-live runs the short profile.
planner-validation: venv
	$(BIN)/python -m tests.live.engines install
	LLM_EXPORTER_LIVE=1 LLM_EXPORTER_PLAN_PROFILE=full $(BIN)/python -m pytest tests/live/test_planner_live.py -p no:cacheprovider -v -s

# The fleet tier (tests/fleet, about 5 min on 2 cores): deploy/fleet.py's simulated fleet with two
# Prometheus servers, the central store (VictoriaMetrics + vmalert) and Alertmanager; docs/deploy.md.
test-fleet: venv debs fleet-debs
	LLM_EXPORTER_FLEET=1 $(BIN)/python -m pytest tests/fleet -p no:cacheprovider -v

# Debian's victoria-metrics (victoria-metrics, vmagent, vmalert) when missing; its service stopped, as
# `debs` does for prometheus: the fleet runs its own store on its own ports.
fleet-debs:
	@if ! command -v victoria-metrics >/dev/null 2>&1 || ! command -v vmalert >/dev/null 2>&1; then \
	  echo "installing Debian package: victoria-metrics"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends victoria-metrics; \
	  if [ -d /run/systemd/system ]; then \
	    echo "stopping the victoria-metrics service the package started (the fleet runs its own, on free ports)"; \
	    $(SUDO) systemctl disable --now victoria-metrics >/dev/null 2>&1 || true; \
	  fi; \
	fi

# The image (Dockerfile) with podman, or docker where podman is absent: on python:3.11-slim where a
# registry answers, else on a Debian base made here with debootstrap (deploy/container.py; about
# 1 min the first time, seconds after). IMAGE_TAG names it (default llm-exporter:local).
IMAGE_TAG ?= llm-exporter:local
image: venv container-debs
	$(BIN)/python deploy/container.py build --tag $(IMAGE_TAG)

# The deploy tier (tests/deploy, about 6 min on 2 cores): the image hardened, the sidecar pod from
# deploy/kubernetes under `podman kube play` scraped by a real Prometheus through the PodMonitor and
# paging through Alertmanager, the compose demo services as containers. docs/deploy.md.
test-deploy: venv debs container-debs image
	LLM_EXPORTER_DEPLOY=1 LLM_EXPORTER_IMAGE=$(IMAGE_TAG) $(BIN)/python -m pytest tests/deploy -p no:cacheprovider -v

# Debian's podman and what it needs to build and run pods here (buildah, runc, catatonit for the pod's
# pause image, the CNI plugins and dnsname for service names, debootstrap for a local base, kubectl
# for kustomize) when podman or one of them is missing. docker users need none of it for `make image`.
CONTAINER_PKGS := podman buildah runc catatonit containernetworking-plugins golang-github-containernetworking-plugin-dnsname iptables debootstrap kubectl
container-debs:
	@if [ -n "$$LLM_EXPORTER_CONTAINER_ENGINE" ] && [ "$$LLM_EXPORTER_CONTAINER_ENGINE" != podman ]; then exit 0; fi; \
	missing=""; for pkg in $(CONTAINER_PKGS); do dpkg -s $$pkg >/dev/null 2>&1 || missing="$$missing $$pkg"; done; \
	if [ -n "$$missing" ] && ! { command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1 && [ -z "$$LLM_EXPORTER_CONTAINER_ENGINE" ]; }; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	fi

# A simulated fleet on loopback (FLEET_REPLICAS, FLEET_DIE_AFTER, FLEET_INTERVAL, FLEET_BASE_PORT in the
# environment; `python deploy/fleet.py up --help`); pids, logs and data under .fleet/. It prints the URLs.
fleet: venv debs fleet-debs
	$(BIN)/python deploy/fleet.py up

fleet-down:
	$(BIN)/python deploy/fleet.py down

demo: venv
	$(BIN)/llm-exporter demo

bench: venv debs fleet-debs
	$(BIN)/python -m bench

# Mutation testing (docs/testing.md "Mutation testing"), outside CI: mutmut over the modules whose numbers
# users act on, each against the fast tests that cover it, in scratch copies (never a mutants/ folder here).
# MODULES="quantiles slo" to run some; about 5-30 min a module on 2 cores.
mutation: venv
	$(BIN)/pip install -q -c constraints.txt mutmut==3.8.1
	nice -n 19 $(BIN)/python -m tests.mutation $(MODULES)

# ruff, then mypy over exporter/ (its settings: [tool.mypy] in pyproject.toml; docs/developing.md).
lint: venv
	$(BIN)/ruff check exporter tests bench dashboards alerts
	$(BIN)/mypy exporter

fmt: venv
	$(BIN)/ruff check --fix exporter tests bench dashboards

golden: venv
	$(BIN)/python -m pytest --update-golden

# Every generated file: Config's fields and the docs from the settings table, docs from the catalogue,
# engine tables and CLI; rules; dashboards and the Kubernetes objects built from them. The test suite
# fails when any of them is stale.
generate: venv
	$(BIN)/python deploy/config_class.py
	$(BIN)/python alerts/generate.py
	$(BIN)/python dashboards/generate.py
	$(BIN)/python deploy/kubernetes/generate.py
	$(MAKE) docs

docs: venv
	$(BIN)/python -m exporter.catalog
	$(BIN)/python -m exporter.sources.engines.coverage > docs/engines.md
	$(BIN)/python -m exporter.sources.routers.coverage > docs/routers.md
	$(BIN)/python deploy/configuration_docs.py

# Grafana dashboards: dashboards/*.py -> dashboards/*.json (docs/dashboards.md). The check fails on
# stale or stray JSON and on queries of metrics neither the catalogue nor alerts/rules define.
dashboards: venv
	$(BIN)/python dashboards/generate.py
	$(BIN)/python deploy/kubernetes/generate.py

dashboards-check: venv
	$(BIN)/python dashboards/generate.py --check

alerts-test: venv debs
	$(BIN)/python alerts/generate.py --check
	promtool test rules alerts/tests/*.yaml
	amtool check-config deploy/alertmanager/alertmanager.yml

# docker-compose.yml's demo profile without Docker: twin, exporter, Alertmanager and Prometheus on
# 127.0.0.1 from the venv and the Debian packages; pids, logs and data under .stack/ (deploy/stack.py).
# Ports: EXPORTER_PORT, PROMETHEUS_PORT, ALERTMANAGER_PORT, TWIN_PORT in the environment or .env.
stack: venv debs
	$(BIN)/python deploy/stack.py up

stack-down:
	$(BIN)/python deploy/stack.py down

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
