# rocmft image, one per GPU architecture: `make image ARCH=gfx942` (gfx90a, gfx942, gfx1100, cpu).
# Every architecture-specific value lives in docker/arch/<ARCH>.env; this file has no per-arch branches
# beyond reading those values. Build through `make image` (it passes BASE_IMAGE and the labels' values from
# that file) with BuildKit: `docker compose build` (our CI) or `docker buildx build`.
#
# Stages: system (OS packages, venv, user) -> stack (torch triple, LLaMA-Factory, DeepSpeed ops,
# bitsandbytes, flash-attention; slow, cached) -> runtime (rocmft itself; rebuilt in seconds).

ARG BASE_IMAGE=debian:bookworm-slim
# Versions shared by every architecture (bitsandbytes >= 0.50: older ones give NaNs in 4-bit on AMD, DESIGN.md)
ARG BITSANDBYTES_VERSION=0.50.2
ARG FLASH_ATTN_VERSION=2.8.3

FROM ${BASE_IMAGE} AS system
ARG ARCH=cpu
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY docker/arch/${ARCH}.env /etc/rocmft/arch.env
# A ROCm dev image or a debootstrapped Debian may already hold these; install only what is missing, so a
# machine without a Debian/Ubuntu mirror can build from a base that carries them (the build machines' notes, shared/docs/ENVIRONMENT.md).
# numactl: torchrun --numa-binding (ROCMFT_NUMA_BIND) starts each rank under it.
# hadolint ignore=DL3008
RUN packages=(python3 python3-venv python3-dev g++ make git ca-certificates tini numactl) \
 && missing=() && for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done \
 && if [ "${#missing[@]}" -gt 0 ]; then \
      apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" \
      && rm -rf /var/lib/apt/lists/*; \
    fi \
 && python3 -m venv /opt/venv \
 && groupadd --system --force render && groupadd --system --force video \
 && useradd --create-home --uid 1000 --user-group --groups video,render --shell /bin/bash rocmft \
 && install -d -m 1777 /cache /saves /data
ENV PATH=/opt/venv/bin:$PATH \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1
COPY docker/pip.sh /usr/local/bin/rocmft-pip

FROM system AS stack
# The pinned stack: pyproject.toml names it, constraints.txt fixes every transitive version.
COPY pyproject.toml constraints.txt /tmp/rocmft-pins/
# torch, torchvision and torchaudio as one matching triple from the architecture's wheel index.
RUN --mount=type=secret,id=ca_bundle --mount=type=cache,target=/root/.cache/pip \
    set -a && . /etc/rocmft/arch.env && set +a \
 && rocmft-pip install --upgrade "setuptools>=77" wheel \
 && rocmft-pip install --index-url "$TORCH_INDEX_URL" -c /tmp/rocmft-pins/constraints.txt \
      torch==2.11.0 torchvision==0.26.0 torchaudio==2.11.0
# (setuptools >= 77 reads the PEP 639 license string; a fresh venv may carry an older one.)
# LLaMA-Factory and the rest of the runtime dependencies (torch above satisfies their torch pin);
# DeepSpeed's ops for this target are compiled now (DS_BUILD_<OP>=1), so nothing JIT-compiles at run time.
RUN --mount=type=secret,id=ca_bundle --mount=type=cache,target=/root/.cache/pip \
    set -a && . /etc/rocmft/arch.env && set +a \
 && for op in $DS_BUILD_OPS_LIST; do export "DS_BUILD_${op}=1"; done \
 && python3 -c "import tomllib; print('\n'.join(tomllib.load(open('/tmp/rocmft-pins/pyproject.toml','rb'))['project']['dependencies']))" \
      > /tmp/rocmft-pins/requirements.txt \
 && rocmft-pip install --no-build-isolation -c /tmp/rocmft-pins/constraints.txt -r /tmp/rocmft-pins/requirements.txt
# bitsandbytes with its HIP backend for this gfx target (bitsandbytes' build-rocm.sh), and flash-attention
# with the architecture's backend; both skipped where the profile says none.
ARG BITSANDBYTES_VERSION
ARG FLASH_ATTN_VERSION
RUN --mount=type=secret,id=ca_bundle --mount=type=cache,target=/root/.cache/pip \
    set -a && . /etc/rocmft/arch.env && set +a \
 && if [ "$BITSANDBYTES" = hip ]; then \
      git clone --depth 1 --branch "$BITSANDBYTES_VERSION" https://github.com/bitsandbytes-foundation/bitsandbytes.git /tmp/bnb \
      && cmake -S /tmp/bnb -B /tmp/bnb/build -DCOMPUTE_BACKEND=hip -DBNB_ROCM_ARCH="$BNB_ROCM_ARCH" \
      && cmake --build /tmp/bnb/build -j "$(nproc)" && rocmft-pip install --no-build-isolation /tmp/bnb \
      && rm -rf /tmp/bnb; \
    fi \
 && if [ "$FLASH_ATTN_BACKEND" = ck ]; then \
      GPU_ARCHS="$PYTORCH_ROCM_ARCH" rocmft-pip install --no-build-isolation "flash-attn==$FLASH_ATTN_VERSION"; \
    elif [ "$FLASH_ATTN_BACKEND" = triton ]; then \
      FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE rocmft-pip install --no-build-isolation "flash-attn==$FLASH_ATTN_VERSION"; \
    fi

FROM stack AS runtime
ARG ARCH=cpu
ARG BASE_IMAGE=debian:bookworm-slim
ARG ROCM_VERSION=none
ARG ROCMFT_VERSION=0.0.0
ARG GIT_COMMIT=unknown
ARG BUILD_DATE=unknown
LABEL org.opencontainers.image.title="rocmft" \
      org.opencontainers.image.description="LLaMA-Factory fine-tuning for AMD GPUs (${ARCH})" \
      org.opencontainers.image.version="${ROCMFT_VERSION}" \
      org.opencontainers.image.revision="${GIT_COMMIT}" \
      org.opencontainers.image.created="${BUILD_DATE}" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      io.rocmft.arch="${ARCH}" \
      io.rocmft.rocm-version="${ROCM_VERSION}"
# rocmft itself last: changing entrypoint/ or templates/ rebuilds only from here (seconds). LLaMA-Factory's
# argument vocabulary is baked next to build.json (rocmft.lfargs.BAKED_DIR): a first start skips that import.
COPY pyproject.toml README.md /tmp/rocmft-src/
COPY entrypoint /tmp/rocmft-src/entrypoint
COPY templates /tmp/rocmft-src/templates
COPY entrypoint/container-entry.sh /usr/local/bin/rocmft-entry
RUN --mount=type=cache,target=/root/.cache/pip \
    rocmft-pip install --no-deps --no-build-isolation /tmp/rocmft-src \
 && rm -rf /tmp/rocmft-src \
 && chmod 1777 /home/rocmft \
 && ROCMFT_BASE_IMAGE="$BASE_IMAGE" ROCMFT_GIT_COMMIT="$GIT_COMMIT" ROCMFT_BUILD_DATE="$BUILD_DATE" \
    python3 -m rocmft.buildinfo /etc/rocmft/arch.env /etc/rocmft/build.json \
 && ROCMFT_CACHE_DIR=/etc/rocmft python3 -c "from rocmft.lfargs import vocabulary; vocabulary()" \
 && ls /etc/rocmft/lf-vocabulary-*.json
# HOME, USER and LOGNAME are set so that any uid works (compose runs as the host user, HOST_UID, which has
# no /etc/passwd entry here): torch's cache paths call getpass.getuser(), which reads USER before passwd.
ENV HOME=/home/rocmft \
    USER=rocmft \
    LOGNAME=rocmft \
    ROCMFT_CACHE_DIR=/cache/rocmft \
    ROCMFT_SAVES_DIR=/saves \
    DATASET_DIR=/data \
    HF_HOME=/cache/huggingface \
    TORCH_EXTENSIONS_DIR=/cache/torch_extensions
USER 1000:1000
# Relative paths mean what they mean on the host: saves/<run> is the ./saves volume, data/ the ./data volume.
WORKDIR /
# tini reaps children and passes SIGTERM to rocmft, which passes it to the training processes.
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/rocmft-entry"]
CMD ["train"]
