#!/usr/bin/env python3
"""vela: the GPU performance model of the decode kernels (issue #27).

Predicts each kernel launch's time on an H200 without a GPU, from two things
this machine has: the sm_90 machine code the build makes (cuobjdump -sass of
build/CMakeFiles/vela_cuda.dir/cuda/*.cu.o, read by sass.py) and the
emulator's record of the same launch at model shapes (tests/emu,
VELA_EMU_TRAFFIC: grid, block, bytes, load requests by width), and says
what bounds it.

Per launch, for its average warp (sass.Warp: the path the emulator's loads
took, loops as often as its load requests allow):
  instr          warp-instructions issued
  gwaits         memory round trips: instructions that wait on a global load
  swaits         short waits (shared memory, shuffles, special functions)
  stall          the fixed stall cycles the compiler scheduled
  inflight       global bytes in flight at a round trip (memory-level
                 parallelism of one warp)
Per SM (sm_90: 132 SMs, 4 schedulers, occupancy from registers, shared
memory and threads as the CUDA occupancy calculator; cuobjdump -res-usage):
  resident warps, blocks per SM, waves.
Bounds (seconds):
  dram    bytes moved (the emulator's distinct sectors) / (peak x dram_eff)
  l2      bytes the warps request of L1/L2 (every request's sectors) / l2_tbs:
          activations re-read by every warp, uncoalesced loads
  issue   the busiest SM's warp-instructions / (4 schedulers x ipc x clock)
  latency waves x one warp's chain: (stall + gwaits x lat_global + swaits x
          lat_short) / clock; with resident warps W and bytes in flight per
          warp B this is Little's law: an SM moves W x B bytes per lat_global
  launch  t_launch per launch (the launch and the kernel's ramp, as timed by
          CUDA events around one op call)
  time = max(dram, l2, issue, latency) + launch; an op is the sum of its
  launches.
The six constants are fitted to measured rows (bench/results/kernels-h200.json:
`calibrate`), on one half of the rows and checked on the other.

What it cannot see: L2 hit rates (every distinct sector is a DRAM byte),
clock changes under load, contention between SMs for DRAM beyond the peak,
bank conflicts, the order warps are scheduled in, predicates (a predicated
load is half a request against the budget), and paths the emulator's load
widths cannot tell apart.

Commands:
  show     one .cu file, a kernel name or all: each instance's static figures,
           and each recorded launch's prediction (seconds, once built)
  record   runs the emulated bench (vela-bench-kernels-emu) for the report's
           cases and variants into traffic files
  report   bench/results/kernels-predicted.json + its tables, kernels-predicted.md
  calibrate  fits the constants on half the measured rows, checks the rest
  gate     CI: predicted fraction of bandwidth per decode case (ci-small
           shapes) against bench/results/kernels-predicted-ci.json; fails
           when one falls more than 5% below; --doctor serialises every
           global load of the machine code (each waited on at once) and
           must fail
"""
import argparse
import datetime
import glob
import hashlib
import json
import math
import os
import pickle
import re
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import emu_report  # noqa: E402  (occupancy rules, instance names, git commit)
import sass  # noqa: E402
from sm90_resources import strip_params  # noqa: E402

# --- the device ------------------------------------------------------------------------
H200 = {'name': 'NVIDIA H200', 'sms': 132, 'schedulers': 4, 'clock_hz': 1.98e9,
        'peak_bw': 4.8143e12}  # kernels-h200.json's device.peak_bw_gbs

# Fitted by `calibrate` on kernels-h200.json (the fit's rows and its check
# rows are in bench/results/kernels-predicted.json, "calibration").
PARAMS = {'lat_global': 200.0, 'lat_short': 15.0, 'ipc': 1.0, 'dram_eff': 0.85,
          't_launch_us': 4.5, 'l2_tbs': 9.0}

# vela-bench-kernels --matvec-q8's default (its plain rows): the one-pass kernel
MVQ_DEFAULT = 'pass'
DECODE_FAMILIES = {'matvec', 'matvec_qkv', 'matvec_swiglu', 'matvec_add', 'attn_decode',
                   'attn_se_decode', 'rope', 'rope_kv_store', 'rms_norm', 'argmax', 'sample'}
BUILD_OBJ = 'CMakeFiles/vela_cuda.dir/cuda'

# --- machine code ----------------------------------------------------------------------

# cuobjdump -sass runs nvdisasm: both, from the same release.
CUOBJDUMP_PIN = 'nvidia-cuda-cuobjdump==13.2.86 nvidia-cuda-nvdisasm==13.2.86'


def find_cuobjdump():
    """cuobjdump with an nvdisasm beside it or on PATH (-sass runs it): from
    PATH, the CUDA toolkit or the pinned PyPI packages in this Python's
    environment (bench/README.md, "Performance model"); None if none."""
    cands = [shutil.which('cuobjdump'), '/usr/local/cuda/bin/cuobjdump']
    cands += sorted(glob.glob(os.path.join(sys.prefix, 'lib/python3*/site-packages/nvidia/cu*/bin/'
                                                       'cuobjdump')))
    for c in cands:
        if c and os.access(c, os.X_OK) and (
                os.access(os.path.join(os.path.dirname(c), 'nvdisasm'), os.X_OK) or
                shutil.which('nvdisasm')):
            return c
    return None


def demangle(names):
    out = subprocess.run(['c++filt'], input='\n'.join(names), capture_output=True, text=True,
                         check=True).stdout.splitlines()
    return dict(zip(names, out))


def inst_key(name):
    """One spelling for an instance: 'matvec_q8_kernel<12,1>'."""
    return emu_report.norm_instance(strip_params(name))


def parse_res(text):
    """{mangled: {'regs', 'smem_static', 'stack'}} from cuobjdump -res-usage."""
    out, cur = {}, None
    for line in text.splitlines():
        m = re.match(r'\s*Function (\S+):', line)
        if m:
            cur = m.group(1)
            continue
        m = re.search(r'REG:(\d+) STACK:(\d+) SHARED:(\d+)', line)
        if m and cur:
            out[cur] = {'regs': int(m.group(1)), 'stack': int(m.group(2)),
                        'smem_static': int(m.group(3))}
            cur = None
    return out


def load_object(path, cuobjdump, cache_dir):
    """{instance key: {'ins', 'res', 'mangled', 'file'}} of one object or cubin
    (sm_90), cached by the file's content."""
    with open(path, 'rb') as f:
        digest = hashlib.sha1(f.read()).hexdigest()[:16]
    cache = os.path.join(cache_dir, 'sass-%s-%s.pickle' % (os.path.basename(path), digest))
    if os.path.exists(cache):
        with open(cache, 'rb') as f:
            return pickle.load(f)
    arch = [] if path.endswith('.cubin') else ['-arch', 'sm_90']
    # cuobjdump finds nvdisasm on PATH: the one beside it first (PyPI packages)
    env = dict(os.environ, PATH=os.path.dirname(cuobjdump) + os.pathsep +
               os.environ.get('PATH', ''))
    runs = []
    for what in ('-sass', '-res-usage'):
        r = subprocess.run([cuobjdump, what] + arch + [path], capture_output=True, text=True,
                           env=env)
        if r.returncode:
            raise SystemExit('perf_model: %s %s %s failed: %s' % (
                cuobjdump, what, path, r.stderr.strip()[-500:]))
        runs.append(r.stdout)
    text, res = runs[0], parse_res(runs[1])
    fns = sass.parse(text)
    names = demangle(list(fns))
    out = {}
    for m, ins in fns.items():
        if not ins:
            continue
        out[inst_key(names[m])] = {'ins': ins, 'res': res.get(m, {}), 'mangled': m,
                                   'file': os.path.basename(path).split('.')[0] + '.cu'}
    os.makedirs(cache_dir, exist_ok=True)
    with open(cache, 'wb') as f:
        pickle.dump(out, f)
    return out


def load_code(objs, cuobjdump, cache_dir):
    code = {}
    for p in objs:
        code.update(load_object(p, cuobjdump, cache_dir))
    return code


def doctor(code):
    """The same machine code with every global load waited on by the next
    instruction (a load moved next to its use): the gate's self-check."""
    out = {}
    for k, v in code.items():
        ins = list(v['ins'])
        for i in range(len(ins) - 1):
            if ins[i].kind == 'gload' and ins[i].wbar != sass.NO_BAR:
                nxt = ins[i + 1]
                y = sass.Ins.__new__(sass.Ins)
                for s in sass.Ins.__slots__:
                    setattr(y, s, getattr(nxt, s))
                y.wait = nxt.wait | 1 << ins[i].wbar
                ins[i + 1] = y
        out[k] = dict(v, ins=ins)
    return out


# --- traffic ---------------------------------------------------------------------------

def read_traffic(path, variant=''):
    """Launches grouped by case: [(case dict + variant, [launch records])]."""
    return emu_report.read_cases(path, {'variant': variant})


# --- the model -------------------------------------------------------------------------

def occupancy_blocks(threads, regs, smem):
    """Resident blocks per SM on sm_90 (emu_report.occupancy's rules)."""
    occ, _ = emu_report.occupancy(threads, regs, smem)
    warps = -(-threads // 32)
    return max(1, round(occ * emu_report.SM90['warps'] / warps))


def warp_figures(entry, rec, cache):
    """sass.analyse for the average warp of launch rec (cached per instance
    and budget)."""
    threads = rec['block'][0] * rec['block'][1] * rec['block'][2]
    warps = rec['blocks_run'] * -(-threads // 32)
    widths = rec.get('load_widths')
    if widths is None:  # a record from before load_widths: all at 4 bytes
        widths = {'4': rec['loads']['requests']}
    budget = {int(w): n / warps for w, n in widths.items()}
    key = (id(entry['ins']), tuple(sorted((w, round(b, 2)) for w, b in budget.items())))
    if key not in cache:
        if 'cfg' not in entry:
            entry['cfg'] = sass.Cfg(entry['ins'])
        cache[key] = sass.analyse(entry['ins'], budget, entry['cfg'])
    return cache[key]


def predict_launch(entry, rec, p, dev=H200, cache=None):
    cache = {} if cache is None else cache
    threads = rec['block'][0] * rec['block'][1] * rec['block'][2]
    wpb = -(-threads // 32)
    n_blocks = rec['grid'][0] * rec['grid'][1] * rec['grid'][2]
    res = entry['res']
    smem = rec['smem_dynamic'] + res.get('smem_static', 0)
    resident = occupancy_blocks(threads, res.get('regs', 32), smem)
    per_sm = -(-n_blocks // dev['sms'])
    # blocks start as others end: a second wave of a few blocks costs a
    # fraction of a chain, not a whole one
    waves = max(1.0, per_sm / resident)
    w = warp_figures(entry, rec, cache)
    scale = rec['blocks_total'] / max(rec['blocks_run'], 1)
    shared = rec['shared_load_sectors'] + rec['shared_store_sectors']
    distinct = shared + (rec['distinct_load_sectors'] + rec['distinct_store_sectors'] -
                         shared) * scale
    nbytes = 32 * distinct
    # what the warps ask of L1/L2 (every request's sectors): re-read
    # activations and uncoalesced loads cost L2 bandwidth, not DRAM
    requested = 32 * (rec['loads']['sectors'] + rec['stores']['sectors']) * scale
    clock = dev['clock_hz']
    chain = (w['stall'] + w['gwaits'] * p['lat_global'] + w['swaits'] * p['lat_short']) / clock
    t = {
        'dram': nbytes / (dev['peak_bw'] * p['dram_eff']),
        'l2': requested / (p['l2_tbs'] * 1e12),
        'issue': per_sm * wpb * w['instr'] / (dev['schedulers'] * p['ipc'] * clock),
        'latency': waves * chain,
    }
    bound = max(t, key=t.get)
    total = t[bound] + p['t_launch_us'] * 1e-6
    return {
        'kernel': entry_name(rec), 'grid': n_blocks, 'threads': threads,
        'regs': res.get('regs'), 'smem': smem, 'resident_warps': resident * wpb,
        'waves': waves, 'bytes': nbytes,
        'instr_per_warp': w['instr'], 'gwaits_per_warp': w['gwaits'],
        'swaits_per_warp': w['swaits'],
        'instr_per_byte': (n_blocks * wpb * w['instr']) / nbytes if nbytes else None,
        'loop_instr_per_byte': w['loop_instr_per_byte'],
        'inflight_per_warp': round(w['inflight_mean']),
        'inflight_per_sm': round(w['inflight_mean'] * min(resident, per_sm) * wpb),
        'us': {k: round(v * 1e6, 3) for k, v in t.items()},
        'bound': bound if t[bound] > p['t_launch_us'] * 1e-6 else 'launch',
        'us_total': total * 1e6, 'truncated': w['truncated'],
    }


def entry_name(rec):
    return inst_key(rec['instance'] or rec['kernel'])


def predict_case(case, launches, code, p, cache, dev=H200):
    parts, missing = [], []
    for rec in launches:
        e = code.get(entry_name(rec))
        if e is None:
            missing.append(entry_name(rec))
            continue
        parts.append(predict_launch(e, rec, p, dev, cache))
    if missing or not parts:
        return None
    us = sum(x['us_total'] for x in parts)
    need = case.get('bytes_necessary') or sum(x['bytes'] for x in parts)
    main = max(parts, key=lambda x: x['us_total'])
    return {
        'family': case['family'], 'model': case['model'], 'shape': case['shape'],
        'type': case['type'], 'act': case.get('act', ''), 'n_tok': case['n_tok'],
        'n_ctx': case['n_ctx'], 'variant': case.get('variant', ''),
        'kernel': ' + '.join(x['kernel'] for x in parts),
        'bytes_necessary': need, 'us': round(us, 3), 't_launch_us': p['t_launch_us'],
        'bw_frac': round(need / (us * 1e-6) / dev['peak_bw'], 4),
        'bound': main['bound'], 'launches': parts,
    }


def main_kernel(row):
    return max(row['launches'], key=lambda x: x['us_total'])


# --- measured rows ---------------------------------------------------------------------

def measured_key(r):
    act = r.get('act') or ''
    return (r['kernel'], r['model'], r['shape'], r['type'], act, r['n_tok'], r['n_ctx'])


def row_key(r):
    return (r['family'], r['model'], r['shape'], r['type'], r.get('act') or '', r['n_tok'],
            r['n_ctx'])


def measured_variant(kernel):
    """(family, variant) of a measured row's kernel: bench/run_gpu.sh names a
    variant's rows 'matvec@pipe:4' (--matvec-q8: pass, pipe:B, stream:B) and
    'attn_decode@4x64' (--attn-split); the model calls them 'pipe:4' and
    'split:4x64'."""
    fam, _, plan = kernel.partition('@')
    if not plan:
        return fam, ''
    return fam, plan if plan.startswith(('pass', 'pipe', 'stream', 'splitk')) else 'split:' + plan


def load_measured(paths):
    """{(row key, variant): {'us', 'source', 'device'}} of the decode rows."""
    out = {}
    for path in paths:
        with open(path, encoding='utf-8') as f:
            doc = json.load(f)
        # the dp4a mat-vec kernel its plain q8 rows ran: the run's
        # --matvec-q8 (before it was recorded: the one-pass kernel, 'pass');
        # named as a variant when it is not MVQ_DEFAULT
        mvq = doc.get('params', {}).get('matvec_q8', 'pass')
        for r in doc['results']:
            fam, variant = measured_variant(r['kernel'])
            if (not variant and mvq != MVQ_DEFAULT and fam.startswith('matvec') and
                    r.get('act') == 'q8'):
                variant = mvq
            if fam in DECODE_FAMILIES and r.get('n_tok', 0) <= 8:
                key = measured_key(dict(r, kernel=fam))
                out[(key, variant)] = {'us': r['us_median'], 'source': os.path.basename(path),
                                       'device': doc['device']['name']}
    return out


def fit_half(key):
    """The calibration split: every row of attn_q, ffn_down, output, qkv and
    attention at 512 cells fits the constants; the others check them."""
    fam, _, shape, _, _, _, ctx = key
    return shape.startswith(('attn_q', 'ffn_down', 'output', 'qkv')) or ctx == 512 or \
        fam in ('rms_norm', 'argmax')


def errors(rows, measured, pick):
    out = []
    for r in rows:
        if r['variant']:
            continue
        m = measured.get((row_key(r), ''))
        if m and pick(row_key(r)):
            out.append((r, m, r['us'] / m['us'] - 1))
    return out


def summary(errs):
    if not errs:
        return {'n': 0}
    a = sorted(abs(e) for _, _, e in errs)
    return {'n': len(a), 'median_abs_err': round(statistics.median(a), 4),
            'p90_abs_err': round(a[min(len(a) - 1, int(math.ceil(0.9 * len(a))) - 1)], 4)}


# --- commands --------------------------------------------------------------------------

def default_objs(build):
    return sorted(glob.glob(os.path.join(build, BUILD_OBJ, '*.cu.o')))


def load_cases(traffic_args):
    """traffic_args: ['file', 'file@variant', ...]."""
    cases = []
    for t in traffic_args:
        path, _, variant = t.partition('@')
        if os.path.exists(path):
            cases.extend(read_traffic(path, variant))
    return cases


def predict_all(cases, code, p):
    cache, rows = {}, []
    for case, launches in cases:
        if case['family'] not in DECODE_FAMILIES or case['n_tok'] > 8:
            continue
        r = predict_case(case, launches, code, p, cache)
        if r:
            rows.append(r)
    return rows


def cmd_calibrate(a, code):
    cases = load_cases(a.traffic)
    measured = load_measured(a.measured)
    grid = {'lat_global': [100, 150, 200, 300, 400, 600, 800],
            'lat_short': [15, 30, 60, 120],
            'ipc': [0.4, 0.6, 0.8, 1.0],
            'dram_eff': [0.85, 0.92],
            't_launch_us': [1.5, 2.5, 3.5, 4.5, 6.0],
            'l2_tbs': [7.0, 8.0, 9.0, 10.0, 11.0]}
    cache, best = {}, None
    # warp figures do not depend on the constants: computed once
    pre = []
    for case, launches in cases:
        if case['family'] not in DECODE_FAMILIES or case['n_tok'] > 8 or case['variant']:
            continue
        key = row_key(dict(case, act=case.get('act', '')))
        if (key, '') not in measured or not fit_half(key):
            continue
        pre.append((case, launches, measured[(key, '')]['us']))
    names = list(grid)

    def combos(i=0, cur=None):
        cur = cur or {}
        if i == len(names):
            yield dict(cur)
            return
        for v in grid[names[i]]:
            cur[names[i]] = v
            yield from combos(i + 1, cur)
    for p in combos():
        errs = []
        for case, launches, us in pre:
            r = predict_case(case, launches, code, p, cache)
            if r:
                errs.append(abs(math.log(r['us'] / us)))
        if not errs:
            continue
        errs.sort()
        score = statistics.median(errs) + 0.5 * errs[int(0.9 * (len(errs) - 1))]
        if best is None or score < best[0]:
            best = (score, p)
    if best is None:
        raise SystemExit('calibrate: no measured row has a recorded case (run record first)')
    print(json.dumps(best[1]))
    rows = predict_all(cases, code, best[1])
    t = calibration_table(rows, measured)
    print(json.dumps({k: t[k] for k in ('fit', 'check', 'all')}))
    return best[1]


def calibration_table(rows, measured):
    fit = errors(rows, measured, fit_half)
    check = errors(rows, measured, lambda k: not fit_half(k))
    table = []
    for r, m, e in sorted(fit + check, key=lambda x: row_key(x[0])):
        table.append({'family': r['family'], 'shape': r['shape'], 'type': r['type'],
                      'act': r['act'], 'n_tok': r['n_tok'], 'n_ctx': r['n_ctx'],
                      'half': 'fit' if fit_half(row_key(r)) else 'check',
                      'predicted_us': r['us'], 'measured_us': round(m['us'], 3),
                      'err': round(e, 4), 'bound': r['bound'], 'device': m['device']})
    return {'fit': summary(fit), 'check': summary(check), 'all': summary(fit + check),
            'rows': table}


def ranking(rows, measured):
    """Per case with variants: the variants in predicted order (fastest
    first), and where a GPU timed two or more of them, its order and whether
    the model's agrees on those."""
    by = {}
    for r in rows:
        by.setdefault(row_key(r), []).append(r)
    out = []
    for k, rs in by.items():
        if len(rs) < 2:
            continue
        rs = sorted(rs, key=lambda r: r['us'])
        e = {'family': k[0], 'model': k[1], 'shape': k[2], 'type': k[3], 'n_tok': k[5],
             'n_ctx': k[6], 'order': [(r['variant'] or 'default', r['us']) for r in rs]}
        timed = [(measured[(k, r['variant'])]['us'], r['variant'] or 'default') for r in rs
                 if (k, r['variant']) in measured]
        if len(timed) >= 2:
            e['measured_order'] = [(v, us) for us, v in sorted(timed)]
            mine = [v for v, _ in e['order'] if any(v == t for _, t in timed)]
            e['agrees'] = mine == [v for v, _ in e['measured_order']]
        out.append(e)
    return out


def slim(r):
    m = main_kernel(r)
    return {
        'family': r['family'], 'model': r['model'], 'shape': r['shape'], 'type': r['type'],
        'act': r['act'], 'n_tok': r['n_tok'], 'n_ctx': r['n_ctx'], 'variant': r['variant'],
        'kernel': r['kernel'], 'main_kernel': m['kernel'], 'instr_per_byte': round(m['instr_per_byte'] or 0, 4),
        'loop_instr_per_byte': round(m['loop_instr_per_byte'], 4)
        if m['loop_instr_per_byte'] else None,
        'loads_in_flight_per_warp_bytes': m['inflight_per_warp'],
        'round_trips_per_warp': m['gwaits_per_warp'],
        'resident_warps': m['resident_warps'], 'bytes_in_flight_per_sm': m['inflight_per_sm'],
        'waves': m['waves'], 'bound': r['bound'], 'bounds_us': m['us'],
        'predicted_us': r['us'], 'predicted_bw_frac': r['bw_frac'],
    }


def git_commit():
    return emu_report.git_commit()


# The files of the GPU run's tg128 rows (bench/results/SUMMARY.json) per
# (model, quant of the report); Q4_K_M files are taken as Q4_K throughout.
STEP_FILES = {('llama2-7b', 'q4_0'): 'llama2-7b-q4_0', ('llama2-7b', 'q4_K'): 'llama2-7b-q4_k_m',
              ('llama2-7b', 'q8_0'): 'llama2-7b-q8_0', ('llama2-7b', 'f16'): 'llama2-7b-f16',
              ('llama3-8b', 'q4_0'): 'llama3-8b-q4_0', ('llama3-8b', 'q4_K'): 'llama3-8b-q4_k_m',
              ('llama3-8b', 'q8_0'): 'llama3-8b-q8_0', ('llama3-8b', 'f16'): 'llama3-8b-f16'}
STEP_CTX = 256  # tg128 from an empty cache: at most 128 cells; the nearest recorded length
# Programmatic dependent launch (VELA_PDL=1, cuda/launch.cuh): a kernel of the
# decode chain starts while the one before it drains and waits at its top
# (cudaGridDependencySynchronize) for that grid to complete. Assumed: such a
# launch costs T_PDL_US between the kernels instead of the graph's t_graph_us
# (the dependent grid's release after the previous one completes, no launch
# processing left on the path); attention launches without PDL, so its own
# launch and the one after it (which waits for all of it) keep t_graph_us.
# An assumption, not a fit: the GPU run's tg128 with VELA_PDL=1
# (bench/run_gpu.sh) calibrates it.
T_PDL_US = 1.0


QUANTIZE_KERNEL = 'quantize_q8_1_kernel'
# A persistent decode kernel (calm's design: one launch per token, a grid-wide
# barrier where each launch boundary of today's chain is): assumed cost of
# one barrier across the H200's 132 SMs (an arrive on a global counter and a
# spin on it: about two L2 round trips plus the skew of the last block). An
# assumption, not a fit: nothing on the GPU has timed one yet.
T_GRID_SYNC_US = 1.5


def handed_names(names, handed):
    """A recorded op call's kernel names as the forward runs it: without the
    q8_1 quantize launch where the op before hands its activations over
    (emu_report.decode_parts_handed)."""
    return [k for k in names if not (handed and k.startswith(QUANTIZE_KERNEL))]


def launch_count(r, handed=False):
    """Launches of one op call in a decode step: a predicted row's, or a
    report row's (its kernel names joined by ' + ')."""
    names = [x['kernel'] for x in r['launches']] if 'launches' in r else r['kernel'].split(' + ')
    return len(handed_names(names, handed))


def work_us(r, handed):
    """The time of one op call's launches as the forward runs them, without
    the cost of launching them."""
    keep = set(handed_names([x['kernel'] for x in r['launches']], handed))
    return sum(x['us_total'] - r['t_launch_us'] for x in r['launches'] if x['kernel'] in keep)


def serial_launches(parts):
    """The launches of a decode step that PDL leaves at the graph's cost:
    attention's, and the one after each attention call."""
    return sum(n * (launch_count(r) + 1) for n, r, _ in parts if r['family'].startswith('attn'))


def pdl_fields(s, parts, g):
    """The decode step s with PDL (T_PDL_US), from its op calls."""
    serial = serial_launches(parts)
    us = s['work_us'] + g * serial + T_PDL_US * (s['launches'] - serial)
    return {'launches_serial': serial, 't_pdl_us': T_PDL_US, 'step_us_pdl': round(us, 1),
            'tps_pdl': round(1e6 / us, 1)}


def best_rows(rows):
    """Per decode case, the recorded variant predicted fastest (the default
    included): [rows], one per row_key."""
    best = {}
    for r in rows:
        if r['act'] not in ('q8', ''):
            continue
        k = row_key(r)
        if k not in best or r['us'] < best[k]['us']:
            best[k] = r
    return list(best.values())


def step_sums(parts):
    """(work µs, launches, bytes necessary) of a decode step's op calls."""
    return (sum(n * work_us(r, h) for n, r, h in parts),
            sum(n * launch_count(r, h) for n, r, h in parts),
            sum(n * r['bytes_necessary'] for n, r, _ in parts))


def decode_steps(rows, summary_path):
    """One decode token per model and quant (emu_report.decode_parts_handed's
    op calls, with the launches the forward runs), predicted: inside a CUDA
    graph a launch costs t_graph_us, not the t_launch_us that CUDA events
    around a lone op call measure. t_graph_us is fitted on the GPU run's
    measured tg128 (SUMMARY.json), the one constant of this sum; each row's
    error is listed beside it. Beside the default kernels: the mat-vecs
    through pipe:4, every op through its fastest recorded variant with PDL,
    and that work in one persistent kernel (T_GRID_SYNC_US per boundary)."""
    base = [r for r in rows if not r['variant'] and r['act'] in ('q8', '')]
    # the same step with the mat-vecs through the pipelined kernel where recorded
    piped = {row_key(r): r for r in base}
    for r in rows:
        if r['variant'] == 'pipe:4' and row_key(r) in piped:
            piped[row_key(r)] = r
    piped = list(piped.values())
    best = best_rows(rows)
    tg = {}
    if summary_path and os.path.exists(summary_path):
        with open(summary_path, encoding='utf-8') as f:
            for r in json.load(f)['rows']:
                if r['test'] == 'tg128':
                    tg[r['model']] = r['vela_tps']
    steps = []
    for model in emu_report.MODELS:
        for quant in emu_report.QUANTS:
            parts = emu_report.decode_parts_handed(base, model, quant, STEP_CTX)
            if not parts:
                continue
            work, launches, need = step_sums(parts)
            pp = emu_report.decode_parts_handed(piped, model, quant, STEP_CTX)
            bp = emu_report.decode_parts_handed(best, model, quant, STEP_CTX)
            work_best, launches_best, _ = step_sums(bp)
            steps.append({'model': model, 'quant': quant, 'ctx': STEP_CTX, 'work_us': work,
                          'parts': parts,
                          'work_us_pipe4': step_sums(pp)[0] if pp else None,
                          'launches': launches, 'bytes_necessary': need,
                          'work_us_best': round(work_best, 1), 'launches_best': launches_best,
                          'best_parts': bp,
                          'measured_tps': tg.get(STEP_FILES.get((model, quant)))})
    timed = [s for s in steps if s['measured_tps']]
    best_fit = None
    for g in [x / 4 for x in range(0, 41)]:
        errs = sorted(abs(math.log((s['work_us'] + g * s['launches']) * 1e-6 *
                                   s['measured_tps'])) for s in timed)
        if errs and (best_fit is None or statistics.median(errs) < best_fit[0]):
            best_fit = (statistics.median(errs), g)
    g = best_fit[1] if best_fit else 1.0
    for s in steps:
        us = s['work_us'] + g * s['launches']
        bw = lambda t: round(s['bytes_necessary'] / (t * 1e-6) / H200['peak_bw'], 3)
        s.update({'t_graph_us': g, 'step_us': round(us, 1), 'tps': round(1e6 / us, 1),
                  'tps_no_launch_cost': round(1e6 / s['work_us'], 1),
                  'tps_pipe4': round(1e6 / (s['work_us_pipe4'] + g * s['launches']), 1)
                  if s['work_us_pipe4'] and s['quant'] in MEASURED_TYPES.split(',') else None,
                  'bw_frac': bw(us),
                  'work_us': round(s['work_us'], 1)})
        s.update(pdl_fields(s, s.pop('parts'), g))
        bp = s.pop('best_parts')
        serial = serial_launches(bp)
        us_best = s['work_us_best'] + g * serial + T_PDL_US * (s['launches_best'] - serial)
        us_pers = s['work_us_best'] + T_GRID_SYNC_US * s['launches_best']
        s.update({'tps_best_pdl': round(1e6 / us_best, 1), 'bw_frac_best_pdl': bw(us_best),
                  't_grid_sync_us': T_GRID_SYNC_US, 'tps_persistent': round(1e6 / us_pers, 1),
                  'bw_frac_persistent': bw(us_pers)})
        if s['measured_tps']:
            s['err'] = round(s['measured_tps'] / s['tps'] - 1, 4)
    return steps


def pdl_note(steps):
    s = steps[0] if steps else {}
    return ('"PDL": the decode chain launched with programmatic dependent launch '
            '(VELA_PDL=1): %d of the %d launches of a Llama-2-7B token cost an assumed %.2f µs '
            'instead of the graph\'s (attention\'s own and the one after each keep it), an '
            'assumption (perf_model.py, T_PDL_US) until a GPU run times tg128 with '
            'VELA_PDL=1.' % (s.get('launches', 0) - s.get('launches_serial', 0),
                             s.get('launches', 0), s.get('t_pdl_us', T_PDL_US)))


def cmd_steps_pdl(a):
    """The PDL column of the decode steps from a report's JSON (its rows and
    steps as they are, no machine code or recording needed); rewrites the
    JSON and the markdown tables."""
    with open(a.json, encoding='utf-8') as f:
        doc = json.load(f)
    base = [r for r in doc['rows'] if not r['variant'] and r['act'] in ('q8', '')]
    for s in doc['decode_steps']:
        parts = emu_report.decode_parts_handed(base, s['model'], s['quant'], s['ctx'])
        if not parts:
            raise SystemExit('perf_model: %s %s: a decode op is missing from %s' %
                             (s['model'], s['quant'], a.json))
        s.update(pdl_fields(s, parts, s['t_graph_us']))
    with open(a.json, 'w', encoding='utf-8') as f:
        json.dump(doc, f, indent=1)
        f.write('\n')
    if a.readme:
        emu_report.write_readme(a.readme, markdown(doc), BEGIN, END)
    return doc


def cmd_report(a, code, p):
    rows = predict_all(load_cases(a.traffic), code, p)
    measured = load_measured(a.measured)
    out_rows = []
    for r in rows:
        s = slim(r)
        m = measured.get((row_key(r), r['variant']))
        s['measured_us'] = round(m['us'], 3) if m else None
        out_rows.append(s)
    doc = {
        'commit': git_commit(),
        'date': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ'),
        'source': 'bench/kernels/perf_model.py report: sm_90 machine code of the build '
                  '(cuobjdump -sass) x the emulated launches (vela-bench-kernels-emu)',
        'device': H200, 'params': p,
        'calibration': calibration_table(rows, measured),
        'ranking': ranking(rows, measured),
        'decode_steps': decode_steps(rows, a.summary),
        'rows': out_rows,
    }
    with open(a.out, 'w', encoding='utf-8') as f:
        json.dump(doc, f, indent=1)
        f.write('\n')
    print('%d rows -> %s; calibration %s' % (len(out_rows), a.out,
                                              json.dumps({k: doc['calibration'][k]
                                                          for k in ('fit', 'check', 'all')})))
    if a.readme:
        emu_report.write_readme(a.readme, markdown(doc), BEGIN, END)
    return doc


BEGIN, END = '<!-- perf-model:begin -->', '<!-- perf-model:end -->'


def markdown(doc):
    c = doc['calibration']
    L = ['Generated by `bench/kernels/perf_model.py report` at %s (%s). Constants: %s.' % (
        doc['commit'], doc['date'][:10], ', '.join('%s %s' % kv for kv in doc['params'].items())),
        '',
        'Calibration against %s: fit on %d rows (median error %.0f%%, p90 %.0f%%), checked '
        'on %d others (median %.0f%%, p90 %.0f%%).' % (
            'kernels-h200.json', c['fit'].get('n', 0), 100 * c['fit'].get('median_abs_err', 0),
            100 * c['fit'].get('p90_abs_err', 0), c['check'].get('n', 0),
            100 * c['check'].get('median_abs_err', 0), 100 * c['check'].get('p90_abs_err', 0)),
        '',
        ranking_line(doc['ranking']),
        '',
        'One decode token (tg128: %d cells of attention; every layer matrix in the quant, the '
        'output head as llama.cpp files it; inside a CUDA graph a launch costs %.2f µs, fitted '
        'on the measured tg128):' % (STEP_CTX, doc['decode_steps'][0]['t_graph_us']
                                     if doc['decode_steps'] else 0),
        '',
        '| model | quant | launches | µs/token | t/s predicted | %BW | t/s measured (H200) | '
        'error | t/s, launches free | t/s, PDL | t/s, pipe:4 mat-vecs | t/s, best + PDL (%BW) '
        '| t/s, persistent (%BW) |',
        '|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|'] + [
        '| %s | %s | %d | %.0f | %.0f | %.0f%% | %s | %s | %.0f | %s | %s | %s | %s |' % (
            s_['model'], s_['quant'], s_['launches'], s_['step_us'], s_['tps'],
            100 * s_['bw_frac'], '%.0f' % s_['measured_tps'] if s_['measured_tps'] else '',
            '%+.0f%%' % (100 * s_['err']) if 'err' in s_ else '', s_['tps_no_launch_cost'],
            '%.0f' % s_['tps_pdl'] if s_.get('tps_pdl') else '',
            '%.0f' % s_['tps_pipe4'] if s_['tps_pipe4'] else '',
            '%.0f (%.0f%%)' % (s_['tps_best_pdl'], 100 * s_['bw_frac_best_pdl'])
            if s_.get('tps_best_pdl') else '',
            '%.0f (%.0f%%)' % (s_['tps_persistent'], 100 * s_['bw_frac_persistent'])
            if s_.get('tps_persistent') else '')
        for s_ in doc['decode_steps']] + [
        '',
        'Launches as the forward runs them: the mat-vecs whose q8_1 activations the op '
        'before hands over (rms_norm_q8, the attention\'s q8_1 output) launch no quantize '
        'kernel. "Launches free": the same kernels with no cost between them. ' +
        pdl_note(doc['decode_steps']) + ' "pipe:4": the mat-vecs through the pipelined '
        'kernel (--matvec-q8 pipe:4, recorded for Q4_0, Q4_K, Q6_K, Q8_0), untimed on a GPU. '
        '"Best + PDL": every op through its fastest recorded variant (mat-vec pipe/stream, '
        'attention split plans), launched with PDL. "Persistent": that work in one launch '
        'per token, a grid-wide barrier of an assumed %.1f µs (perf_model.py, '
        'T_GRID_SYNC_US) where each launch boundary is.' % T_GRID_SYNC_US,
        '',
        'Llama-3-8B shapes (the full set, Llama-2-7B too, is in the JSON): ffn_up stands '
        'for the mat-vecs, decode attention at three lengths, the small kernels; each '
        'variant below its default.',
        '',
        '| case | type | act | tok | ctx | variant | kernel | instr/B | loop instr/B | '
        'B in flight/warp | warps/SM | KB in flight/SM | bound | µs | %BW | measured µs |',
        '|---|---|---|---:|---:|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|']
    for r in doc['rows']:
        if not readme_row(r):
            continue
        L.append('| %s %s | %s | %s | %d | %d | %s | %s | %.3f | %s | %d | %d | %.1f | %s | '
                 '%.1f | %.0f%% | %s |' % (
                     r['family'], r['shape'], r['type'], r['act'] or '-', r['n_tok'], r['n_ctx'],
                     r['variant'] or '-', r['main_kernel'].replace('_kernel', ''),
                     r['instr_per_byte'],
                     '%.3f' % r['loop_instr_per_byte'] if r['loop_instr_per_byte'] else '-',
                     r['loads_in_flight_per_warp_bytes'], r['resident_warps'],
                     r['bytes_in_flight_per_sm'] / 1024, r['bound'], r['predicted_us'],
                     100 * r['predicted_bw_frac'],
                     '%.1f' % r['measured_us'] if r['measured_us'] else ''))
    return '\n'.join(L) + '\n'


def ranking_line(rank):
    timed = [e for e in rank if 'measured_order' in e]
    if not timed:
        return ('Variants: %d cases ranked by the model (`ranking`); none timed on a GPU yet.'
                % len(rank))
    return ('Variants: %d cases ranked; of the %d a GPU timed, the model orders %d as the '
            'GPU did (`ranking[].agrees`).' % (len(rank), len(timed),
                                               sum(e['agrees'] for e in timed)))


def readme_row(r):
    """The rows of bench/results/kernels-predicted.md's short table."""
    if r['model'] != 'llama3-8b' or r['n_tok'] not in (1, 8) or r['act'] == 'f32':
        return False
    if r['family'].startswith('matvec'):
        return r['family'] == 'matvec' and r['shape'].startswith('ffn_up') and \
            r['type'] in ('f16', 'q4_0', 'q4_K', 'q6_K', 'q8_0')
    if r['family'] in ('attn_decode', 'attn_se_decode'):
        return r['n_ctx'] in (256, 4096, 32768)
    return r['n_tok'] == 1


def cmd_show(a, code, p):
    sel = a.what
    if sel.endswith('.cu'):  # the build's object of that file (rebuild after an edit)
        names = {k for k, v in code.items() if v['file'] == os.path.basename(sel)}
    else:
        names = {k for k in code if not sel or sel in k}
    if not names:
        raise SystemExit('show: no kernel instance matches %r (of %d in the machine code)' % (
            sel, len(code)))
    print('Static (one warp, every load width allowed, loops while 64 requests last):')
    print('%-48s %5s %6s %8s %9s %8s' % ('instance', 'regs', 'smem', 'instr', 'instr/B',
                                          'B/trip'))
    for k in sorted(names):
        e = code[k]
        w = sass.analyse(e['ins'], {1: 64, 2: 64, 4: 64, 8: 64, 16: 64})
        print('%-48s %5s %6s %8d %9s %8d' % (
            k[:48], e['res'].get('regs', '-'), e['res'].get('smem_static', '-'), w['instr'],
            '%.3f' % (w['instr'] / w['gload_bytes']) if w['gload_bytes'] else '-',
            w['inflight_mean']))
    rows = [r for r in predict_all(load_cases(a.traffic), code, p)
            if any(inst_key(x['kernel']) in names for x in r['launches'])]
    if rows:
        print('\nRecorded launches (%s):' % ', '.join(a.traffic))
        print('%-10s %-14s %-26s %-7s %3s %6s %-9s %7s %7s %6s %8s %-8s %8s %6s' % (
            'model', 'family', 'shape', 'type', 'tok', 'ctx', 'variant', 'instr/B', 'B/trip',
            'warps', 'KB/SM', 'bound', 'us', '%BW'))
        for r in rows:
            m = main_kernel(r)
            print('%-10s %-14s %-26s %-7s %3d %6d %-9s %7.3f %7d %6d %8.1f %-8s %8.2f %5.0f%%' % (
                r['model'], r['family'], r['shape'][:26], r['type'], r['n_tok'], r['n_ctx'],
                r['variant'] or '-', m['instr_per_byte'] or 0, m['inflight_per_warp'],
                m['resident_warps'], m['inflight_per_sm'] / 1024, r['bound'], r['us'],
                100 * r['bw_frac']))


def gate_key(r):
    return '%s | %s | %s | %s | %s | tok %d ctx %d | %s' % (
        r['model'], r['family'], r['shape'], r['type'], r['act'], r['n_tok'], r['n_ctx'],
        r['variant'] or 'default')


def cmd_gate(a, code, p):
    rows = predict_all(load_cases(a.traffic), code, p)
    if not rows:
        print('gate: no decode case predicted from %s (recorded? built with CUDA?)' %
              ', '.join(a.traffic))
        return 1
    if a.update:
        doc = {'commit': git_commit(),
               'date': datetime.datetime.now(datetime.timezone.utc).strftime(
                   '%Y-%m-%dT%H:%M:%SZ'),
               'source': 'bench/kernels/perf_model.py gate --update (ci-small shapes)',
               'params': p,
               'rows': {gate_key(r): {'bw_frac': r['bw_frac'], 'us': r['us'],
                                      'bound': r['bound']} for r in rows}}
        with open(a.reference, 'w', encoding='utf-8') as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.write('\n')
        print('%d cases -> %s' % (len(rows), a.reference))
        return 0
    with open(a.reference, encoding='utf-8') as f:
        ref = json.load(f)['rows']
    new = {gate_key(r): r for r in rows}
    fails = 0
    print('| case | %BW ref | %BW now | bound | |')
    print('|---|---:|---:|---|---|')
    for k, rr in sorted(ref.items()):
        r = new.get(k)
        if r is None:
            print('| %s | %.1f | - | - | FAIL: case gone |' % (k, 100 * rr['bw_frac']))
            fails += 1
            continue
        bad = r['bw_frac'] < rr['bw_frac'] * (1 - a.tolerance)
        fails += bad
        print('| %s | %.1f | %.1f | %s | %s |' % (k, 100 * rr['bw_frac'], 100 * r['bw_frac'],
                                                 r['bound'], 'FAIL: > %d%% below' % round(
                                                     100 * a.tolerance) if bad else 'ok'))
    for k in sorted(set(new) - set(ref)):
        print('| %s | - | %.1f | %s | new (not in the reference) |' % (
            k, 100 * new[k]['bw_frac'], new[k]['bound']))
    print('\n%d of %d reference cases predicted more than %d%% below their reference or gone'
          % (fails, len(ref), round(100 * a.tolerance)))
    if a.expect_fail:
        ok = fails > 0 and fails >= a.expect_fail * len(ref)
        print('self-check: the gate %s on the doctored machine code (%d of %d cases)' % (
            'fired' if ok else 'did NOT fire', fails, len(ref)))
        return 0 if ok else 1
    return 1 if fails else 0


# --- record ----------------------------------------------------------------------------

MV_FAMILIES = 'matvec,matvec_qkv,matvec_swiglu,matvec_add'
ALL_TYPES = 'f16,q4_0,q4_K,q5_K,q6_K,q8_0,q2_K,q3_K,iq4_nl,iq4_xs'
MEASURED_TYPES = 'q4_0,q4_K,q6_K,q8_0'
ATTN_CTX = '256,512,4096,32768'
# (traffic file, variant, families, arguments[, blocks emulated per launch]):
# a variant under test is picked by vela-bench-kernels' --matvec-q8 /
# --attn-kernel / --attn-split; blocks per launch default to record's
# (VELA_EMU_SAMPLE_BLOCKS), SAMPLE_ALL runs every block
SAMPLE_ALL = 0
REPORT_RUNS = [
    ('mv', '', MV_FAMILIES,
     ['--types', ALL_TYPES, '--matvec-tok', '1,2,4,8', '--matvec-act', 'q8']),
    ('mvf32', '', MV_FAMILIES,
     ['--types', MEASURED_TYPES, '--matvec-tok', '1,8', '--matvec-act', 'f32']),
    ('attn', '', 'attn_decode,attn_se_decode', ['--ctx', ATTN_CTX]),
    ('small', '', 'rope,rope_kv_store,rms_norm,argmax', ['--ctx', '4096']),
    # every block emulated (SAMPLE_ALL): the second stage reads candidate
    # keys that each first-stage block writes, and a block the emulator
    # skips leaves them unwritten
    ('sample', '', 'sample', ['--ctx', '4096'], SAMPLE_ALL),
    ('pipe4', 'pipe:4', MV_FAMILIES,
     ['--matvec-q8', 'pipe:4', '--types', MEASURED_TYPES, '--matvec-tok', '1,8',
      '--matvec-act', 'q8']),
    ('stream4', 'stream:4', MV_FAMILIES,
     ['--matvec-q8', 'stream:4', '--types', MEASURED_TYPES, '--matvec-tok', '1,8',
      '--matvec-act', 'q8']),
    # the F16/BF16 streaming mat-vec (--matvec-f16), rows of type f16 beside
    # the q8 kernels' stream:4
    ('f16stream4', 'stream:4', MV_FAMILIES,
     ['--matvec-f16', 'stream:4', '--types', 'f16', '--matvec-tok', '1,2,8']),
    # decode attention: the split-K attn_kernel (the default before
    # attn_dec_kernel) and attn_dec_kernel under other split plans
    ('splitk', 'splitk', 'attn_decode', ['--attn-kernel', 'splitk', '--ctx', ATTN_CTX]),
    ('splitk4x64', 'splitk:4x64', 'attn_decode',
     ['--attn-kernel', 'splitk', '--attn-split', '4x64', '--ctx', '256,4096,32768']),
] + [('split' + s, 'split:' + s, 'attn_decode', ['--attn-split', s, '--ctx', '256,4096,32768'])
     for s in ('4x8', '8x8', '2x32')]
CI_RUNS = [
    ('ci', '', MV_FAMILIES + ',attn_decode,rms_norm,rope_kv_store,argmax',
     ['--types', 'f16,q4_0,q4_K,q6_K,q8_0', '--matvec-tok', '1,8', '--matvec-act', 'q8',
      '--ctx', '4096']),
]


def cmd_record(a, runs, models, sample):
    files = []
    os.makedirs(a.dir, exist_ok=True)
    for run in runs:
        name, variant, fams, args = run[:4]
        blocks = run[4] if len(run) > 4 else sample
        path = os.path.abspath(os.path.join(a.dir, 'traffic-%s.jsonl' % name))
        if os.path.exists(path):
            os.remove(path)
        e = dict(os.environ, VELA_EMU_TRAFFIC=path, VELA_EMU_SAMPLE_BLOCKS=str(blocks))
        cmd = [a.bench, '--models', models, '--filter', fams] + args
        t0 = time.time()
        r = subprocess.run(cmd, env=e, capture_output=True, text=True)
        sys.stderr.write('%-10s %-50s %6.1f s\n' % (name, fams[:50], time.time() - t0))
        if r.returncode:
            sys.stderr.write(r.stdout[-3000:] + r.stderr[-3000:])
            raise SystemExit('%s failed (exit %d)' % (' '.join(cmd), r.returncode))
        if not os.path.exists(path) or not os.path.getsize(path):
            sys.stderr.write(r.stderr[-3000:])
            raise SystemExit('%s recorded no launches into %s' % (' '.join(cmd), path))
        files.append(path + ('@' + variant if variant else ''))
    print(' '.join(files))
    return files


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--build', default=os.path.join(ROOT, 'build'),
                    help='the build folder whose sm_90 objects are read')
    ap.add_argument('--obj', action='append',
                    help='an object or cubin to read instead (repeatable)')
    ap.add_argument('--cuobjdump', help='cuobjdump to use (default: found)')
    ap.add_argument('--params', help='JSON of constants to use instead of the fitted ones')
    sub = ap.add_subparsers(dest='cmd', required=True)
    p = sub.add_parser('show', help='figures of one .cu file or kernel name (or all)')
    p.add_argument('what', nargs='?', default='')
    p.add_argument('--traffic', nargs='*', default=[])
    p = sub.add_parser('record', help='run the emulated bench for the report or the gate')
    p.add_argument('--bench', required=True)
    p.add_argument('--dir', required=True)
    p.add_argument('--ci', action='store_true', help='the gate\'s small shapes')
    for name in ('report', 'calibrate'):
        p = sub.add_parser(name)
        p.add_argument('--traffic', nargs='+', required=True)
        p.add_argument('--measured', nargs='+',
                       default=[os.path.join(ROOT, 'bench/results/kernels-h200.json')])
        if name == 'report':
            p.add_argument('--out', default=os.path.join(ROOT,
                                                         'bench/results/kernels-predicted.json'))
            p.add_argument('--readme', default=os.path.join(ROOT,
                                                            'bench/results/kernels-predicted.md'))
            p.add_argument('--summary', default=os.path.join(ROOT, 'bench/results/SUMMARY.json'),
                           help="a GPU run's SUMMARY.json: its tg128 rows check the decode step")
    p = sub.add_parser('steps-pdl', help="the decode steps' PDL column from a report's JSON")
    p.add_argument('--json', default=os.path.join(ROOT, 'bench/results/kernels-predicted.json'))
    p.add_argument('--readme', default=os.path.join(ROOT, 'bench/results/kernels-predicted.md'))
    p = sub.add_parser('gate')
    p.add_argument('--traffic', nargs='+', required=True)
    p.add_argument('--reference', default=os.path.join(ROOT,
                                                       'bench/results/kernels-predicted-ci.json'))
    p.add_argument('--tolerance', type=float, default=0.05)
    p.add_argument('--update', action='store_true')
    p.add_argument('--doctor', action='store_true',
                   help='self-check: every global load waited on at once; must fail')
    p.add_argument('--expect-fail', type=float, default=0.0,
                   help='self-check: exit 0 only if at least this fraction of cases fails')
    a = ap.parse_args()

    if a.cmd == 'record':
        if a.ci:
            return 0 if cmd_record(a, CI_RUNS, 'ci-small', 16) else 1
        return 0 if cmd_record(a, REPORT_RUNS, 'llama2-7b,llama3-8b', 16) else 1
    if a.cmd == 'steps-pdl':
        cmd_steps_pdl(a)
        return 0
    cuobjdump = a.cuobjdump or find_cuobjdump()
    if not cuobjdump:
        print('perf_model: no cuobjdump with nvdisasm (pip install %s, or the CUDA '
              'toolkit\'s): skipped' % CUOBJDUMP_PIN)
        return 77
    objs = a.obj or default_objs(a.build)
    if not objs:
        raise SystemExit('perf_model: no sm_90 objects under %s (build vela with CUDA first)' %
                         os.path.join(a.build, BUILD_OBJ))
    t0 = time.time()
    code = load_code(objs, cuobjdump, os.path.join(a.build, 'perf-model-cache'))
    params = dict(PARAMS, **(json.loads(a.params) if a.params else {}))
    if a.cmd == 'gate' and a.doctor:
        code = doctor(code)
    sys.stderr.write('machine code: %d instances from %d files in %.1f s\n' % (
        len(code), len(objs), time.time() - t0))
    if a.cmd == 'show':
        cmd_show(a, code, params)
    elif a.cmd == 'report':
        cmd_report(a, code, params)
    elif a.cmd == 'calibrate':
        cmd_calibrate(a, code)
    elif a.cmd == 'gate':
        return cmd_gate(a, code, params)
    return 0


if __name__ == '__main__':
    sys.exit(main())
