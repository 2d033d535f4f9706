#!/usr/bin/env python3
"""vela: the emulated kernel traffic report and its CI gate (issue #14).

vela-bench-kernels-emu (bench/kernels/bench_kernels.c built against the CUDA
emulator, tests/emu) runs every case of the benchmark once, untimed, with the
emulator recording each launch's global loads and stores (VELA_EMU_TRAFFIC,
tests/emu/README.md "Traffic") labelled with the case. This script runs it,
folds the records into one row per case (one op call: one or more kernel
launches), adds the compiled facts of each kernel for sm_90 (ptxas:
bench/results/kernels-sm90-resources.json, from sm90_resources.py) and the
sm_90 occupancy rules, and writes

  report   bench/results/kernels-emulated.json and its tables in
           bench/results/kernels-emulated.md (how to read them:
           bench/README.md, "Emulated traffic"): Llama-2-7B and Llama-3-8B
           shapes, decode and prefill, and the bandwidth ceiling of the
           decode step per model and quant;
  gate     the small version (the ci-small shapes) compared with committed
           figures (bench/results/kernels-emulated-ci.json): exit 1 when a
           case's bytes_moved / bytes_necessary (device memory) or
           bytes_requested / bytes_necessary (what its warps ask of L1/L2:
           coalescing and re-reads) got more than --tolerance (5%) worse, or
           a case is gone. Not sectors_per_request: fewer, wider coalesced
           loads raise it, and strided loads split into more requests can
           lower it;
  fold     a traffic file already recorded -> a report (no run).

Rows (kernels-emulated.json "rows"):
  kernel        the op's kernels, in launch order ("quantize_q8_1_kernel +
                matvec_q8_kernel")
  family, model, shape, type, act, path, n_tok, n_ctx: the bench case
  bytes_moved   what the op moves to and from device memory: per launch,
                32 x (the distinct 32-byte sectors it loads + those it
                stores). A sector re-read inside one launch (the activation
                vector every block of a mat-vec reads, a K/V tile two blocks
                share) comes from L2 and is counted once; nothing is kept
                across launches, so an op's intermediates (the q8_1
                activations, attention's split-K partials) count when written
                and again when read. Whole sectors: a kernel that touches 4
                bytes of a sector moves 32.
  bytes_necessary  what the op must read and write at least: every input
                once, every output once (weights once, the activations, K/V
                of the visible cells once), from bench_kernels.c
  ratio         bytes_moved / bytes_necessary
  bytes_requested  32 x the sectors of every warp request (each request's
                distinct sectors, no reuse between requests): what the
                load/store units ask of L1/L2
  sectors_per_request, ideal_sectors_per_request: over all the op's requests;
                ideal: each request's distinct requested bytes in whole
                sectors (what a perfectly coalesced access needs)
  regs, smem, spills, occupancy, limiter: the op's main kernel (the one that
                moves the most bytes) on sm_90: registers per thread, static
                (ptxas) + dynamic (launch) shared bytes per block, spill
                stores + loads in bytes, theoretical occupancy (resident warps
                / 64) and what limits it
  sampled       "" when every block ran; else "N of M blocks" per sampled
                kernel: the emulator ran N evenly spaced blocks of M
                (VELA_EMU_SAMPLE_BLOCKS) and every count of that launch is
                scaled by M / N (homogeneous grids: each block does the same
                work on other rows / cells; the last block's tail is
                extrapolated)
  kernels[]     per launch: kernel, instance type, grid, block, the figures
                above per kernel
"""
import argparse
import datetime
import json
import math
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# --- sm_90 occupancy (CUDA occupancy calculator, compute capability 9.0) ---------------
SM90 = {'regs': 65536, 'warps': 64, 'blocks': 32, 'smem': 233472, 'smem_reserved': 1024,
        'reg_unit': 256, 'max_regs': 255}

# --- the decode step and the bandwidth ceiling -----------------------------------------
PEAK_BW = {'H100 SXM': 3.35e12, 'H200': 4.8e12}  # bytes/s (NVIDIA's data sheets)
MODELS = {'llama2-7b': ('Llama-2-7B', 32), 'llama3-8b': ('Llama-3-8B', 32)}
# The output head's type in llama.cpp's files of each ftype (llama_model_quantize:
# Q6_K for the 2- to 6-bit files, Q8_0 for Q8_0, F16 for F16; tools/mkmodel/ftype.c).
OUTPUT_TYPE = {'q4_0': 'q6_K', 'q4_K': 'q6_K', 'q5_K': 'q6_K', 'q6_K': 'q6_K', 'q8_0': 'q8_0',
               'f16': 'f16', 'q2_K': 'q6_K', 'q3_K': 'q6_K', 'iq4_nl': 'q6_K', 'iq4_xs': 'q6_K'}
QUANTS = ['q4_0', 'q4_K', 'q5_K', 'q6_K', 'q8_0', 'f16', 'q2_K', 'q3_K', 'iq4_nl', 'iq4_xs']
DECODE_CTX = [128, 4096, 32768]
# llama.cpp's published llama-bench tg128 on an H100 (t/s), per (model, quant):
# none found (see bench/README.md, "Emulated traffic"); null until one is cited.
LLAMACPP_H100 = {}

# Families on the decode path (the targets apply to these).
DECODE_FAMILIES = {'matvec', 'matvec_qkv', 'matvec_swiglu', 'matvec_add', 'attn_decode',
                   'rope_kv_store', 'rms_norm', 'argmax', 'sample'}
TARGET_RATIO, TARGET_SECTORS, TARGET_OCC = 1.03, 1.10, 0.5

# --- what the report and the gate run -------------------------------------------------
FULL_TYPES = ','.join(QUANTS)
FULL_RUNS = [
    # decode mat-vecs: every layer shape and the output head, one token, q8
    # activations (the CUDA default; F16 takes f32 activations)
    ('matvec,matvec_qkv,matvec_swiglu,matvec_add',
     ['--types', FULL_TYPES, '--matvec-tok', '1', '--matvec-act', 'q8'], 64),
    ('attn_decode', ['--ctx', ','.join(map(str, DECODE_CTX))], 64),
    # prefill at 128 tokens: a 128-token prompt's attention (every block: K/V
    # tiles are shared by some blocks of a head, not all), the tensor-core GEMM
    ('attn_prefill', ['--ctx', '128', '--prefill-tokens', '128'], 0),
    ('matmul_tc', ['--types', 'q4_0,q4_K,q5_K,q6_K,q8_0', '--tc-tok', '128', '--tc-path', 'fused'],
     8),
    ('rope_kv_store,rms_norm,argmax,sample', ['--prefill-tokens', '128'], 64),
]
CI_RUNS = [
    ('matvec,matvec_qkv,matvec_swiglu,matvec_add',
     ['--types', FULL_TYPES, '--matvec-tok', '1', '--matvec-act', 'q8'], 16),
    ('attn_decode', ['--ctx', '4096'], 16),
    ('attn_prefill', ['--ctx', '128', '--prefill-tokens', '128'], 0),
    ('matmul_tc', ['--types', 'q4_0,q4_K,q6_K', '--tc-tok', '128', '--tc-path', 'fused'], 2),
    ('rope_kv_store,rms_norm,argmax,sample', ['--prefill-tokens', '128'], 16),
]


def run_bench(bench, runs, models, traffic):
    """Runs the emulated bench once per entry of runs, appending to traffic."""
    if os.path.exists(traffic):
        os.remove(traffic)
    for families, args, sample in runs:
        env = dict(os.environ, VELA_EMU_TRAFFIC=traffic)
        env.pop('VELA_EMU_SAMPLE_BLOCKS', None)
        if sample:  # else every block runs (and initcheck stays on)
            env['VELA_EMU_SAMPLE_BLOCKS'] = str(sample)
        cmd = [bench, '--models', models, '--filter', families] + args
        t0 = time.time()
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        sys.stderr.write('%-50s %6.1f s\n' % (families, time.time() - t0))
        if r.returncode:
            sys.stderr.write(r.stdout[-4000:] + r.stderr[-4000:])
            raise SystemExit('%s failed (exit %d)' % (' '.join(cmd), r.returncode))


# --- folding ---------------------------------------------------------------------------

def norm_instance(name):
    """One spelling for the emulator's and ptxas' instance names."""
    if name.startswith('void '):
        name = name[5:]
    name = re.sub(r'\((?:enum )?\w+\)(?=-?\d)', '', name)  # (ggml_type)12 -> 12
    return name.replace(' ', '')


def occupancy(threads, regs, smem):
    """(fraction of 64 warps, limiter) on sm_90."""
    warps = -(-threads // 32)
    limits = {'threads': SM90['warps'] // warps, 'blocks': SM90['blocks']}
    if regs:
        per_warp = -(-regs * 32 // SM90['reg_unit']) * SM90['reg_unit']
        limits['registers'] = (SM90['regs'] // per_warp) // warps
    limits['shared memory'] = SM90['smem'] // (smem + SM90['smem_reserved'])
    blocks = min(limits.values())
    limiter = min(limits, key=lambda k: (limits[k], k != 'threads'))
    return round(blocks * warps / SM90['warps'], 3), limiter


def load_resources(path):
    if not path or not os.path.exists(path):
        return {}, None
    with open(path, encoding='utf-8') as f:
        doc = json.load(f)
    return {norm_instance(k): v for k, v in doc['kernels'].items()}, doc


def read_cases(traffic, extra=None):
    """The launch records of a traffic file grouped by their case label, in
    order of appearance: [(case + extra, [records])]."""
    cases = {}
    with open(traffic, encoding='utf-8') as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            case = r.get('case')
            if not case:
                continue
            case = dict(case, **(extra or {}))
            cases.setdefault(json.dumps(case, sort_keys=True), (case, []))[1].append(r)
    return list(cases.values())


def fold(traffic, resources):
    return [fold_case(case, launches, resources) for case, launches in read_cases(traffic)]


def fold_launch(r, resources):
    name = r['instance'] or r['kernel']
    if name.startswith('void '):
        name = name[5:]
    base, _, targs = name.partition('<')
    scale = r['blocks_total'] / max(r['blocks_run'], 1)
    req = (r['loads']['requests'] + r['stores']['requests']) * scale
    sectors = (r['loads']['sectors'] + r['stores']['sectors']) * scale
    ideal = (r['loads']['ideal_sectors'] + r['stores']['ideal_sectors']) * scale
    # sectors one block touched scale with the grid; shared ones are counted once
    shared = r['shared_load_sectors'] + r['shared_store_sectors']
    distinct = shared + (r['distinct_load_sectors'] + r['distinct_store_sectors'] - shared) * scale
    threads = r['block'][0] * r['block'][1] * r['block'][2]
    res = resources.get(norm_instance(name))
    regs = res['regs'] if res else None
    smem = r['smem_dynamic'] + (res['smem_static'] if res else r['smem_static'])
    occ, limiter = occupancy(threads, regs, smem)
    return {
        'kernel': base.strip(),
        'type': targs[:-1].strip() if targs.endswith('>') else '',
        'grid': r['grid'], 'block': r['block'],
        'sampled': '' if r['blocks_run'] == r['blocks_total'] else
                   '%d of %d blocks' % (r['blocks_run'], r['blocks_total']),
        'requests': req, 'sectors': sectors, 'ideal': ideal, 'distinct': distinct,
        'bytes_moved': round(32 * distinct), 'bytes_requested': round(32 * sectors),
        'sectors_per_request': round(sectors / req, 3) if req else 0,
        'regs': regs, 'smem': smem,
        'spills': res['spill_stores'] + res['spill_loads'] if res else None,
        'occupancy': occ if res else None, 'limiter': limiter if res else None,
        'occupancy_no_regs': occ,
    }


def fold_case(case, launches, resources):
    ks = [fold_launch(r, resources) for r in launches]
    req = sum(k['requests'] for k in ks)
    sectors = sum(k['sectors'] for k in ks)
    main = max(ks, key=lambda k: k['bytes_moved'])
    moved = round(32 * sum(k['distinct'] for k in ks))
    names = []
    for k in ks:
        if k['kernel'] not in names:
            names.append(k['kernel'])
    need = case['bytes_necessary']
    row = {
        'kernel': ' + '.join(names),
        'family': case['family'], 'model': case['model'], 'shape': case['shape'],
        'type': case['type'], 'act': case['act'], 'path': case['path'],
        'n_tok': case['n_tok'], 'n_ctx': case['n_ctx'],
        'bytes_moved': moved, 'bytes_necessary': need,
        'ratio': round(moved / need, 4) if need else None,
        'bytes_requested': round(32 * sectors),
        'sectors_per_request': round(sectors / req, 3) if req else 0,
        'ideal_sectors_per_request': round(sum(k['ideal'] for k in ks) / req, 3) if req else 0,
        'regs': main['regs'], 'smem': main['smem'], 'spills': main['spills'],
        'occupancy': main['occupancy'], 'limiter': main['limiter'],
        'sampled': '; '.join('%s: %s' % (k['kernel'], k['sampled']) for k in ks if k['sampled']),
        'kernels': [{x: k[x] for x in ('kernel', 'type', 'grid', 'block', 'sampled', 'bytes_moved',
                                       'bytes_requested', 'sectors_per_request', 'regs', 'smem', 'spills',
                                       'occupancy', 'limiter')} for k in ks],
    }
    return row


# --- the decode step -------------------------------------------------------------------

def find(rows, model, family, type_=None, shape=None, n_tok=None, n_ctx=None):
    for r in rows:
        if (r['model'] == model and r['family'] == family and
                (type_ is None or r['type'] == type_) and
                (shape is None or r['shape'].startswith(shape)) and
                (n_tok is None or r['n_tok'] == n_tok) and (n_ctx is None or r['n_ctx'] == n_ctx)):
            return r
    return None


def decode_parts_handed(rows, model, quant, ctx):
    """The op calls of one decode token as [(calls, row, handed)], or None if
    a case is missing.

    Per layer, as host/forward/forward.c runs it: attn_norm, Q/K/V in one
    mat-vec, RoPE + K/V store, attention over ctx cells, attn_output with the
    residual add, ffn_norm, gate/up + SwiGLU, ffn_down with the residual add;
    then the output norm, the output head and argmax (greedy). The token's
    embedding row (a few KiB) is left out.

    handed: the forward hands this mat-vec its q8_1 activations from the op
    before (rms_norm_q8 before Q/K/V, gate/up and the output head; the
    attention's q8_1 output before attn_output), so the quantize launch its
    bench row records does not run in a decode step; ffn_down quantizes the
    SwiGLU output itself.
    """
    n_layer = MODELS[model][1]
    out_t = OUTPUT_TYPE[quant]
    parts = [
        (n_layer * 2, find(rows, model, 'rms_norm', n_tok=1), False),
        (n_layer, find(rows, model, 'matvec_qkv', quant, n_tok=1), True),
        (n_layer, find(rows, model, 'rope_kv_store', n_tok=1), False),
        (n_layer, find(rows, model, 'attn_decode', n_ctx=ctx), False),
        (n_layer, find(rows, model, 'matvec_add', quant, shape='add 4096x4096'), True),
        (n_layer, find(rows, model, 'matvec_swiglu', quant, n_tok=1), True),
        (n_layer, find(rows, model, 'matvec_add', quant, shape='add 1'), False),  # n_ff x n_embd
        (1, find(rows, model, 'rms_norm', n_tok=1), False),
        (1, find(rows, model, 'matvec', out_t, shape='output', n_tok=1), True),
        (1, find(rows, model, 'argmax', n_tok=1), False),
    ]
    return None if any(r is None for _, r, _ in parts) else parts


def decode_parts(rows, model, quant, ctx):
    """decode_parts_handed's op calls as [(calls, row)]."""
    parts = decode_parts_handed(rows, model, quant, ctx)
    return None if parts is None else [(n, r) for n, r, _ in parts]


def decode_step(rows, model, quant, ctx):
    """Bytes one decode token moves (moved, necessary), or None if a case is
    missing (decode_parts)."""
    parts = decode_parts(rows, model, quant, ctx)
    if not parts:
        return None
    return (sum(n * r['bytes_moved'] for n, r in parts),
            sum(n * r['bytes_necessary'] for n, r in parts))


def ceilings(rows):
    out = []
    for model in MODELS:
        for quant in QUANTS:
            for ctx in DECODE_CTX:
                step = decode_step(rows, model, quant, ctx)
                if not step:
                    continue
                moved, need = step
                row = {'model': model, 'quant': quant, 'output_type': OUTPUT_TYPE[quant],
                       'ctx': ctx, 'bytes_per_token': moved, 'bytes_necessary_per_token': need}
                for gpu, bw in PEAK_BW.items():
                    row['tps_ceiling_' + gpu.split()[0].lower()] = round(bw / moved, 1)
                row['llamacpp_h100_tps'] = LLAMACPP_H100.get((model, quant)) if ctx == 128 else None
                row['measured_h100_tps'] = None
                out.append(row)
    return out


# --- misses ----------------------------------------------------------------------------

def misses(rows):
    out = []
    for r in rows:
        if r['family'] not in DECODE_FAMILIES:
            continue
        why = []
        target_bytes = r['family'].startswith('matvec') or r['family'] == 'attn_decode'
        if target_bytes and r['ratio'] and r['ratio'] > TARGET_RATIO:
            why.append('bytes %.3fx necessary' % r['ratio'])
        if target_bytes and r['ideal_sectors_per_request'] and \
                r['sectors_per_request'] > TARGET_SECTORS * r['ideal_sectors_per_request']:
            why.append('sectors/request %.2f vs ideal %.2f' % (r['sectors_per_request'],
                                                             r['ideal_sectors_per_request']))
        for k in r['kernels']:
            if k['occupancy'] is not None and k['occupancy'] < TARGET_OCC:
                why.append('%s occupancy %.0f%% (%s)' % (k['kernel'], 100 * k['occupancy'],
                                                         k['limiter']))
        if why:
            out.append({'model': r['model'], 'family': r['family'], 'shape': r['shape'],
                        'type': r['type'], 'n_ctx': r['n_ctx'], 'kernel': r['kernel'],
                        'misses': sorted(set(why))})
    return out


# --- output ----------------------------------------------------------------------------

# The sources the report measures: a tree whose copies of these differ from
# HEAD is named "<commit>-dirty".
MEASURED_PATHS = ['cuda', 'tests/emu', 'bench/kernels', 'gguf', 'host', 'kv']


def git_commit():
    try:
        head = subprocess.run(['git', '-C', ROOT, 'rev-parse', '--short=12', 'HEAD'],
                              capture_output=True, text=True, check=True).stdout.strip()
        clean = subprocess.run(['git', '-C', ROOT, 'diff', '--quiet', 'HEAD', '--'] +
                               MEASURED_PATHS).returncode == 0
        return head if clean else head + '-dirty'
    except (OSError, subprocess.CalledProcessError):
        return 'unknown'


def mb(x):
    return '%.2f' % (x / 1e6) if x >= 1e4 else '%.4f' % (x / 1e6)


def fmt_occ(r):
    return '-' if r['occupancy'] is None else '%d%%' % round(100 * r['occupancy'])


def markdown(doc):
    L = []
    L.append('Generated by `bench/kernels/emu_report.py report` at %s (%s); %d cases, '
             'emulated in %s.' % (doc['commit'], doc['date'][:10], len(doc['rows']),
                                  doc.get('elapsed', '?')))
    L.append('')
    L.append('**Bandwidth ceiling of the decode step** (one token, greedy: bytes moved per '
             'token / peak bandwidth; every layer matrix in the quant, output head as in '
             "llama.cpp's files of that ftype):")
    L.append('')
    L.append('| model | quant | output | ctx | MB/token | necessary | H100 SXM t/s | H200 t/s | '
             'llama.cpp H100 tg128 | measured H100 |')
    L.append('|---|---|---|---:|---:|---:|---:|---:|---:|---:|')
    for c in doc['ceilings']:
        L.append('| %s | %s | %s | %d | %.1f | %.1f | %.1f | %.1f | %s | %s |' % (
            MODELS[c['model']][0], c['quant'], c['output_type'], c['ctx'],
            c['bytes_per_token'] / 1e6, c['bytes_necessary_per_token'] / 1e6,
            c['tps_ceiling_h100'], c['tps_ceiling_h200'],
            c['llamacpp_h100_tps'] if c['llamacpp_h100_tps'] else '-',
            c['measured_h100_tps'] if c['measured_h100_tps'] else ''))
    L.append('')
    L.append('**Decode-path cases that miss a target** (bytes ≤ 1.03× necessary and sectors/'
             'request ≤ 1.1× ideal for mat-vecs and decode attention; occupancy ≥ 50% for every '
             'decode-path kernel):')
    L.append('')
    if not doc['misses']:
        L.append('none.')
    else:
        L.append('| model | case | type | kernel | misses |')
        L.append('|---|---|---|---|---|')
        for m in doc['misses']:
            L.append('| %s | %s %s%s | %s | %s | %s |' % (
                m['model'], m['family'], m['shape'], ' ctx %d' % m['n_ctx'] if m['n_ctx'] else '',
                m['type'], m['kernel'], '; '.join(m['misses'])))
    L.append('')
    L.append('**Every case** (MB = 10^6 bytes; occupancy on sm_90 from ptxas registers, '
             'shared memory and threads; sampled: blocks emulated of the grid):')
    L.append('')
    L.append('| model | family | shape | type | tok | ctx | kernel | MB moved | MB necessary | '
             'ratio | sect/req | ideal | regs | smem | occ | sampled |')
    L.append('|---|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|')
    for r in doc['rows']:
        L.append('| %s | %s | %s | %s | %d | %d | %s | %s | %s | %s | %.2f | %.2f | %s | %d | %s '
                 '| %s |' % (
                     r['model'], r['family'], r['shape'], r['type'], r['n_tok'], r['n_ctx'],
                     r['kernel'].replace('_kernel', ''), mb(r['bytes_moved']),
                     mb(r['bytes_necessary']), '%.3f' % r['ratio'] if r['ratio'] else '-',
                     r['sectors_per_request'], r['ideal_sectors_per_request'],
                     r['regs'] if r['regs'] is not None else '-', r['smem'], fmt_occ(r),
                     r['sampled'].replace('_kernel', '') or 'all'))
    return '\n'.join(L) + '\n'


BEGIN, END = '<!-- emu-report:begin -->', '<!-- emu-report:end -->'


def write_readme(path, text, begin=BEGIN, end=END):
    """Replaces what lies between the markers begin and end in path."""
    with open(path, encoding='utf-8') as f:
        src = f.read()
    if begin not in src or end not in src:
        raise SystemExit('%s has no %s ... %s block' % (path, begin, end))
    head, rest = src.split(begin, 1)
    _, tail = rest.split(end, 1)
    with open(path, 'w', encoding='utf-8') as f:
        f.write(head + begin + '\n' + text + end + tail)


def make_doc(rows, res_doc, elapsed=None):
    doc = {
        'commit': git_commit(),
        'date': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ'),
        'source': 'vela CUDA emulator (tests/emu) running bench/kernels/bench_kernels.c '
                  '(vela-bench-kernels-emu), VELA_EMU_TRAFFIC: counted, not timed',
        'device_model': '32-byte sectors, no caches (each warp request moves its distinct '
                        'sectors); occupancy: sm_90 (65536 registers, 64 warps, 32 blocks, '
                        '228 KiB shared memory per SM, 1 KiB reserved per block, registers '
                        'allocated per warp in units of 256)',
        'resources': res_doc['source'] + ', ' + res_doc['nvcc'] if res_doc else None,
        'peak_bandwidth': PEAK_BW,
        'targets': {'ratio': TARGET_RATIO, 'sectors_vs_ideal': TARGET_SECTORS,
                    'occupancy': TARGET_OCC},
    }
    if elapsed:
        doc['elapsed'] = elapsed
    doc['rows'] = rows
    doc['ceilings'] = ceilings(rows)
    doc['misses'] = misses(rows)
    return doc


def write_json(path, doc):
    with open(path, 'w', encoding='utf-8') as f:
        json.dump(doc, f, indent=1)
        f.write('\n')


# --- the gate --------------------------------------------------------------------------

def case_key(r):
    return '%s | %s | %s | %s | %s | tok %d ctx %d' % (r['model'], r['family'], r['shape'],
                                                        r['type'], r['path'], r['n_tok'],
                                                        r['n_ctx'])


def requested_ratio(r):
    """bytes_requested / bytes_necessary: the L1/L2 request volume per necessary byte."""
    return r['bytes_requested'] / r['bytes_necessary'] if r['bytes_necessary'] else 0.0


def compare(rows, ref_rows, tolerance, doctor=None):
    """Prints the comparison; returns the number of failures."""
    ref = {case_key(r): r for r in ref_rows}
    new = {case_key(r): r for r in rows}
    fails = 0
    print('| case | bytes ref | bytes now | requested ref | requested now | |')
    print('|---|---:|---:|---:|---:|---|')
    for k, rr in ref.items():
        ratio_ref, req_ref = rr['ratio'], requested_ratio(rr)
        if doctor:
            ratio_ref, req_ref = ratio_ref * doctor, req_ref * doctor
        r = new.get(k)
        if r is None:
            print('| %s | %.4f | - | %.3f | - | FAIL: case gone |' % (k, ratio_ref, req_ref))
            fails += 1
            continue
        bad = []
        if r['ratio'] > ratio_ref * (1 + tolerance):
            bad.append('bytes')
        if requested_ratio(r) > req_ref * (1 + tolerance):
            bad.append('requested')
        fails += bool(bad)
        print('| %s | %.4f | %.4f | %.3f | %.3f | %s |' % (
            k, ratio_ref, r['ratio'], req_ref, requested_ratio(r),
            'FAIL: %s > %d%% worse' % (' and '.join(bad), round(100 * tolerance)) if bad
            else 'ok'))
    for k in new:
        if k not in ref:
            print('| %s | - | %.4f | - | %.3f | new (not in the reference) |' % (
                k, new[k]['ratio'], requested_ratio(new[k])))
    print('\n%d of %d reference cases worse by more than %d%% or gone' % (
        fails, len(ref), round(100 * tolerance)))
    print('(bytes: bytes_moved / bytes_necessary; requested: bytes_requested / '
          'bytes_necessary)')
    return fails


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    sub = ap.add_subparsers(dest='cmd', required=True)
    p = sub.add_parser('report', help='the full report (Llama-2-7B, Llama-3-8B)')
    p.add_argument('--bench', required=True, help='vela-bench-kernels-emu')
    p.add_argument('--traffic', default='traffic-report.jsonl')
    p.add_argument('--resources', default=os.path.join(ROOT, 'bench/results/'
                                                       'kernels-sm90-resources.json'))
    p.add_argument('--out', default=os.path.join(ROOT, 'bench/results/kernels-emulated.json'))
    p.add_argument('--readme', default=os.path.join(ROOT, 'bench/results/kernels-emulated.md'))
    p = sub.add_parser('fold', help='a recorded traffic file -> report JSON (+ README tables)')
    p.add_argument('traffic')
    p.add_argument('--resources', default=os.path.join(ROOT, 'bench/results/'
                                                       'kernels-sm90-resources.json'))
    p.add_argument('--out', required=True)
    p.add_argument('--readme')
    p = sub.add_parser('gate', help='the CI gate: ci-small shapes against the reference')
    p.add_argument('--bench', help='vela-bench-kernels-emu (else --traffic must exist)')
    p.add_argument('--traffic', default='traffic-gate.jsonl')
    p.add_argument('--reference', default=os.path.join(ROOT, 'bench/results/'
                                                        'kernels-emulated-ci.json'))
    p.add_argument('--resources', default=os.path.join(ROOT, 'bench/results/'
                                                       'kernels-sm90-resources.json'))
    p.add_argument('--tolerance', type=float, default=0.05)
    p.add_argument('--update', action='store_true', help='write the reference instead')
    p.add_argument('--doctor', type=float,
                   help='self-check: multiply the reference figures by this (< 1: the gate '
                        'must fail)')
    p.add_argument('--expect-fail', action='store_true',
                   help='self-check: exit 0 only if every reference case fails')
    a = ap.parse_args()

    resources, res_doc = load_resources(a.resources)
    t0 = time.time()
    if a.cmd == 'report':
        run_bench(a.bench, FULL_RUNS, 'llama2-7b,llama3-8b', a.traffic)
    elif a.cmd == 'gate' and a.bench:
        run_bench(a.bench, CI_RUNS, 'ci-small', a.traffic)
    elapsed = '%.0f s' % (time.time() - t0)
    rows = fold(a.traffic, resources)
    if a.cmd in ('report', 'fold'):
        doc = make_doc(rows, res_doc, elapsed if a.cmd == 'report' else None)
        write_json(a.out, doc)
        if a.readme:
            write_readme(a.readme, markdown(doc))
        print('%d cases -> %s (%s)' % (len(rows), a.out, elapsed))
        return 0
    if a.update:
        doc = make_doc(rows, res_doc)
        doc = {k: doc[k] for k in ('commit', 'date', 'source', 'device_model', 'rows')}
        doc['rows'] = [{k: r[k] for k in ('kernel', 'family', 'model', 'shape', 'type', 'act',
                                          'path', 'n_tok', 'n_ctx', 'bytes_moved',
                                          'bytes_necessary', 'ratio', 'bytes_requested',
                                          'sectors_per_request', 'ideal_sectors_per_request',
                                          'sampled')}
                       for r in rows]
        write_json(a.reference, doc)
        print('%d cases -> %s' % (len(rows), a.reference))
        return 0
    with open(a.reference, encoding='utf-8') as f:
        ref = json.load(f)
    fails = compare(rows, ref['rows'], a.tolerance, a.doctor)
    if a.bench:
        print('emulated in %s' % elapsed)
    if a.expect_fail:
        ok = fails == len(ref['rows'])
        print('self-check: the gate %s every doctored case' % ('failed' if ok else 'did NOT fail'))
        return 0 if ok else 1
    return 1 if fails else 0


if __name__ == '__main__':
    sys.exit(main())
