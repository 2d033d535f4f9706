#!/usr/bin/env bash
# The main job: install what is missing, build the vela command (not the
# tests), fetch the default model
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
# Only the vela command: the tests build their own targets (bash tests/run.sh).
if [ ! -x build/vela ]; then
  if command -v nvcc >/dev/null; then
    echo "quickstart: building vela with its CUDA kernels for this machine's GPU" \
      "(sm_90 where none is seen): about 8 minutes on 2 cores, 2 on 16; later runs take seconds" >&2
  else
    echo "quickstart: building vela (no CUDA toolkit: the CPU backend only): about a minute" >&2
  fi
fi
cmake --build build -j "$(nproc)" --target vela

# What to try next, once the answer is printed.
next_steps() {
  echo "quickstart: next: build/vela chat -m $1                 (an interactive chat)" >&2
  echo "quickstart:       build/vela serve -m $1 --port 8080    (OpenAI API, docs/serving.md)" >&2
}

if [ $# -ge 1 ] && [[ "$1" == *.gguf ]]; then
  model=$1
  prompt=${2:-"Once upon a time"}
  ./build/vela gguf dump --no-tensors "$model"
  ./build/vela run -m "$model" -p "$prompt" -n 64
  next_steps "$model"
  exit 0
fi

question=${1:-"In one sentence: why is the sky blue?"}
if model=$(bash tools/model_cache.sh); then
  echo "quickstart: asking $model: $question" >&2
  ./build/vela run -m "$model" --chat -p "$question" -n 128 --temp 0
  next_steps "$model"
else
  model=build/tiny.gguf
  echo "quickstart: the default model could not be fetched (no network?): running the" \
    "synthetic model $model instead: random weights, so its text is meaningless" >&2
  [ -f "$model" ] || ./build/vela mkmodel --preset tiny -o "$model"
  ./build/vela run -m "$model" --chat -p "$question" -n 32
  next_steps "$model"
fi
