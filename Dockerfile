# syntax=docker/dockerfile:1
# The pfcps image that deploy/kubernetes/*.yaml runs: pfcps-server, pfcps-worker and pfcps in /opt/pfcps/bin
# (meson install with -Dprefix=/opt/pfcps), on Debian 12.
#
#   docker build -t pfcps:0.1.0 .                          # CPU device only: servers, workers with device = cpu
#   docker build --build-arg CUDA=12.6 -t pfcps:0.1.0 .    # + the CUDA device (workers with device = cuda): nvcc,
#                                                          #   cuBLAS, cuDNN 9 and NCCL from NVIDIA's CUDA
#                                                          #   repository for Debian 12 (CUDA >= 12)
#   docker run --rm pfcps:0.1.0                            # pfcps --help
#
# Stage 1 installs the build packages of deploy/setup-deps.sh (not its test tools: the tests are not built
# here; tests/deploy/kubernetes/test_k8s_manifests.sh checks that the two lists agree), builds this source
# tree with meson and installs it. It also writes the Debian packages (name=version) that own the shared
# libraries the installed programs load (ldd, dpkg -S), so that stage 2, the runtime image, installs exactly
# those, plus ibverbs-providers (the RDMA drivers libibverbs loads for provider = verbs) and libfabric-bin
# (fi_info).
# The GPU driver (libcuda) comes from the node at run time (NVIDIA container toolkit / GPU operator).

FROM debian:12-slim AS build
ARG CUDA=
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Debian 12 is a stable release (security updates only): the packages are not pinned to versions.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      meson ninja-build pkg-config gcc python3 protobuf-c-compiler \
      libfabric-dev libprotobuf-c-dev libinih-dev libturbojpeg0-dev libpng-dev \
      libssl-dev libopenblas-dev libdnnl-dev \
      libjansson-dev libonnx-dev libmicrohttpd-dev libcurl4-openssl-dev libzip-dev \
      ca-certificates \
 && rm -rf /var/lib/apt/lists/*
# CUDA toolkit parts pfcps uses (kernels/cuda/meson.build: cudart, cuBLAS, cuDNN, NCCL); NCCL pinned to the
# build for this CUDA version. nvcc needs g++ as its host compiler.
# hadolint ignore=DL3008
RUN if [ -n "$CUDA" ]; then \
      v=${CUDA/./-} \
      && apt-get update \
      && apt-get install -y --no-install-recommends curl g++ \
      && curl -fsSLo /tmp/cuda-keyring.deb \
           https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb \
      && dpkg -i /tmp/cuda-keyring.deb && rm /tmp/cuda-keyring.deb \
      && apt-get update \
      && nccl=$(apt-cache madison libnccl-dev | awk -v c="+cuda$CUDA" 'index($3, c) { print $3; exit }') \
      && { [ -n "$nccl" ] || { echo "no NCCL build for CUDA $CUDA" >&2; exit 1; }; } \
      && apt-get install -y --no-install-recommends \
           "cuda-nvcc-$v" "cuda-cudart-dev-$v" "cuda-cccl-$v" "libcublas-dev-$v" \
           "libcudnn9-dev-cuda-${CUDA%%.*}" "libnccl-dev=$nccl" "libnccl2=$nccl" \
      && ln -sfn "/usr/local/cuda-$CUDA" /usr/local/cuda \
      && rm -rf /var/lib/apt/lists/*; \
    fi
ENV PATH=/usr/local/cuda/bin:$PATH
WORKDIR /src
COPY . .
# -Dwerror=false: a new compiler warning must not stop an image build (the test builds keep -Werror).
# (dpkg-query's format is meant literally: SC2016.)
# hadolint ignore=SC2016
RUN meson setup /build -Dprefix=/opt/pfcps -Dtests=false -Dwerror=false \
      -Dcuda="$([ -n "$CUDA" ] && echo enabled || echo disabled)" \
 && meson compile -C /build \
 && meson install -C /build --strip \
 && mkdir -p /opt/pfcps/share/pfcps \
 && for f in $(ldd /opt/pfcps/bin/* | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u); do \
      dpkg -S "$(readlink -f "$f")" 2>/dev/null || dpkg -S "$f"; \
    done | cut -d: -f1 | sort -u \
    | xargs dpkg-query -W -f='${Package}=${Version}\n' >/opt/pfcps/share/pfcps/runtime-packages \
 && cat /opt/pfcps/share/pfcps/runtime-packages

FROM debian:12-slim
# The apt sources and keys of the build stage (NVIDIA's repository too when CUDA was set).
COPY --from=build /etc/apt/sources.list.d/ /etc/apt/sources.list.d/
COPY --from=build /usr/share/keyrings/ /usr/share/keyrings/
COPY --from=build /opt/pfcps /opt/pfcps
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# hadolint ignore=DL3008
RUN apt-get update \
 && xargs -a /opt/pfcps/share/pfcps/runtime-packages \
      apt-get install -y --no-install-recommends ca-certificates ibverbs-providers libfabric-bin \
 && rm -rf /var/lib/apt/lists/* \
 && ! ldd /opt/pfcps/bin/* | grep -v 'libcuda\.so' | grep 'not found' \
 && /opt/pfcps/bin/pfcps --help >/dev/null
ENV PATH=/opt/pfcps/bin:$PATH
# Relative paths in a config (`output`, `rec`) are under /work. Root: Kubernetes gives an added capability
# (IPC_LOCK, provider = verbs) only to a process running as root; the manifests drop every other capability.
WORKDIR /work
CMD ["pfcps", "--help"]
