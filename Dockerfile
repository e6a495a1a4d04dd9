# rocmft image, one per GPU architecture: `make image ARCH=gfx942` (gfx90a, gfx942, gfx950, gfx1100, cpu).
# Every architecture-specific value lives in docker/arch/<ARCH>.env; `make image` passes the build arguments
# below from that file (through docker/build.yaml, BuildKit). The steps are scripts in docker/steps/, each
# recording what it did in /etc/rocmft/build-steps.jsonl. `make rehearse ARCH=<gfx>` builds this same file
# against a stand-in base (docker/rehearsal/) with REHEARSAL=1, where only the steps that need the ROCm torch
# wheel are skipped, by name.
#
# Stages, in the order they change least: pins (the lock, split per stage: docker/steps/pins.sh) -> system (OS
# packages, venv, user) -> torch (the triple from the profile's index) -> stack (LLaMA-Factory and the rest of the
# lock) are shared by every architecture of a flavour (ROCm 7.2, cpu); flash-attn (a wheel per ARCH, built FROM
# torch) and target (FROM stack: DeepSpeed ops, bitsandbytes, Liger, the flash-attn wheel) are per ARCH; runtime
# (rocmft itself) is last, so that changing rocmft's code or version rebuilds only it. Each stage copies only the
# pins it installs and the full lock comes in at the stack stage, so re-pinning a package that torch and flash-attn
# do not install rebuilds the stack and what follows, never torch or the flash-attn build (issue 31, finding 2;
# tests/test_rehearsal.py::test_a_lock_re_pin_rebuilds_neither_torch_nor_flash_attn).

# The base image with its digest (`make image` passes BASE_IMAGE@BASE_DIGEST); no default, so that a build
# outside make fails here instead of building FROM the wrong image.
ARG BASE_IMAGE
ARG FLASH_ATTN_VERSION=2.8.3

# The lock split into one constraint file per installing stage (docker/steps/pins.sh says what each holds). This
# stage re-runs on every lock edit (seconds); a stage that copies an unchanged file from it stays cached, because
# BuildKit keys a COPY by the checksum of the files it copies, not by the stage they come from
# (https://docs.docker.com/build/cache/invalidation/, "General rules").
FROM ${BASE_IMAGE} AS pins
ARG LOCK
COPY ${LOCK} /tmp/lock.txt
COPY docker/steps/pins.sh /tmp/pins.sh
RUN bash /tmp/pins.sh /tmp/lock.txt /pins

FROM ${BASE_IMAGE} AS system
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG REHEARSAL=0
ENV PATH=/opt/venv/bin:$PATH \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1
COPY docker/pip.sh /usr/local/bin/rocmft-pip
COPY --from=pins /pins/system.txt /opt/rocmft/build/pins-system.txt
COPY docker/steps/lib.sh docker/steps/system.sh /opt/rocmft/build/
RUN --mount=type=secret,id=ca_bundle /opt/rocmft/build/system.sh

# pyproject.toml's dependency lists, extracted: the stack stage copies only this output, so a change of
# rocmft's version or metadata (the same output) does not rebuild torch or the stack (BuildKit compares content).
FROM system AS requirements
COPY pyproject.toml /tmp/pyproject.toml
RUN python3 -c "import tomllib; p = tomllib.load(open('/tmp/pyproject.toml', 'rb'))['project']; \
      deps = [d for d in p['dependencies'] if not d.startswith('deepspeed')]; \
      open('/requirements.txt', 'w').write('\n'.join(deps) + '\n'); \
      open('/gpu-requirements.txt', 'w').write('\n'.join(p['optional-dependencies']['gpu']) + '\n')"

FROM system AS torch
ARG REHEARSAL=0
ARG TORCH_INDEX_URL
# cpu, or rocm<ROCM_VERSION>: one pip cache per flavour, shared by its architectures. Only downloads and the
# indexes' own wheels are reused from it; per-target builds bypass it (docker/steps/lib.sh build_for_target).
ARG FLAVOUR
COPY --from=pins /pins/torch.txt /opt/rocmft/build/pins-torch.txt
COPY docker/steps/torch.sh /opt/rocmft/build/
RUN --mount=type=secret,id=ca_bundle --mount=type=cache,id=pip-${FLAVOUR},target=/root/.cache/pip \
    /opt/rocmft/build/torch.sh

# The full lock, copied here and not before: its edits rebuild from this stage on.
FROM torch AS stack
ARG REHEARSAL=0
ARG TORCH_INDEX_URL
ARG PYTHON_VERSION
ARG FLAVOUR
ARG LOCK
COPY ${LOCK} /opt/rocmft/build/lock.txt
COPY --from=requirements /requirements.txt /gpu-requirements.txt /opt/rocmft/build/
COPY docker/steps/stack.sh /opt/rocmft/build/
RUN --mount=type=secret,id=ca_bundle --mount=type=cache,id=pip-${FLAVOUR},target=/root/.cache/pip \
    /opt/rocmft/build/stack.sh

# The architecture profile's build settings, extracted: the per-arch stages copy only these, so that a change of
# a runtime setting (RUNTIME_*, FULL_NODE_*, the bandwidth floor) or of a comment in docker/arch/<ARCH>.env does not
# rebuild flash-attention (hours) or DeepSpeed's ops. flash-attn.env holds only what that stage reads.
FROM system AS profile
ARG ARCH
COPY docker/arch/${ARCH}.env /tmp/arch.env
RUN grep -E '^[A-Z]' /tmp/arch.env > /tmp/settings.env \
 && grep -v -E '^(RUNTIME_|FULL_NODE_|RCCL_BUSBW_FLOOR_GBPS=)' /tmp/settings.env > /build.env \
 && grep -E '^(ARCH|FLASH_ATTN_BACKEND|PYTORCH_ROCM_ARCH)=' /tmp/settings.env > /flash-attn.env

# FROM torch, not stack: the build needs torch and its own few pins (pins-flash-attn.txt), so that no edit of the
# rest of the lock repeats its hours of Composable Kernel compiles.
FROM torch AS flash-attn
ARG REHEARSAL=0
ARG FLASH_ATTN_VERSION
COPY --from=pins /pins/flash-attn.txt /opt/rocmft/build/pins-flash-attn.txt
COPY --from=profile /flash-attn.env /etc/rocmft/build-profile.env
COPY docker/steps/flash-attn.sh docker/steps/flash_attn_ck_smoke.py /opt/rocmft/build/
# fixes carried for the pinned flash-attn until upstream releases them (each patch says where upstream has it)
COPY docker/patches /opt/rocmft/build/patches
RUN --mount=type=secret,id=ca_bundle FLASH_ATTN_VERSION=${FLASH_ATTN_VERSION} /opt/rocmft/build/flash-attn.sh

FROM stack AS target
ARG REHEARSAL=0
ARG ARCH
# flash-attention's Triton backend (FLASH_ATTN_BACKEND=triton, which no shipped profile uses since issue 31) is
# chosen at import by FLASH_ATTENTION_TRITON_AMD_ENABLE (flash_attn_interface.py): set for every process in the
# image, the build check's import included. `make image` derives FA_TRITON from FLASH_ATTN_BACKEND. (The argument
# has another name than the variable: a build argument is visible to later RUN steps, also of later stages, but
# not in the finished image, so the build check could pass on a value users never get; `make image` checks the
# finished image's environment again.)
ARG FA_TRITON=FALSE
ENV FLASH_ATTENTION_TRITON_AMD_ENABLE=${FA_TRITON}
COPY --from=profile /build.env /etc/rocmft/build-profile.env
COPY --from=flash-attn /wheels /opt/rocmft/wheels
COPY docker/steps/target.sh /opt/rocmft/build/
COPY docker/steps/arch_probe-1.0 /opt/rocmft/build/arch_probe-1.0
RUN --mount=type=secret,id=ca_bundle /opt/rocmft/build/target.sh

FROM target AS runtime
ARG REHEARSAL=0
ARG ARCH
ARG BASE_IMAGE
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
      io.rocmft.rocm-version="${ROCM_VERSION}" \
      io.rocmft.rehearsal="${REHEARSAL}"
# rocmft itself last: changing entrypoint/ or templates/ rebuilds only from here (seconds). LLaMA-Factory's
# argument vocabulary is baked next to build.json (rocmft.config.lfargs.BAKED_DIR): a first start skips that import.
COPY pyproject.toml README.md /tmp/rocmft-src/
COPY entrypoint /tmp/rocmft-src/entrypoint
COPY templates /tmp/rocmft-src/templates
# every profile ships in the package (rocmft.profiles: the planner reads a GPU's flash-attention backend there)
COPY docker/arch /tmp/rocmft-src/docker/arch
COPY entrypoint/container-entry.sh /usr/local/bin/rocmft-entry
COPY docker/arch/${ARCH}.env /etc/rocmft/arch.env
COPY docker/steps/rocmft.sh /opt/rocmft/build/
RUN --mount=type=secret,id=ca_bundle ROCMFT_BASE_IMAGE="$BASE_IMAGE" ROCMFT_GIT_COMMIT="$GIT_COMMIT" ROCMFT_BUILD_DATE="$BUILD_DATE" \
    /opt/rocmft/build/rocmft.sh \
 && chmod 1777 /home/rocmft
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
