#!/usr/bin/env bash
# Build the local Debian base image for per-session containers (no registry needed), cached:
# a no-op when the image exists; re-imports the cached rootfs tar when only the engine is new;
# runs debootstrap (~1-2 min, needs root and `apt-get install -y debootstrap`) the first time.
#   scripts/build_base_image.sh [--tag agentrl-base:bookworm] [--include python3,procps] [--force]
# Uses $DOCKER_HOST, else the private engine of scripts/dockerd.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
export DOCKER_HOST="${DOCKER_HOST:-$(scripts/dockerd.sh host)}"
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
PYTHONPATH="${PWD}${PYTHONPATH:+:${PYTHONPATH}}" exec "${PYTHON}" -m agentrl_ext.env.providers.base_image "$@"
