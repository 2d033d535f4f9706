"""vela: sm_90 machine code of a kernel, read for the performance model.

Parses `cuobjdump -sass` text into instructions with their control words,
builds the control-flow graph, walks the path an average warp of a launch
takes and reads off what bounds its speed: warp-instructions, global load
requests and bytes, the memory round trips on its critical path and the
bytes each one carries (bench/kernels/perf_model.py turns them into time).

Control word (the high 64 bits of each 128-bit Volta-and-later instruction,
bits 105..125 of the instruction, i.e. bits 41.. of that word): stall cycles
(4 bits), yield (1), the scoreboard a variable-latency result sets (3 bits,
7 = none), the scoreboard its source reads release (3), the scoreboards the
instruction waits on (6-bit mask), register reuse (4). A global load sets a
scoreboard; the first instruction that waits on it is where the warp stops
for memory: the loads issued since the last such stop are in flight
together, one round trip.

The path (class Warp): at each conditional branch the warp goes where the
launch's loads went when the emulator ran it (its load requests by lane
width, from the traffic records: a 2-byte-aligned Q6_K row takes
warp_copy's 16-bit loop, a 16-byte aligned Q4_K row its 128-bit one); every
loop runs once except the steady-state loops (the largest loops with global
loads), which run as often as the launch's load requests per warp allow.
"""
import re

INS_RE = re.compile(r'^\s+/\*([0-9a-f]{4,6})\*/\s+(.*?)\s*;\s*/\* (0x[0-9a-f]{16}) \*/')
HI_RE = re.compile(r'^\s+/\* (0x[0-9a-f]{16}) \*/')
FN_RE = re.compile(r'Function : (\S+)')
NO_BAR = 7

# Opcodes whose results come back through a scoreboard from device memory (or
# L2): a wait on them is a memory round trip. LD/ST are generic addresses (the
# compiler could not prove shared); they are counted as global.
GLOBAL_LOADS = {'LDG', 'LD', 'LDGSTS'}
GLOBAL_STORES = {'STG', 'ST', 'RED', 'ATOM', 'ATOMG'}
# Variable-latency units close to the SM (shared memory, shuffles, special
# functions, barriers, local memory in L1): a wait on them is a short one.
SHORT_UNITS = {'LDS', 'STS', 'LDSM', 'ATOMS', 'SHFL', 'S2R', 'S2UR', 'MUFU', 'LDL', 'STL',
               'BAR', 'I2F', 'F2I', 'F2F', 'I2FP', 'F2FP', 'FRND', 'POPC', 'FLO', 'BREV',
               'LDC', 'MATCH', 'VOTE', 'REDUX', 'CS2R', 'R2UR'}
WIDTH = {'128': 16, '64': 8, 'U8': 1, 'S8': 1, 'U16': 2, 'S16': 2}


class Ins:
    __slots__ = ('pc', 'pred', 'op', 'mods', 'args', 'stall', 'wbar', 'rbar', 'wait', 'width',
                 'kind')

    def __init__(self, pc, asm, hi):
        c = hi >> 41
        self.pc = pc
        self.pred = ''
        if asm.startswith('@'):
            self.pred, asm = asm.split(None, 1)
        opfull, _, args = asm.partition(' ')
        parts = opfull.split('.')
        self.op, self.mods, self.args = parts[0], parts[1:], args.strip()
        self.stall, self.wbar, self.rbar, self.wait = c & 15, (c >> 5) & 7, (c >> 8) & 7, \
            (c >> 11) & 63
        self.width = 4
        for m in self.mods:
            self.width = WIDTH.get(m, self.width)
        if self.op in GLOBAL_LOADS:
            self.kind = 'gload'
        elif self.op in GLOBAL_STORES:
            self.kind = 'gstore'
        elif self.op in SHORT_UNITS:
            self.kind = 'short'
        else:
            self.kind = ''

    def target(self):
        """Branch target pc, or None."""
        if self.op not in ('BRA', 'BRX', 'JMP'):
            return None
        m = re.match(r'(?:`\(\S+\)\s*)?(0x[0-9a-f]+)', self.args)
        return int(m.group(1), 16) if m else None

    def always(self):
        return self.pred in ('', '@PT')


def parse(text):
    """{mangled name: [Ins]} of every function in cuobjdump -sass output."""
    fns, cur, pend = {}, None, None
    for line in text.splitlines():
        m = FN_RE.search(line)
        if m:
            cur = fns.setdefault(m.group(1), [])
            continue
        m = INS_RE.match(line)
        if m and cur is not None:
            pend = (int(m.group(1), 16), m.group(2))
            continue
        m = HI_RE.match(line)
        if m and pend:
            cur.append(Ins(pend[0], pend[1], int(m.group(1), 16)))
            pend = None
    return fns


# --- the control-flow graph -------------------------------------------------------------

class Cfg:
    """Basic blocks of one function: blocks[i] = (first, last) instruction indices."""

    def __init__(self, ins):
        self.ins = ins
        at = {x.pc: i for i, x in enumerate(ins)}
        starts = {0}
        for i, x in enumerate(ins):
            t = x.target()
            if t is not None and t in at:
                starts.add(at[t])
            if (t is not None or x.op in ('EXIT', 'RET', 'BREAK')) and i + 1 < len(ins):
                starts.add(i + 1)
        starts = sorted(starts)
        self.blocks = [(s, (starts[k + 1] if k + 1 < len(starts) else len(ins)) - 1)
                       for k, s in enumerate(starts)]
        self.of = {s: k for k, (s, _) in enumerate(self.blocks)}
        self.succ = []
        for k, (s, e) in enumerate(self.blocks):
            x, out = ins[e], []
            t = x.target()
            if t is not None and t in at:
                out.append(self.of[at[t]])
                if not x.always():
                    out.append(k + 1)
            elif x.op == 'EXIT' and x.always() or x.op in ('RET', 'BREAK'):
                pass
            elif k + 1 < len(self.blocks):
                out.append(k + 1)
            self.succ.append(out)
        self.back = self._back_edges()
        self._bodies = {}

    def _back_edges(self):
        """Edges to a block on the depth-first path from the entry: loops'
        back edges. Not every backward jump in layout order is one: nvcc
        places a loop before the code that enters it."""
        back, state = set(), [0] * len(self.blocks)  # 0 new, 1 on the path, 2 done
        stack = [(0, iter(self.succ[0]))] if self.blocks else []
        state[0] = 1 if self.blocks else 0
        while stack:
            b, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[b] = 2
                stack.pop()
            elif state[nxt] == 1:
                back.add((b, nxt))
            elif state[nxt] == 0:
                state[nxt] = 1
                stack.append((nxt, iter(self.succ[nxt])))
        return back

    def body(self, tail, head):
        """The natural loop of back edge tail -> head: head and every block
        that reaches tail without passing head."""
        key = (tail, head)
        if key not in self._bodies:
            preds = {}
            for b, out in enumerate(self.succ):
                for t in out:
                    preds.setdefault(t, []).append(b)
            seen, todo = {head}, [tail]
            while todo:
                b = todo.pop()
                if b in seen:
                    continue
                seen.add(b)
                todo.extend(preds.get(b, []))
            self._bodies[key] = seen
        return self._bodies[key]

    def forward(self, k):
        return [t for t in self.succ[k] if (k, t) not in self.back]

    def reach_until(self, k, stop):
        """Blocks reachable from k along forward edges without passing stop."""
        seen, todo = set(), [k]
        while todo:
            b = todo.pop()
            if b in seen or b == stop:
                continue
            seen.add(b)
            todo.extend(self.forward(b))
        return seen

    def ipostdom(self):
        """Immediate post-dominator of each block on the forward graph (None: the exit)."""
        if getattr(self, '_ipd', None) is None:
            self._ipd = self._ipostdom()
        return self._ipd

    def _ipostdom(self):
        n = len(self.blocks)
        order = list(range(n - 1, -1, -1))
        pdom = [None] * n  # sets
        for _ in range(n + 2):
            changed = False
            for b in order:
                fw = self.forward(b)
                if not fw:
                    new = {b}
                else:
                    sets = [pdom[s] for s in fw if pdom[s] is not None]
                    if not sets:
                        continue
                    new = set.intersection(*sets) | {b}
                if new != pdom[b]:
                    pdom[b], changed = new, True
            if not changed:
                break
        out = []
        for b in range(n):
            cands = (pdom[b] or {b}) - {b}
            # the nearest: the candidate post-dominated by all others
            best = None
            for c in cands:
                if all(o in (pdom[c] or set()) for o in cands):
                    best = c
            out.append(best)
        return out


# --- the path a warp takes ----------------------------------------------------------------

class Warp:
    """One warp's walk through a kernel, steered by its load budget.

    budget: {lane width in bytes: global load requests of that width} that
    the average warp of the launch issued when the emulator ran it. At a
    conditional branch the warp takes the side whose loads have the widths
    the launch's loads had (a Q6_K row, 2-byte aligned, takes warp_copy's
    16-bit loop, not its 128-bit one); sides without loads take the
    fall-through. Every loop
    runs once, except the steady-state loops (alloc: the largest loops with
    global loads, see analyse), which go round again while their share of the
    requests left holds at least half of their last iteration's loads. So the walk ends with about the emulator's requests, on
    the alternative paths the emulator's loads took.

    Scoreboards are followed along the walk: an instruction that waits on a
    scoreboard with a global load outstanding is a memory round trip (the
    global bytes then in flight are recorded), one that waits only on short
    units (shared memory, shuffles, special functions) a short wait;
    DEPBAR.LE SB0, N (cp.async groups) waits until N groups remain.
    """

    def __init__(self, cfg, budget, alloc=None, max_blocks=400000):
        self.cfg, self.budget = cfg, dict(budget)
        self.share = dict(budget)  # what the branches choose by: the launch's width mix
        self.alloc = dict(alloc or {})  # steady-state loop -> requests for its extra trips
        self.ipd = cfg.ipostdom()
        self.side_cache = {}
        self.max_blocks = max_blocks
        self.st = {'instr': 0, 'gload_req': 0, 'gload_bytes': 0, 'gstore_req': 0, 'stall': 0,
                   'gwaits': 0, 'swaits': 0, 'syncs': 0, 'blocks': 0, 'truncated': False}
        self.inflight = []  # global bytes in flight at each round trip
        self.loops = {}     # back edge -> [iterations, instr, gload bytes]
        self.pending, self.groups, self.open_group = {}, [], 0
        self.gepoch = self.sepoch = 0  # round trips (global, short) completed so far

    def wait_for(self, gl, sh):
        """A wait on global loads gl ((epoch, weight) each) and short results sh
        (epochs). A load issued before
        the last round trip completed was in flight during it: waiting for it
        costs no new round trip. One issued since does: the warp's chain of
        dependent round trips grows by one (the bytes then in flight are
        what one trip carries)."""
        now = [w for e, w in gl if e == self.gepoch]
        if now:
            # a wait on predicated loads only is a round trip where some
            # lane's predicate held: counted as half of one
            self.st['gwaits'] += max(now)
            self.inflight.append(sum(n for q in self.pending.values() for k, n, e, _ in q
                                     if k == 'g' and e == self.gepoch) +
                                 sum(n for n, e in self.groups if e == self.gepoch) +
                                 self.open_group)
            self.gepoch += 1
            self.sepoch += 1  # short results issued before it are back too
        elif sh and max(sh) == self.sepoch:
            self.st['swaits'] += 1
            self.sepoch += 1

    def side_loads(self, start, stop):
        key = (start, stop)
        if key not in self.side_cache:
            self.side_cache[key] = block_loads(self.cfg, self.cfg.reach_until(start, stop))
        return self.side_cache[key]

    def fits(self, loads):
        """How many of loads have widths the launch's loads had."""
        return sum(c for w, c in loads.items() if self.share.get(w, 0) > 0)

    def choose(self, k):
        taken, fall = self.cfg.forward(k)
        lt, lf = self.side_loads(taken, self.ipd[k]), self.side_loads(fall, self.ipd[k])
        ft, ff = self.fits(lt), self.fits(lf)
        if not lt and not lf:
            return fall
        if ft and not ff:
            return taken
        if ff and not ft:
            return fall
        if ft and ff:
            # both: the side whose widths carry more of the launch's requests
            st = sum(self.share.get(w, 0) for w in lt)
            sf = sum(self.share.get(w, 0) for w in lf)
            return taken if st > sf else fall
        # neither matches a width the launch loaded with (the compiler split
        # the source's accesses: an unaligned 4-byte read as two 2-byte
        # loads): the side with loads
        return taken if lt and not lf else fall

    def total(self):
        """Requests left, all widths together."""
        return sum(self.budget.values())

    def execute(self, b):
        cfg, st = self.cfg, self.st
        s, e = cfg.blocks[b]
        st['blocks'] += 1
        loads = {}
        for x in cfg.ins[s:e + 1]:
            st['instr'] += 1
            st['stall'] += x.stall
            waited = [sb for sb in range(6) if x.wait >> sb & 1 and self.pending.get(sb)]
            if waited:
                got = [q for sb in waited for q in self.pending[sb]]
                self.wait_for([(e, w) for k, _, e, w in got if k == 'g'],
                              [e for k, _, e, _ in got if k == 's'])
                for sb in waited:
                    self.pending[sb] = []
            if x.op == 'LDGSTS':
                self.open_group += x.width * 32
            elif x.op == 'LDGDEPBAR':
                self.groups.append((self.open_group, self.gepoch))
                self.open_group = 0
            elif x.op == 'DEPBAR':
                m = re.search(r'SB0,\s*(0x[0-9a-f]+|\d+)', x.args)
                keep = int(m.group(1), 0) if m else 0
                if len(self.groups) > keep:
                    done = self.groups[:len(self.groups) - keep]
                    self.wait_for([(e, 1.0) for _, e in done], [])
                    self.groups = self.groups[len(self.groups) - keep:]
            elif x.op == 'BAR':
                st['syncs'] += 1
            if x.kind == 'gload':
                st['gload_req'] += 1
                st['gload_bytes'] += x.width * 32
                loads[x.width] = loads.get(x.width, 0) + load_weight(x)
                self.budget[x.width] = self.budget.get(x.width, 0) - load_weight(x)
            elif x.kind == 'gstore':
                st['gstore_req'] += 1
            if x.wbar != NO_BAR and x.kind in ('gload', 'short'):
                self.pending.setdefault(x.wbar, []).append(
                    ('g', x.width * 32, self.gepoch, load_weight(x))
                    if x.kind == 'gload' and x.op != 'LDGSTS' else ('s', 0, self.sepoch, 1.0))
        return e - s + 1, loads

    def run(self):
        cfg = self.cfg
        since = {}  # loop header -> (instr, loads by width) since the warp last arrived there
        heads = {t for _, t in cfg.back}
        b = 0
        while b is not None:
            if self.st['blocks'] >= self.max_blocks:
                self.st['truncated'] = True
                break
            if b in heads:
                since[b] = [0, {}]
            n, loads = self.execute(b)
            for h in since:
                since[h][0] += n
                for w, c in loads.items():
                    since[h][1][w] = since[h][1].get(w, 0) + c
            x = cfg.ins[cfg.blocks[b][1]]
            back = [t for t in cfg.succ[b] if (b, t) in cfg.back]
            if back:
                h = back[0]
                if h == b and x.always() and x.op == 'BRA' and n == 1:
                    break  # the padding after EXIT
                it_instr, it_loads = since.get(h, [0, {}])
                rec = self.loops.setdefault((b, h), [0, 0, 0])
                rec[0] += 1
                rec[1] += it_instr
                rec[2] += sum(w * 32 * c for w, c in it_loads.items())
                # by count, not width: the source's accesses may compile to
                # loads of other widths
                n = sum(it_loads.values())
                again = (b, h) in self.alloc and n > 0 and self.alloc[(b, h)] >= 0.5 * n
                if again:
                    self.alloc[(b, h)] -= n
                    b = h
                    continue
                if x.always():
                    b = loop_exit(cfg, h, b)
                    continue
            fw = cfg.forward(b)
            if not fw:
                break
            b = fw[0] if len(fw) == 1 else self.choose(b)
        return self


def block_loads(cfg, blocks):
    """{lane width: global load instructions} in blocks."""
    widths = {}
    for b in blocks:
        s, e = cfg.blocks[b]
        for x in cfg.ins[s:e + 1]:
            if x.kind == 'gload':
                widths[x.width] = widths.get(x.width, 0) + load_weight(x)
    return widths


def load_weight(x):
    """A predicated load is a request only where some lane's predicate holds
    (a copy's tail): counted as half of one against the budget."""
    return 1.0 if x.always() else 0.5


def loop_exit(cfg, head, tail):
    """Where a loop whose back edge tail -> head is unconditional is left: the
    first block (in layout order) outside it that one of its blocks branches to."""
    body = cfg.body(tail, head)
    outs = [t for b in body for t in cfg.succ[b] if t not in body]
    return min(outs) if outs else None


def hot_loops(cfg):
    """The steady-state loops: those with global loads whose bodies are at
    least half as large (in instructions) as the largest such loop, outermost
    only (an inner loop runs once per trip of its outer one)."""
    loops = []
    for frm, to in cfg.back:
        body = cfg.body(frm, to)
        if not block_loads(cfg, body):
            continue
        size = sum(cfg.blocks[b][1] - cfg.blocks[b][0] + 1 for b in body)
        loops.append(((frm, to), body, size))
    if not loops:
        return []
    big = max(size for _, _, size in loops)
    out = [(e, body) for e, body, size in loops if size >= 0.5 * big]
    return [e for e, body in out if not any(e[1] in b2 and e != e2 and e[1] != e2[1]
                                            for e2, b2 in out)]


def analyse(ins, budget, cfg=None):
    """One average warp of a launch: {'instr', 'gload_req', 'gload_bytes',
    'gwaits', 'swaits', 'stall', 'syncs', 'inflight_mean' (global bytes in
    flight at a round trip), 'loop_instr_per_byte' (the steady-state loop:
    the one whose iterations loaded the most bytes; None without one),
    'truncated'}.

    Two walks: every loop once, which issues some of the launch's requests;
    then the requests left, shared equally among the steady-state loops, are
    what their extra trips may issue."""
    cfg = cfg or Cfg(ins)
    base = Warp(cfg, budget).run()
    hot = hot_loops(cfg)
    left = base.total()
    w = base
    if hot and left > 0:
        w = Warp(cfg, budget, {e: left / len(hot) for e in hot}).run()
    out = dict(w.st)
    out['inflight_mean'] = sum(w.inflight) / len(w.inflight) if w.inflight else 0.0
    best = max(w.loops.values(), key=lambda r: r[2], default=None)
    out['loop_instr_per_byte'] = best[1] / best[2] if best and best[2] else None
    out['loop_iterations'] = best[0] if best and best[2] else 0
    return out
