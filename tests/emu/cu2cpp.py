#!/usr/bin/env python3
"""vela CUDA emulator (tests/emu): rewrites a .cu file into host C++.

    kernel<T, U><<<grid, block[, shmem[, stream]]>>>(args...)
 -> emu_launch("kernel<T, U>", kernel<T, U>, grid, block, shmem, stream, args...)

    extern __shared__ T name[];
 -> T *const name = (T *)emu_dynamic_smem();

    __shared__ T name[N];
 -> typedef T emu_shared_t_name[N]; emu_shared_t_name &name = emu_shared_var<...>([] {});
    (a place in the launch's static shared memory, see static_shared)

    cuda_launch(pdl, kernel<T, U>, grid, block, shmem, stream, args...)
 -> emu_named_launch("kernel<T, U>", [&] { return cuda_launch(pdl, kernel<T, U>, ...); })
    (cuda/launch.cuh's launcher, so that the launch keeps the kernel's name)

Everything else (__global__, __shared__, intrinsics) is handled by the
force-included tests/emu/cuda_emu.h. Line numbers are preserved, so compiler
messages point into the original file (a #line directive names it).

usage: cu2cpp.py input.cu output.cpp
"""
import re
import sys


def skip_back_ws(s, i):
    while i >= 0 and s[i].isspace():
        i -= 1
    return i


def callee_start(s, end):
    """s[end] is the last character of the launched expression."""
    i = skip_back_ws(s, end)
    if s[i] == '>':  # template arguments: match the brackets backwards
        depth = 0
        while i >= 0:
            if s[i] == '>':
                depth += 1
            elif s[i] == '<':
                depth -= 1
                if depth == 0:
                    break
            i -= 1
        i = skip_back_ws(s, i - 1)
    while i >= 0 and (s[i].isalnum() or s[i] in '_:'):
        i -= 1
    return i + 1


def split_top(s):
    """Splits on commas outside (), [], {} and <> of template arguments."""
    parts, depth, cur = [], 0, ''
    for c in s:
        if c in '([{':
            depth += 1
        elif c in ')]}':
            depth -= 1
        if c == ',' and depth == 0:
            parts.append(cur)
            cur = ''
        else:
            cur += c
    if cur.strip():
        parts.append(cur)
    return parts


def match_paren(s, i):
    """s[i] == '(': index of the matching ')'."""
    depth = 0
    while i < len(s):
        if s[i] == '(':
            depth += 1
        elif s[i] == ')':
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise SystemExit('cu2cpp: unbalanced parentheses')


def kernel_arg(s, i):
    """s[i:] starts the kernel argument of a cuda_launch call: (name, end)."""
    m = re.compile(r'\s*[A-Za-z_][\w:]*\s*').match(s, i)
    if not m:
        raise SystemExit('cu2cpp: cuda_launch without a kernel name: %s' % s[i:i + 60])
    j = m.end()
    if s[j] == '<':  # template arguments: match the brackets
        depth = 0
        while True:
            if s[j] == '<':
                depth += 1
            elif s[j] == '>':
                depth -= 1
                if depth == 0:
                    break
            j += 1
        j += 1
    return ' '.join(s[i:j].split()), j


def convert_named_launches(src):
    out, pos = [], 0
    for m in re.finditer(r'(?<![\w.])cuda_launch\s*\(', src):
        if m.start() < pos:
            continue
        a = m.end() - 1
        b = match_paren(src, a)
        comma = split_top(src[a + 1:b])[0]
        name, _ = kernel_arg(src, a + 1 + len(comma) + 1)
        out.append(src[pos:m.start()])
        out.append('emu_named_launch("%s", [&] { return %s; })' % (name, src[m.start():b + 1]))
        pos = b + 1
    out.append(src[pos:])
    return ''.join(out)


def convert(src):
    src = convert_named_launches(src)
    out = []
    pos = 0
    while True:
        j = src.find('<<<', pos)
        if j < 0:
            out.append(src[pos:])
            break
        start = callee_start(src, j - 1)
        callee = src[start:j]
        k = src.find('>>>', j)
        if k < 0:
            raise SystemExit('cu2cpp: <<< without >>>')
        config = split_top(src[j + 3:k])
        if not 2 <= len(config) <= 4:
            raise SystemExit('cu2cpp: launch with %d parameters: %s' % (len(config), src[j:k + 3]))
        config += ['0'] * (4 - len(config))
        a = k + 3
        while src[a].isspace():
            a += 1
        if src[a] != '(':
            raise SystemExit('cu2cpp: no argument list after >>>')
        b = match_paren(src, a)
        args = src[a + 1:b]
        name = ' '.join(callee.split())
        newlines = src.count('\n', start, a)  # keep the line count
        text = 'emu_launch("%s", %s, dim3(%s), dim3(%s), (size_t)(%s), (cudaStream_t)(%s)%s%s)' % (
            name, callee.strip(), config[0].strip(), config[1].strip(), config[2].strip(),
            config[3].strip(), '\n' * newlines, (', ' + args) if args.strip() else '')
        out.append(src[pos:start])
        out.append(text)
        pos = b + 1
    res = ''.join(out)
    res = re.sub(r'extern\s+__shared__\s+((?:__align__\s*\(\s*\d+\s*\)\s*)?)([\w:\s]+?)\s*(\w+)\s*\[\s*\]\s*;',
                 lambda m: '%s *const %s = (%s *)emu_dynamic_smem();' % (m.group(2).strip(), m.group(3), m.group(2).strip()),
                 res)
    res = re.sub(r'(?<![\w])__shared__\s+((?:__align__\s*\(\s*\d+\s*\)\s*)?)'
                 r'((?:typename\s+)?[A-Za-z_][\w:]*(?:\s*<[^;{}()]*?>)?(?:\s*::\s*\w+)*)'
                 r'\s+([^;{}()=]+);', static_shared, res)
    return res


def split_decls(s):
    """'a, b[2][3]' -> [('a', ''), ('b', '[2][3]')] (commas outside brackets)."""
    out = []
    for d in split_top(s):
        m = re.fullmatch(r'\s*(\w+)\s*((?:\[[^\]]*\]\s*)*)', d)
        if not m:
            raise SystemExit('cu2cpp: cannot read the __shared__ declarator %r' % d)
        out.append((m.group(1), m.group(2).strip()))
    return out


def static_shared(m):
    """__shared__ T x[N]; -> a reference into the launch's static shared memory.

    A function-local static would do on the CPU, but GCC puts the statics of
    function templates in .bss whatever their section, and the runtime must
    know where every block's shared memory is (refilled with 0xff before a
    block, watched by racecheck). emu_shared_var<T, align>([] {}) hands out
    one place per declaration (the lambda's type is unique to it and to the
    template instance) in the runtime's static shared memory.
    """
    align = re.search(r'\d+', m.group(1)).group(0) if m.group(1) else '16'
    typ = ' '.join(m.group(2).split())
    parts = []
    for name, dims in split_decls(m.group(3)):
        t = 'emu_shared_t_%s' % name
        parts.append('typedef %s %s%s; %s &%s = emu_shared_var<%s, %s>([] {});' % (
            typ, t, dims, t, name, t, align))
    return ' '.join(parts)


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    with open(sys.argv[1], encoding='utf-8') as f:
        src = f.read()
    res = '#line 1 "%s"\n' % sys.argv[1] + convert(src)
    with open(sys.argv[2], 'w', encoding='utf-8') as f:
        f.write(res)


if __name__ == '__main__':
    main()
