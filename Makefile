# rocmft — developer and user entry points. `make help` lists them.
# Python work runs in a local virtual environment (.venv) with the pinned stack (constraints.txt); images are
# built per GPU architecture from docker/arch/<ARCH>.env, the one place each architecture's settings live.

SHELL        := /bin/bash
PYTHON       ?= python3
VENV         ?= .venv
BIN          := $(VENV)/bin
SHARED       ?= $(abspath ../shared)
PYTEST_ARGS  ?=

# The architecture: ARCH=... on the command line, else ARCH= in .env, else cpu.
ARCH         ?= $(or $(shell sed -n 's/^ARCH=//p' .env 2>/dev/null | tail -n 1),cpu)
ARCH_FILE    := docker/arch/$(ARCH).env
ARCHS        := $(sort $(basename $(notdir $(wildcard docker/arch/*.env))))
ROCM_ARCHS   := $(filter-out cpu,$(ARCHS))
ifeq ($(wildcard $(ARCH_FILE)),)
$(error ARCH=$(ARCH) has no $(ARCH_FILE); use one of: $(ARCHS))
endif
include $(ARCH_FILE)

VERSION      := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE        := rocmft:$(ARCH)
IMAGE_TAG    := rocmft:$(VERSION)-$(if $(filter none,$(ROCM_VERSION)),cpu,rocm$(ROCM_VERSION)-$(ARCH))
# A CA bundle pip trusts inside image builds (a BuildKit secret, never a layer): the host's own bundle by
# default, which is what makes builds work behind TLS-intercepting proxies (our CI machines, corporate networks).
BUILD_CA_BUNDLE ?= $(wildcard /etc/ssl/certs/ca-certificates.crt)
CPU_COMPOSE  := COMPOSE_FILE=compose.yaml:compose.cpu.yaml ARCH=cpu HOST_UID=$$(id -u) HOST_GID=$$(id -g)

.DEFAULT_GOAL := help
.PHONY: help venv train render check test lint format docs lock clean docker-ready image images plan smoke

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' Makefile | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'
	@echo "  architectures: $(ARCHS) (ARCH=... or ARCH= in .env; now $(ARCH))"

$(BIN)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	touch $@

venv: $(BIN)/.installed ## create .venv with the pinned training stack (about 3 min the first time)

train: venv ## train on this machine without Docker (built-in tiny model and demo data unless set)
	$(BIN)/rocmft train

render: venv ## render and validate the configs into OUTPUT_DIR/rocmft without training
	$(BIN)/rocmft render

check: venv ## render, validate and run the health checks without training
	$(BIN)/rocmft check

docker-ready: venv ## make sure a Docker engine, Compose v2 and ARCH's base image are here (installs on our machines)
	bash docker/ensure-docker.sh '$(BASE_IMAGE)'

image: docker-ready ## build the image for ARCH (make image ARCH=gfx942): rocmft:<arch>, rocmft:<version>-rocm<ver>-<arch>
	ARCH='$(ARCH)' BASE_IMAGE='$(BASE_IMAGE)' ROCM_VERSION='$(ROCM_VERSION)' ROCMFT_VERSION='$(VERSION)' \
	GIT_COMMIT="$$(git rev-parse HEAD 2>/dev/null || echo unknown)" BUILD_DATE="$$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
	BUILD_CA_BUNDLE='$(BUILD_CA_BUNDLE)' docker compose build train
	docker tag $(IMAGE) $(IMAGE_TAG)

images: ## build the three ROCm images
	$(foreach a,$(ROCM_ARCHS),$(MAKE) image ARCH=$(a) &&) true

plan: ## print what `make image` would build for ARCH (base image, torch index, gfx targets, backends)
	@echo "architecture:        $(ARCH) ($(GPU_FAMILY)), from $(ARCH_FILE)"
	@echo "base image:          $(BASE_IMAGE)"
	@echo "ROCm:                $(ROCM_VERSION)"
	@echo "torch wheel index:   $(TORCH_INDEX_URL)"
	@echo "PYTORCH_ROCM_ARCH:   $(or $(PYTORCH_ROCM_ARCH),-)"
	@echo "bitsandbytes:        $(BITSANDBYTES) (BNB_ROCM_ARCH=$(or $(BNB_ROCM_ARCH),-))"
	@echo "flash-attention:     $(FLASH_ATTN_BACKEND)"
	@echo "DeepSpeed ops:       $(DS_BUILD_OPS_LIST)"
	@echo "nvidia wheels:       $(NVIDIA_WHEELS)"
	@echo "tags:                $(IMAGE) $(IMAGE_TAG)"

smoke: ## build the cpu image and run the built-in default through `docker compose up train`
	$(MAKE) image ARCH=cpu
	mkdir -p saves data models
	$(CPU_COMPOSE) docker compose up --exit-code-from train train
	@test -O saves/rocmft-demo/rocmft/manifest.json || { echo "smoke: outputs are not owned by $$(id -un)"; exit 1; }
	@grep -q '"status": "finished"' saves/rocmft-demo/rocmft/manifest.json && echo "smoke: passed (saves/rocmft-demo)"

test: docker-ready lint ## lint, then the whole test suite: unit, CPU training, Docker build and run (~20 min cold)
	SHARED_DIR=$(SHARED) $(BIN)/python -m pytest $(PYTEST_ARGS)

lint: venv ## ruff, hadolint (Dockerfile), and `docker compose config` for the GPU and cpu setups
	$(BIN)/ruff check entrypoint tests bench
	$(BIN)/ruff format --check entrypoint tests bench
	$(BIN)/hadolint --config docker/hadolint.yaml Dockerfile
	@if docker compose version >/dev/null 2>&1; then \
	  docker compose -f compose.yaml config --quiet && \
	  docker compose -f compose.yaml -f compose.cpu.yaml config --quiet && \
	  NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 docker compose -f compose.yaml -f compose.multinode.yaml config --quiet && \
	  echo "compose config: ok"; \
	else echo "compose config: skipped (no Compose v2 yet; make docker-ready)"; fi

format: venv ## apply ruff's formatting and safe fixes
	$(BIN)/ruff format entrypoint tests bench
	$(BIN)/ruff check --fix entrypoint tests bench

docs: venv ## regenerate the README's variable reference and docs/training-arguments.md from the code
	$(BIN)/python -m rocmft.envdoc --write README.md docs/training-arguments.md

lock: venv ## rewrite constraints.txt from the current environment (after changing pyproject.toml)
	{ sed -n '1,2p' constraints.txt; $(BIN)/python -m pip freeze --exclude-editable | grep -v '^rocmft'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

clean: ## remove .venv, caches and saves/
	rm -rf $(VENV) .pytest_cache .ruff_cache saves *.egg-info entrypoint/*.egg-info
