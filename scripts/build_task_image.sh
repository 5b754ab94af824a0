#!/usr/bin/env bash
# Build a task worker image (envs/<task>/Dockerfile) with no network inside the build:
# the wheels of agentrl_ext[<extras>] and its dependencies are built here, with this machine's pip
# (its index, proxy and certificates), from the committed tree (git archive HEAD), and the image
# installs them offline on the local base image (scripts/build_base_image.sh, run first: a no-op
# when the engine has it).
#   scripts/build_task_image.sh dbbench                  # -> agentrl-dbbench:latest
#   EXTRAS=dbbench TAG=agentrl-dbbench:dev scripts/build_task_image.sh dbbench
# Uses $DOCKER_HOST, else the private engine of scripts/dockerd.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
TASK="${1:?usage: $0 TASK (a folder of envs/ with a Dockerfile)}"
EXTRAS="${EXTRAS:-${TASK}}"
TAG="${TAG:-agentrl-${TASK}:latest}"
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
export DOCKER_HOST="${DOCKER_HOST:-$(scripts/dockerd.sh host)}"
[ -f "envs/${TASK}/Dockerfile" ] || { echo "no envs/${TASK}/Dockerfile" >&2; exit 2; }
# the images are built FROM the local base image: build it first when the engine lacks it (a no-op otherwise)
scripts/build_base_image.sh >/dev/null

context="$(mktemp -d -t "agentrl-image-${TASK}-XXXXXX")"
trap 'rm -rf "${context}"' EXIT
mkdir -p "${context}/src" "${context}/wheels"
git archive HEAD | tar -x -C "${context}/src"
"${PYTHON}" -m pip wheel -q --wheel-dir "${context}/wheels" "${context}/src[${EXTRAS}]"
"${PYTHON}" -m pip download -q --no-deps --dest "${context}/wheels" pip
cp "envs/${TASK}/Dockerfile" "${context}/Dockerfile"
start=$(date +%s)
docker build -q -t "${TAG}" --build-arg "EXTRAS=${EXTRAS}" "${context}" >/dev/null
echo "built ${TAG} in $(( $(date +%s) - start ))s ($(du -sh "${context}/wheels" | cut -f1) of wheels)"
