#!/usr/bin/env python3
"""vela: the compiled facts of every CUDA kernel for sm_90.

Compiles each cuda/*.cu for sm_90 exactly as the vela_cuda target does
(nvcc -O3 -DNDEBUG -std=c++17 --expt-relaxed-constexpr -lineinfo, include
the repository root) with `-Xptxas -v` and reads ptxas' report per kernel
instance: registers per thread, static shared memory, stack frame, spill
stores and loads. Writes them as JSON:

    {"nvcc": "...", "arch": "sm_90", "kernels": {
       "matvec_q8_kernel<(ggml_type)2, 1>": {"regs": 40, "smem_static": 0,
           "stack": 0, "spill_stores": 0, "spill_loads": 0, "file": "matvec_q8.cu"},
       ...}}

Instance names are c++filt's, without the parameter list: the same names
the emulator's traffic records carry (addr2line of the emulated kernel),
so bench/kernels/emu_report.py can join them.

usage: sm90_resources.py CUDA_DIR OUT.json [NVCC]
Takes about 3 minutes on 2 cores (every .cu compiled once, in parallel 2).
"""
import concurrent.futures
import glob
import json
import os
import re
import subprocess
import sys


def demangle(names):
    out = subprocess.run(['c++filt'], input='\n'.join(names), capture_output=True, text=True,
                         check=True).stdout.splitlines()
    return dict(zip(names, out))


def strip_params(name):
    """'void k<(ggml_type)2, 1>(mvq_args)' -> 'k<(ggml_type)2, 1>'."""
    if name.startswith('void '):
        name = name[5:]
    depth, out = 0, ''
    for c in name:
        if c == '(' and depth == 0:
            break
        depth += c == '<'
        depth -= c == '>'
        out += c
    return out.strip()


def compile_one(nvcc, root, path):
    cmd = [nvcc, '-arch=sm_90', '-O3', '-DNDEBUG', '-std=c++17', '--expt-relaxed-constexpr',
           '-lineinfo', '-I', root, '-Xptxas', '-v', '-c', path, '-o', os.devnull]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit('%s failed:\n%s' % (' '.join(cmd), r.stderr))
    return os.path.basename(path), r.stderr


def parse(text):
    """{mangled: {...}} from ptxas -v output (entry functions only)."""
    kernels, cur = {}, None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '(\w+)' for 'sm_90'", line)
        if m:
            cur = kernels.setdefault(m.group(1), {})
            continue
        m = re.search(r'Function properties for (\w+)', line)
        if m:
            cur = kernels.get(m.group(1))
            continue
        if cur is None:
            continue
        m = re.search(r'(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads',
                      line)
        if m:
            cur['stack'], cur['spill_stores'], cur['spill_loads'] = map(int, m.groups())
        m = re.search(r'Used (\d+) registers', line)
        if m:
            cur['regs'] = int(m.group(1))
            s = re.search(r'(\d+) bytes smem', line)
            cur['smem_static'] = int(s.group(1)) if s else 0
    return kernels


def main():
    if len(sys.argv) not in (3, 4):
        raise SystemExit(__doc__)
    cuda_dir, out_path = sys.argv[1], sys.argv[2]
    nvcc = sys.argv[3] if len(sys.argv) == 4 else 'nvcc'
    root = os.path.dirname(os.path.abspath(cuda_dir))
    srcs = sorted(glob.glob(os.path.join(cuda_dir, '*.cu')))
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        results = list(ex.map(lambda p: compile_one(nvcc, root, p), srcs))
    kernels = {}
    for fname, text in results:
        for mangled, facts in parse(text).items():
            if 'regs' in facts:
                kernels[mangled] = dict(facts, file=fname)
    names = demangle(list(kernels))
    version = subprocess.run([nvcc, '--version'], capture_output=True, text=True).stdout
    release = re.search(r'release [^\n]*', version)
    doc = {
        'source': 'ptxas -v (nvcc -arch=sm_90 -O3, the vela_cuda flags), '
                  'bench/kernels/sm90_resources.py',
        'nvcc': release.group(0) if release else 'unknown',
        'arch': 'sm_90',
        'kernels': {strip_params(names[m]): kernels[m] for m in sorted(kernels, key=names.get)},
    }
    with open(out_path, 'w', encoding='utf-8') as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write('\n')
    print('%d kernel instances -> %s' % (len(kernels), out_path))


if __name__ == '__main__':
    main()
