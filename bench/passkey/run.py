#!/usr/bin/env python3
"""Passkey retrieval (LongLM's test, Jin et al. 2024) with `vela run`.

A 5-digit key is hidden at several depths in filler text sized to several
prompt lengths (tokens of the model's own tokenizer); the model is asked for
it, greedy, and a row counts as found when the 5 digits appear in what it
generates. Three modes per prompt: no extension, llama.cpp's grouped
attention (--grp-attn-n G --grp-attn-w W) and exact self-extend
(--self-extend G W), the same (G, W) for both.

The prompt is LongLM's passkey_retrivial.py: the task line, the filler
("The grass is green. ..." joined by spaces) cut to the prefix's share of
the characters, the key line, the filler cut again to the suffix's share,
then "What is the pass key? The pass key is" (lines joined by newlines).
The filler's character count is found per (length, depth) from `vela
tokenize` so that the whole prompt is the target length within a few tokens;
the real count is recorded.

Results go to a JSON file (one row per prompt and mode, written after every
run, so an interrupted run resumes where it stopped: rows already there for
the same (length, depth, mode, G, W) are kept) and a markdown table of
accuracy per length and mode beside it. Standard library only.

  bench/passkey/run.py                                   # everything (long)
  bench/passkey/run.py --lengths 4096,8192 --modes se,grp
  bench/passkey/run.py --table-only                      # redo the table from the JSON
"""
import argparse
import datetime
import json
import os
import random
import re
import subprocess
import sys
import time

TASK = ("There is an important info hidden inside a lot of irrelevant text. Find it and "
        "memorize them. I will quiz you about the important information there.")
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
QUESTION = "What is the pass key? The pass key is"
FILLER_INF = " ".join([FILLER] * 5000)  # 449,999 characters: about 110k tokens

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODES = ("none", "grp", "se")
MODE_NAMES = {"none": "no extension", "grp": "grp-attn (llama.cpp)", "se": "exact self-extend"}


def prompt_text(n_garbage, depth, key):
    n_prefix = int(n_garbage * depth)
    info = f"The pass key is {key}. Remember it. {key} is the pass key."
    return "\n".join([TASK, FILLER_INF[:n_prefix], info, FILLER_INF[:n_garbage - n_prefix],
                      QUESTION])


def count_tokens(vela, model, text, tmp):
    with open(tmp, "w") as f:
        f.write(text)
    out = subprocess.run([vela, "tokenize", "-m", model, "-f", tmp, "--ids", "--show-count"],
                         capture_output=True, text=True, check=True).stdout
    m = re.search(r"Total number of tokens: (\d+)", out)
    if not m:
        sys.exit(f"passkey: no token count in vela tokenize's output:\n{out[-500:]}")
    return int(m.group(1))


def build_prompt(vela, model, length, depth, key, tmp):
    """Filler characters so that the prompt has `length` tokens (at most a
    few under): a linear estimate, corrected until it stops moving."""
    n_garbage = int(length * 3.7)
    best = None
    for _ in range(6):
        text = prompt_text(n_garbage, depth, key)
        n = count_tokens(vela, model, text, tmp)
        if n <= length and (best is None or n > best[1]):
            best = (text, n)
        if length - 4 <= n <= length:
            break
        n_garbage = max(0, n_garbage + int((length - n) * 3.69) - (4 if n > length else 0))
    if best is None:
        best = (text, n)
    return best


def run_vela(args, prompt_file, n_tokens, mode):
    ctx = (n_tokens + args.n_predict + 64 + 255) // 256 * 256
    cmd = [args.vela, "run", "-m", args.model, "-f", prompt_file, "-n", str(args.n_predict),
           "--temp", "0", "--backend", args.backend, "-c", str(ctx), "--no-display-prompt",
           "--no-progress"]
    if args.threads:
        cmd += ["-t", str(args.threads)]
    if mode == "grp":
        cmd += ["--grp-attn-n", str(args.G), "--grp-attn-w", str(args.W)]
    elif mode == "se":
        cmd += ["--self-extend", str(args.G), str(args.W)]
    cmd += args.extra
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    wall = time.time() - t0
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout)[-400:].strip(), "wall_s": round(wall, 1),
                "cmd": " ".join(cmd[1:])}
    m = re.search(r"prompt eval:\s+([\d.]+) ms /\s+(\d+) tokens", p.stderr)
    return {"output": p.stdout.strip("\n"), "wall_s": round(wall, 1),
            "prompt_eval_ms": float(m.group(1)) if m else None,
            "prompt_tokens": int(m.group(2)) if m else None, "cmd": " ".join(cmd[1:])}


def git_commit():
    try:
        c = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"],
                           capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return c + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def exact(row):
    """Stricter than found: the first number the model writes is the key
    (' 593533.' holds 59353 but is not it)."""
    m = re.search(r"\d+", row.get("output", ""))
    return bool(m) and m.group(0) == str(row["key"])


def key_of(row):
    return (row["length_target"], row["depth"], row["mode"], row["G"], row["W"])


def save(path, doc):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def table(doc):
    rows = [r for r in doc["rows"] if "found" in r]
    lengths = sorted({r["length_target"] for r in rows})
    gw = sorted({(r["G"], r["W"]) for r in rows if r["mode"] != "none"})
    gw_text = ", ".join(f"G={g}, W={w}" for g, w in gw) or "-"
    head = ["length (tokens)"] + [MODE_NAMES[m] for m in MODES]
    lines = [f"Passkey retrieval, {doc.get('model', '?')}: prompts whose answer holds the key's "
             f"5 digits, of those run ({gw_text}; depths "
             f"{', '.join(f'{d:g}' for d in doc.get('depths', []))}); in brackets, those whose "
             "first number is exactly the key", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for n in lengths:
        real = sorted({r["length_tokens"] for r in rows if r["length_target"] == n})
        cells = [f"{n} ({real[0]}..{real[-1]})" if real and real[0] != real[-1] else
                 f"{n} ({real[0]})" if real else str(n)]
        for m in MODES:
            sel = [r for r in rows if r["length_target"] == n and r["mode"] == m]
            if not sel:
                cells.append("not run")
                continue
            k = sum(1 for r in sel if r["found"])
            x = sum(1 for r in sel if exact(r))
            depths = ", ".join(f"{r['depth']:g}" for r in sorted(sel, key=lambda r: r["depth"])
                               if not r["found"])
            cells.append(f"{k}/{len(sel)} [{x}/{len(sel)}]" +
                         (f", missed at depth {depths}" if depths else ""))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Arguments after -- go to every vela run "
                                        "(e.g. -- --matvec-act q8).")
    ap.add_argument("--vela", default=os.path.join(ROOT, "build", "vela"))
    ap.add_argument("--model",
                    default=os.path.expanduser("~/.cache/vela/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--model-name", default="SmolLM2-135M-Instruct Q4_1")
    ap.add_argument("--lengths", default="4096,8192,12288,16384")
    ap.add_argument("--depths", default="0,0.25,0.5,0.75,1")
    ap.add_argument("--modes", default="none,grp,se")
    ap.add_argument("-G", type=int, default=4)
    ap.add_argument("-W", type=int, default=1024)
    ap.add_argument("-n", "--n-predict", type=int, default=8)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("-t", "--threads", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=int, default=7200, help="seconds per vela run")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "passkey-smollm2.json"))
    ap.add_argument("--force", action="store_true", help="run rows the JSON already has again")
    ap.add_argument("--commit", help="the commit vela was built from (default: this checkout's "
                                     "HEAD, -dirty when tracked files differ)")
    ap.add_argument("--table-only", action="store_true")
    ap.add_argument("extra", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()

    lengths = [int(x) for x in args.lengths.split(",") if x]
    depths = [float(x) for x in args.depths.split(",") if x]
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            ap.error(f"--modes: '{m}' is not one of {', '.join(MODES)}")
    md_path = os.path.splitext(args.out)[0] + ".md"

    doc = {"rows": []}
    if os.path.exists(args.out):
        with open(args.out) as f:
            doc = json.load(f)
    if args.table_only:
        t = table(doc)
        with open(md_path, "w") as f:
            f.write(t)
        print(t)
        return
    if not os.access(args.vela, os.X_OK):
        sys.exit(f"passkey: no vela at {args.vela} (--vela PATH)")
    doc.update({"benchmark": "passkey retrieval (LongLM)", "model": args.model_name,
                "model_file": os.path.basename(args.model), "backend": args.backend,
                "n_predict": args.n_predict, "seed": args.seed,
                "depths": sorted(set(doc.get("depths", [])) | set(depths))})
    done = {key_of(r): r for r in doc["rows"] if "found" in r}
    tmp = os.path.join("/tmp", f"passkey-{os.getpid()}.txt")
    todo = [(n, d, m) for n in lengths for d in depths for m in modes]
    t_start = time.time()
    try:
        for i, (n, d, m) in enumerate(todo):
            G, W = (args.G, args.W) if m != "none" else (1, 0)
            k = (n, d, m, G, W)
            if k in done and not args.force:
                r = done[k]
                print(f"[{i + 1}/{len(todo)}] {n} tokens, depth {d:g}, {m}: kept "
                      f"({'found' if r['found'] else 'missed'})", flush=True)
                continue
            rng = random.Random(args.seed * 1000003 + n * 101 + int(d * 100))
            key = rng.randint(10000, 99999)
            text, n_tok = build_prompt(args.vela, args.model, n, d, key, tmp)
            with open(tmp, "w") as f:
                f.write(text)
            res = run_vela(args, tmp, n_tok, m)
            row = {"length_target": n, "length_tokens": n_tok, "depth": d, "mode": m, "G": G,
                   "W": W, "key": key}
            row.update(res)
            if "error" in res:
                print(f"[{i + 1}/{len(todo)}] {n} tokens, depth {d:g}, {m}: vela failed: "
                      f"{res['error']}", flush=True)
                continue
            row["found"] = str(key) in res["output"]
            row["commit"] = args.commit or git_commit()
            row["date"] = datetime.datetime.now(datetime.timezone.utc).strftime(
                "%Y-%m-%dT%H:%M:%SZ")
            doc["rows"] = [r for r in doc["rows"] if key_of(r) != k] + [row]
            doc["commit"] = row["commit"]
            doc["date"] = row["date"]
            save(args.out, doc)
            with open(md_path, "w") as f:
                f.write(table(doc))
            print(f"[{i + 1}/{len(todo)}] {n} tokens ({n_tok}), depth {d:g}, {m}: "
                  f"{'FOUND' if row['found'] else 'missed'} {key} -> {res['output']!r} "
                  f"({res['wall_s']:.0f} s, {time.time() - t_start:.0f} s so far)", flush=True)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    print(table(doc))


if __name__ == "__main__":
    main()
