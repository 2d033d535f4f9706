"""Compares vela's logits (raw float32, n_tokens x n_vocab) with a llama.cpp
reference subset (tests/data/llamacpp/README.md, "VLRM" files): for every
stored position, the error over the stored ids relative to the largest
|logit| there, and the top-1 id among them.
usage: compare_ref.py REF.ref LOGITS.f32"""
import array
import struct
import sys

# Relative to max |logit| of the row. vela's Q4_K_M logits equal its logits
# on the same weights dequantized to F32, bit for bit; llama.cpp on those F32
# weights differed by at most 2.3e-3 (RMS 1.6e-3) when the reference was
# made: float summation orders, amplified by Gemma's large activations and
# by the f16 rounding of GELU (a gate within float noise of an f16 boundary
# moves a whole f16 step). 1e-2 leaves room for other compilers; llama.cpp's
# own Q4_K_M run (activations quantized to 8 bits) is 0.09-0.4 away.
TOL_MAX = 1e-2


def main(ref_path, logits_path):
    with open(ref_path, "rb") as f:
        magic, ver, n_vocab, n_rows, n_ids = struct.unpack("<4sIIII", f.read(20))
        if magic != b"VLRM" or ver != 1:
            sys.exit(f"{ref_path}: not a VLRM v1 file")
        pos = struct.unpack(f"<{n_rows}I", f.read(4 * n_rows))
        ids = struct.unpack(f"<{n_ids}I", f.read(4 * n_ids))
        ref = array.array("f")
        ref.frombytes(f.read(4 * n_rows * n_ids))
    fails = 0
    with open(logits_path, "rb") as f:
        for r, p in enumerate(pos):
            f.seek(p * n_vocab * 4)
            row = array.array("f")
            row.frombytes(f.read(n_vocab * 4))
            want = ref[r * n_ids:(r + 1) * n_ids]
            got = [row[i] for i in ids]
            scale = max(abs(x) for x in want)
            err = max(abs(a - b) for a, b in zip(got, want)) / scale
            top_ref = ids[max(range(n_ids), key=lambda k: want[k])]
            top_got = ids[max(range(n_ids), key=lambda k: got[k])]
            ok = err <= TOL_MAX and top_ref == top_got
            fails += not ok
            print(f"position {p}: max |vela - llama.cpp| = {err:.3g} of max |logit| {scale:.3g} "
                  f"(tol {TOL_MAX:g}), top-1 {top_got} (llama.cpp {top_ref})"
                  f"{'' if ok else '  FAIL'}")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
