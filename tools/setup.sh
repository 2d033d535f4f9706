#!/usr/bin/env bash
# Installs what vela needs to build and test on Debian/Ubuntu, when missing.
# The CUDA toolkit itself is expected to be installed already (nvcc on PATH
# or under /usr/local/cuda); without it vela builds the CPU backend alone.
#   tools/setup.sh           what building and running vela needs
#   tools/setup.sh --tests   also Chromium, for the chat page's browser test
#                            (tests/run.sh; the test skips itself without it)
set -euo pipefail
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
command -v cc >/dev/null || need+=(build-essential)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v git >/dev/null || need+=(git)
[ -e /usr/include/criterion/criterion.h ] || need+=(libcriterion-dev)
[ -e /usr/include/cjson/cJSON.h ] || need+=(libcjson-dev)
[ -e /usr/include/microhttpd.h ] || need+=(libmicrohttpd-dev) # vela serve
command -v python3 >/dev/null || need+=(python3)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv) # tests/serve (openai client)
command -v mpicc >/dev/null || need+=(libopenmpi-dev openmpi-bin) # mpirun pipelines (host/split/mpi.c)
[ -e /usr/include/histedit.h ] || need+=(libedit-dev) # vela chat's line editing and history
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  echo "setup: installing ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup: add /usr/local/cuda/bin to PATH to build the CUDA backend" >&2
fi
# Chromium apart: Ubuntu's package is a snap stub that cannot install
# everywhere, and the browser test skips itself (and says so) without it.
if [ "${1:-}" = "--tests" ] && ! command -v chromium >/dev/null &&
  ! command -v chromium-browser >/dev/null; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  echo "setup: installing chromium (the chat page's browser test)"
  [ ${#need[@]} -gt 0 ] || $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null ||
    echo "setup: chromium could not be installed: the test serve_webui will be skipped" >&2
fi
