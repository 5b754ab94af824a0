#!/usr/bin/env bash
# Build the OS-interaction session images (envs/os/image/Dockerfile) on the local base image:
#   scripts/build_os_image.sh              # -> agentrl-os:default
#   scripts/build_os_image.sh default packages   # also agentrl-os:packages (+ npm, ~2 min more)
# Packages come from Debian's archive (the build runs with --network host; the session containers
# themselves never get a network). Builds the base image first when it is missing.
# Uses $DOCKER_HOST, else the private engine of scripts/dockerd.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
export DOCKER_HOST="${DOCKER_HOST:-$(scripts/dockerd.sh host)}"
REPOSITORY="${REPOSITORY:-agentrl-os}"
[ "$#" -gt 0 ] || set -- default
bash scripts/build_base_image.sh >/dev/null
for subtype in "$@"; do
  case "${subtype}" in
    default) extra="" ;;
    packages) extra="npm" ;;
    *) echo "unknown OS image subtype '${subtype}'; expected default or packages" >&2; exit 2 ;;
  esac
  start=$(date +%s)
  docker build -q --network host -t "${REPOSITORY}:${subtype}" --build-arg "EXTRA_PACKAGES=${extra}" \
    -f envs/os/image/Dockerfile envs/os/image >/dev/null
  size=$(docker image inspect -f '{{.Size}}' "${REPOSITORY}:${subtype}")
  echo "built ${REPOSITORY}:${subtype} in $(( $(date +%s) - start ))s ($(( size / 1000000 )) MB)"
done
