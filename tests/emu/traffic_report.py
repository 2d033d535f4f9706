#!/usr/bin/env python3
"""vela CUDA emulator (tests/emu): the emulated memory-traffic report.

Reads the JSON lines the emulator appends to $VELA_EMU_TRAFFIC (one object
per kernel launch, tests/emu/emu_check.cpp) and writes one row per kernel and
launch shape (launches of the same kernel, grid, block and shared memory are
summed): a quick look at any program's traffic, e.g. the op tests' (cmake
target emu_traffic_tests). The report at model shapes, per op call and with
the compiled facts, is bench/kernels/emu_report.py's
(bench/results/kernels-emulated.json).

    kernel       the kernel's name without template arguments
    type         the instance's template arguments ("" if none), as the
                 compiler names them (enums as "(ggml_type)12"): weight and
                 element types, tile sizes, modes
    shape        "grid X,Y,Z block X,Y,Z"
    launches     how many launches the row sums
    bytes_moved  32 x the sectors of every request (each warp instruction's
                 distinct 32-byte sectors; no cache reuse between requests)
    bytes_necessary
                 32 x the distinct sectors of each launch (each needed sector
                 once: perfect caching)
    sectors_per_request, ideal_sectors_per_request
                 averages over the requests (ideal: the bytes the lanes asked
                 for, each distinct byte once, in whole sectors: what a
                 perfectly coalesced access needs)
    regs         null: the emulator does not know the register count
    smem         dynamic + static shared bytes per block (static: the span of
                 the static shared bytes the launch touched)
    occupancy    resident threads per SM / 2048, from threads and shared
                 memory only (H200: 2048 threads, 32 blocks, 228 KiB per SM;
                 registers not counted, so an upper bound)

usage: traffic_report.py TRAFFIC.jsonl OUT.json [CUDA_DIR GGUF_TYPES_H]

With CUDA_DIR (cuda/) and GGUF_TYPES_H (gguf/types.h), a kernel template
parameter declared `int T` (vela's convention for the weight type) is named
by its ggml type: "Q4_K, 8" instead of "12, 8".
"""
import glob
import json
import os
import re
import sys

SM_THREADS, SM_BLOCKS, SM_SMEM = 2048, 32, 233472


def occupancy(threads, smem):
    blocks = min(SM_THREADS // threads, SM_BLOCKS)
    if smem:
        blocks = min(blocks, SM_SMEM // smem)
    return round(blocks * threads / SM_THREADS, 3)


def ggml_names(types_h):
    """{12: 'Q4_K', ...} from enum ggml_type."""
    with open(types_h, encoding='utf-8') as f:
        return {int(v): n for n, v in re.findall(r'GGML_TYPE_(\w+)\s*=\s*(\d+)', f.read())
                if n != 'COUNT'}


def type_params(cuda_dir):
    """{kernel: [True if its i-th template parameter is `int T`]} from the sources."""
    out = {}
    for path in glob.glob(os.path.join(cuda_dir, '*.cu')):
        with open(path, encoding='utf-8') as f:
            src = f.read()
        for m in re.finditer(r'template\s*<([^<>]*)>\s*__global__', src):
            k = re.search(r'(\w+_kernel)\s*\(', src[m.end():m.end() + 400])
            if k:
                out[k.group(1)] = [p.split() == ['int', 'T'] for p in m.group(1).split(',')]
    return out


def name_types(kernel, targs, params, names):
    if kernel not in params:
        return targs
    args = [a.strip() for a in targs.split(',')] if targs else []
    for i, a in enumerate(args):
        if i < len(params[kernel]) and params[kernel][i] and a.lstrip('-').isdigit():
            args[i] = names.get(int(a), a)
    return ', '.join(args)


def main():
    if len(sys.argv) not in (3, 5):
        raise SystemExit(__doc__)
    params, names = ({}, {}) if len(sys.argv) == 3 else (type_params(sys.argv[3]),
                                                          ggml_names(sys.argv[4]))
    rows = {}
    with open(sys.argv[1], encoding='utf-8') as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            name = r['instance'] or r['kernel']
            if name.startswith('void '):  # addr2line names a template's return type
                name = name[5:]
            base, _, targs = name.partition('<')
            smem = r['smem_dynamic'] + r['smem_static']
            key = (name, tuple(r['grid']), tuple(r['block']), smem)
            row = rows.setdefault(key, {
                'kernel': base.strip(),
                'type': name_types(base.strip(), targs[:-1].strip(), params, names)
                        if targs.endswith('>') else '',
                'shape': 'grid %d,%d,%d block %d,%d,%d' % (tuple(r['grid']) + tuple(r['block'])),
                'launches': 0, 'requests': 0, 'sectors': 0, 'ideal': 0, 'distinct': 0,
                'smem': smem,
                'threads': r['block'][0] * r['block'][1] * r['block'][2],
            })
            row['launches'] += 1
            for d in ('loads', 'stores'):
                row['requests'] += r[d]['requests']
                row['sectors'] += r[d]['sectors']
                row['ideal'] += r[d]['ideal_sectors']
            row['distinct'] += r['distinct_sectors']
    out = []
    for row in rows.values():
        req = max(row['requests'], 1)
        out.append({
            'kernel': row['kernel'],
            'type': row['type'],
            'shape': row['shape'],
            'launches': row['launches'],
            'bytes_moved': 32 * row['sectors'],
            'bytes_necessary': 32 * row['distinct'],
            'sectors_per_request': round(row['sectors'] / req, 3),
            'ideal_sectors_per_request': round(row['ideal'] / req, 3),
            'regs': None,
            'smem': row['smem'],
            'occupancy': occupancy(row['threads'], row['smem']),
        })
    out.sort(key=lambda r: (r['kernel'], r['type'], r['shape']))
    doc = {
        'source': 'vela CUDA emulator (tests/emu), VELA_EMU_TRAFFIC: counted, not timed',
        'device_model': 'H200-like: 32-byte sectors, 2048 threads / 32 blocks / 228 KiB per SM',
        'rows': out,
    }
    with open(sys.argv[2], 'w', encoding='utf-8') as f:
        json.dump(doc, f, indent=1)
        f.write('\n')


if __name__ == '__main__':
    main()
