#!/bin/sh
# Prepares a base image for Muralist (run by the Dockerfile, in both targets): a Python >= 3.11
# with venv at /opt/venv, the system CA bundle (plus the optional extra CA from the build
# secret `extra_ca`), and user/group 1000. Works on python:*-slim (its Python is used) and on
# plain Debian (Debian's python3 is installed).
#
# Usage: image-base.sh [--compiler]   --compiler (the runtime target): a C++ compiler and Python's
# headers, which torch.compile needs at run time (inductor's C++ kernels on a CPU; Triton's
# launcher on a GPU): generation.compile fails in an image without them.
set -eu

missing=""
if ! command -v python3 >/dev/null || ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    missing="python3 python3-venv"
fi
if ! command -v update-ca-certificates >/dev/null; then
    missing="$missing ca-certificates"
fi
if [ "${1:-}" = "--compiler" ]; then
    command -v g++ >/dev/null || missing="$missing g++"
    # python:*-slim has its headers; Debian's python3 needs python3-dev (checked once it is installed, below).
    if ! python3 -c 'import os, sysconfig; assert os.path.exists(sysconfig.get_paths()["include"] + "/Python.h")' \
            2>/dev/null; then
        missing="$missing python3-dev"
    fi
fi
if [ -n "$missing" ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    # shellcheck disable=SC2086 # a list of package names
    apt-get install -y --no-install-recommends $missing
    rm -rf /var/lib/apt/lists/*
fi

# A corporate proxy's CA: into the system bundle that pip (PIP_CERT), requests and httpx use.
if [ -s /run/secrets/extra_ca ]; then
    cp /run/secrets/extra_ca /usr/local/share/ca-certificates/muralist-extra-ca.crt
    update-ca-certificates
fi

python3 -c 'import sys; assert sys.version_info >= (3, 11), f"Python >= 3.11 needed, base has {sys.version}"'
if [ "${1:-}" = "--compiler" ]; then
    g++ --version >/dev/null
    python3 -c 'import os, sysconfig; assert os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"), "no Python.h"'
fi
groupadd --gid 1000 muralist
useradd --uid 1000 --gid 1000 --create-home --home-dir /home/muralist --shell /usr/sbin/nologin muralist
python3 -m venv /opt/venv
