#!/usr/bin/env bash
# The main job: install what is missing, build vela, and generate text.
# With no argument it first writes a small synthetic model (random weights,
# so the text is gibberish, but every stage of the engine runs) and uses it.
#   tools/quickstart.sh [MODEL.gguf] [PROMPT]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
bash tools/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)"

model=${1:-}
prompt=${2:-"Once upon a time"}
if [ -z "$model" ]; then
  model=build/tiny.gguf
  [ -f "$model" ] || ./build/vela mkmodel --preset tiny -o "$model"
fi
./build/vela gguf dump --no-tensors "$model"
./build/vela run -m "$model" -p "$prompt" -n 32
