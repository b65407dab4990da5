# Muralist images, one file, two targets. Needs BuildKit (Docker >= 20.10 with DOCKER_BUILDKIT=1,
# or buildx); no `# syntax=` line, so no frontend image is pulled:
#
#   docker build --target operator -t muralist-operator .   # the kopf operator, no torch
#   docker build --target runtime  -t muralist-runtime  .   # torch (CUDA wheels) + diffusers, in each pod
#
# Base images are build arguments, pinned by tag here (pin by digest for releases). Both targets
# work on a python:3.11+-slim base and on a plain Debian bookworm base (Debian's python3 is then
# installed with apt): hack/image-base.sh prepares either.
#
# Behind a TLS-intercepting proxy, pass its CA as a build secret; it joins the system CA bundle,
# which pip, requests and httpx use during the build and in the running images:
#
#   docker build --secret id=extra_ca,src=/path/to/proxy-ca.pem --target operator .

ARG PYTHON_BASE=python:3.11-slim-bookworm
# PyPI's Linux x86_64 torch wheels carry their CUDA libraries (nvidia-* wheels) and the driver
# comes from the node (NVIDIA container toolkit): the runtime needs no CUDA base image.
ARG RUNTIME_BASE=python:3.11-slim-bookworm

# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_BASE} AS operator
RUN --mount=type=bind,source=hack/image-base.sh,target=/tmp/image-base.sh \
    --mount=type=secret,id=extra_ca \
    sh /tmp/image-base.sh
ENV PATH=/opt/venv/bin:$PATH \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# The third-party packages from the lock, each checked against its hashes (bash hack/lock.sh refreshes it);
# its own layer, rebuilt only when the lock changes.
COPY locks/operator.txt /opt/venv/lock.txt
RUN pip install --require-hashes -r /opt/venv/lock.txt
# Then ours, without dependencies (the lock has them): the source is bind-mounted read-write (the build's
# writes are discarded), so only the installed packages stay in the image.
RUN --mount=type=bind,target=/src,rw pip install --no-deps /src/api /src
USER 1000:1000
WORKDIR /home/muralist
ENTRYPOINT ["muralist"]
CMD ["operator"]

# ---------------------------------------------------------------------------------------------
FROM ${RUNTIME_BASE} AS runtime
# --compiler: g++ and Python's headers, for generation.compile (torch.compile builds kernels in the pod).
RUN --mount=type=bind,source=hack/image-base.sh,target=/tmp/image-base.sh \
    --mount=type=secret,id=extra_ca \
    sh /tmp/image-base.sh --compiler
ENV PATH=/opt/venv/bin:$PATH \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/var/cache/huggingface \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
# The dependencies first, from the lock (each checked against its hashes), in their own layer: the
# multi-GB torch layer survives every change but one of the lock.
COPY locks/runtime.txt /opt/venv/lock.txt
RUN pip install --require-hashes -r /opt/venv/lock.txt
RUN --mount=type=bind,target=/src,rw pip install --no-deps /src/api /src
# The model cache: writable by the pods' user (a volume is mounted here when spec.model.cache is set).
RUN mkdir -p "$HF_HOME" && chown 1000:1000 "$HF_HOME"
USER 1000:1000
WORKDIR /home/muralist
# Pods run `python -m muralist_runtime.launch --spec FILE` (the operator sets the command); `docker run IMAGE run
# JOB.yaml` renders a job on one machine.
ENTRYPOINT ["muralist"]
CMD ["--help"]
