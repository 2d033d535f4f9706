#!/usr/bin/env bash
# The main job: install what is missing, build vela, fetch the default model
# (SmolLM2-135M-Instruct, Q4_1, 92 MiB, once, into $VELA_CACHE or
# ~/.cache/vela) and ask it one question: a one-shot chat, formatted with the
# model's chat template, answered until the end of its turn. Nothing keeps
# running afterwards.
#   tools/quickstart.sh                       the default model, a default question
#   tools/quickstart.sh "Your question"       the default model, your question
#   tools/quickstart.sh MODEL.gguf [PROMPT]   your model, a plain prompt
# Without network access the default model cannot be fetched: the quickstart
# then says so and runs a synthetic model (random weights, meaningless text)
# so that every stage of the engine still runs.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
bash tools/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)"

if [ $# -ge 1 ] && [[ "$1" == *.gguf ]]; then
  model=$1
  prompt=${2:-"Once upon a time"}
  ./build/vela gguf dump --no-tensors "$model"
  ./build/vela run -m "$model" -p "$prompt" -n 64
  exit 0
fi

question=${1:-"In one sentence: why is the sky blue?"}
if model=$(bash tools/model_cache.sh); then
  echo "quickstart: asking $model: $question" >&2
  ./build/vela run -m "$model" --chat -p "$question" -n 128 --temp 0
else
  model=build/tiny.gguf
  echo "quickstart: the default model could not be fetched (no network?): running the" \
    "synthetic model $model instead: random weights, so its text is meaningless" >&2
  [ -f "$model" ] || ./build/vela mkmodel --preset tiny -o "$model"
  ./build/vela run -m "$model" --chat -p "$question" -n 32
fi
