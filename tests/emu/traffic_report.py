#!/usr/bin/env python3
"""vela CUDA emulator (tests/emu): the emulated memory-traffic report.

Reads the JSON lines the emulator appends to $VELA_EMU_TRAFFIC (one object
per kernel launch, tests/emu/emu_check.cpp) and writes one row per kernel and
launch shape (launches of the same kernel, grid, block and shared memory are
summed):

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

usage: traffic_report.py TRAFFIC.jsonl OUT.json
"""
import json
import sys

SM_THREADS, SM_BLOCKS, SM_SMEM = 2048, 32, 233472


def occupancy(threads, smem):
    blocks = min(SM_THREADS // threads, SM_BLOCKS)
    if smem:
        blocks = min(blocks, SM_SMEM // smem)
    return round(blocks * threads / SM_THREADS, 3)


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
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
                'type': targs[:-1].strip() if targs.endswith('>') else '',
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
