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
# The source is bind-mounted read-write (the build's writes are discarded): only the installed
# package stays in the image.
RUN --mount=type=bind,target=/src,rw pip install /src/api "/src[operator]"
USER 1000:1000
WORKDIR /home/muralist
ENTRYPOINT ["muralist"]
CMD ["operator"]

# ---------------------------------------------------------------------------------------------
# The runtime extra's requirements alone, so that only a change to them rebuilds the torch layer.
FROM ${PYTHON_BASE} AS runtime-requirements
RUN --mount=type=bind,source=hack/image-base.sh,target=/tmp/image-base.sh \
    --mount=type=secret,id=extra_ca \
    sh /tmp/image-base.sh
RUN --mount=type=bind,source=pyproject.toml,target=/tmp/pyproject.toml \
    python3 -c 'import tomllib; print("\n".join(tomllib.load(open("/tmp/pyproject.toml", "rb"))["project"]["optional-dependencies"]["runtime"]))' \
        > /requirements.txt

# ---------------------------------------------------------------------------------------------
FROM ${RUNTIME_BASE} AS runtime
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
    PYTHONUNBUFFERED=1 \
    HF_HOME=/var/cache/huggingface \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
# The dependencies first, in their own layer: the multi-GB torch layer survives source changes,
# and edits of pyproject.toml outside the runtime extra (its requirements are the layer's key).
COPY --from=runtime-requirements /requirements.txt /tmp/requirements.txt
RUN pip install -r /tmp/requirements.txt
RUN --mount=type=bind,target=/src,rw pip install /src/api "/src[runtime]"
# The model cache: writable by the pods' user (a volume is mounted here when spec.model.cache is set).
RUN mkdir -p "$HF_HOME" && chown 1000:1000 "$HF_HOME"
USER 1000:1000
WORKDIR /home/muralist
# Pods run `python -m muralist_runtime.launch --spec FILE` (the operator sets the command); `docker run IMAGE run
# JOB.yaml` renders a job on one machine.
ENTRYPOINT ["muralist"]
CMD ["--help"]
