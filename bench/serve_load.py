#!/usr/bin/env python3
"""Load generator for OpenAI-compatible servers (vela serve, llama-server).

Sends a fixed set of prompts with Poisson arrivals, every request streamed
(server-sent events), and measures per request the time to first token
(TTFT: request sent -> first chunk with text), the inter-token latency (ITL:
the gaps between chunks with text; both servers send one chunk per token)
and the end-to-end latency. Reports requests/s, output tokens/s, TTFT, ITL
and latency p50/p99, on stdout and as JSON (bench/results/ by default).

Python's standard library only, so it runs anywhere python3 does:

  bench/serve_load.py --url http://127.0.0.1:8080 --requests 64 --rate 2 \
      --max-tokens 64 --label vela-p8

Requests are identical from run to run for the same --seed: the same
arrival times, request i asks prompts[i % len(prompts)] with seed --seed + i.
Output tokens come from the final chunk's usage (stream_options.
include_usage) when the server sends it, else from the number of text
chunks.
"""

import argparse
import http.client
import json
import os
import random
import sys
import threading
import time
import urllib.parse

# A fixed set of prompts of mixed lengths (questions a chat model answers in
# a few sentences to a few paragraphs).
DEFAULT_PROMPTS = [
    "What is the capital of France?",
    "Explain in two sentences why the sky is blue.",
    "Write a haiku about the sea.",
    "List three uses of a paperclip.",
    "What is the difference between a virus and a bacterium? Answer briefly.",
    "Describe how a bicycle works to a ten-year-old.",
    "Give me a short recipe for pancakes.",
    "Summarize the plot of Romeo and Juliet in a paragraph.",
    "What are the benefits of regular exercise? Give five points.",
    "Translate 'good morning, how are you?' into Spanish and French.",
    "Write a short story about a robot who learns to paint, in about a hundred words.",
    "How do plants make their food?",
    "Explain what a prime number is, with three examples.",
    "Why do we have seasons on Earth?",
    "Write a polite email declining a meeting invitation.",
    "What should I pack for a weekend camping trip? Make a list.",
]


def percentile(values, p):
    """The p-th percentile (0..100) by linear interpolation; None when empty."""
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


class Client:
    def __init__(self, url, api_key, timeout):
        u = urllib.parse.urlsplit(url)
        if u.scheme != "http":
            raise SystemExit("serve_load: only http:// URLs are supported")
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or 80
        self.base = u.path.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout

    def headers(self):
        h = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            h["Authorization"] = "Bearer " + self.api_key
        return h

    def get_json(self, path):
        c = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            c.request("GET", self.base + path, headers=self.headers())
            r = c.getresponse()
            body = r.read()
            return r.status, json.loads(body) if body else None
        finally:
            c.close()

    def stream(self, path, body):
        """POSTs body and yields (time, event) for each SSE data line."""
        c = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            c.request("POST", self.base + path, body=json.dumps(body), headers=self.headers())
            r = c.getresponse()
            if r.status != 200:
                raise RuntimeError("HTTP %d: %s" % (r.status, r.read()[:300].decode("utf-8", "replace")))
            while True:
                line = r.readline()
                if not line:
                    return
                now = time.perf_counter()
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    return
                yield now, json.loads(data)
        finally:
            c.close()


def chunk_text(ev, chat):
    """The text of a stream chunk (choice 0), '' when it carries none."""
    choices = ev.get("choices") or []
    if not choices:
        return ""
    ch = choices[0]
    if chat:
        return (ch.get("delta") or {}).get("content") or ""
    return ch.get("text") or ""


def one_request(client, args, i, prompt, model, t0):
    chat = args.endpoint == "chat"
    body = {
        "model": model,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "seed": args.seed + i,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if args.ignore_eos:
        body["ignore_eos"] = True
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = prompt
        path = "/v1/completions"
    rec = {"index": i, "prompt_index": i % len(args.prompt_list), "sent_s": None}
    times, n_chunks, usage, text = [], 0, None, []
    start = time.perf_counter()
    rec["sent_s"] = start - t0
    try:
        for now, ev in client.stream(path, body):
            if ev.get("usage"):
                usage = ev["usage"]
            t = chunk_text(ev, chat)
            if t:
                times.append(now)
                n_chunks += 1
                text.append(t)
        end = time.perf_counter()
    except Exception as e:  # a failed request is counted, not fatal
        rec["error"] = str(e)[:300]
        return rec
    rec["latency_s"] = end - start
    rec["ttft_s"] = times[0] - start if times else None
    rec["itl_s"] = [round(b - a, 6) for a, b in zip(times, times[1:])]
    rec["completion_tokens"] = (usage or {}).get("completion_tokens", n_chunks)
    rec["prompt_tokens"] = (usage or {}).get("prompt_tokens")
    rec["chunks"] = n_chunks
    rec["end_s"] = end - t0
    if args.keep_text:
        rec["text"] = "".join(text)
    return rec


def run_load(client, args, model):
    rng = random.Random(args.seed)
    arrivals, t = [], 0.0
    for _ in range(args.requests):
        arrivals.append(t)
        if args.rate > 0:
            t += rng.expovariate(args.rate)
    results = [None] * args.requests
    threads = []
    t0 = time.perf_counter()
    for i, at in enumerate(arrivals):
        delay = t0 + at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        prompt = args.prompt_list[i % len(args.prompt_list)]

        def work(i=i, prompt=prompt):
            results[i] = one_request(client, args, i, prompt, model, t0)

        th = threading.Thread(target=work, daemon=True)
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    return results, time.perf_counter() - t0


def summarize(results, wall_s):
    ok = [r for r in results if r and "error" not in r]
    errors = [r for r in results if not r or "error" in r]
    ttft = [r["ttft_s"] for r in ok if r["ttft_s"] is not None]
    itl = [x for r in ok for x in r["itl_s"]]
    lat = [r["latency_s"] for r in ok]
    out_tok = sum(r["completion_tokens"] or 0 for r in ok)
    # The measured span: first request sent to last response finished.
    span = (max(r["end_s"] for r in ok) - min(r["sent_s"] for r in ok)) if ok else wall_s

    def ms(v):
        return None if v is None else round(v * 1e3, 2)

    return {
        "requests": len(results),
        "completed": len(ok),
        "errors": len(errors),
        "duration_s": round(span, 3),
        "requests_per_s": round(len(ok) / span, 4) if span > 0 else None,
        "output_tokens": out_tok,
        "output_tokens_per_s": round(out_tok / span, 3) if span > 0 else None,
        "ttft_ms": {"p50": ms(percentile(ttft, 50)), "p99": ms(percentile(ttft, 99)),
                    "mean": ms(sum(ttft) / len(ttft)) if ttft else None},
        "itl_ms": {"p50": ms(percentile(itl, 50)), "p99": ms(percentile(itl, 99)),
                   "mean": ms(sum(itl) / len(itl)) if itl else None},
        "latency_ms": {"p50": ms(percentile(lat, 50)), "p99": ms(percentile(lat, 99))},
        "first_errors": [r.get("error") if r else "no result" for r in errors[:5]],
    }


def pick_model(client, given):
    if given:
        return given
    try:
        status, js = client.get_json("/v1/models")
        if status == 200 and js and js.get("data"):
            return js["data"][0]["id"]
    except Exception:
        pass
    return "default"


def wait_ready(client, seconds):
    deadline = time.time() + seconds
    while True:
        try:
            status, _ = client.get_json("/health")
            if status == 200:
                return
        except Exception:
            pass
        if time.time() > deadline:
            raise SystemExit("serve_load: %s:%d not ready (GET /health) after %d s"
                             % (client.host, client.port, seconds))
        time.sleep(0.5)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--endpoint", choices=["chat", "completions"], default="chat")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--rate", type=float, default=1.0,
                    help="mean arrivals per second (Poisson); 0: all at once")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--ignore-eos", action="store_true",
                    help="every request generates --max-tokens (vela, llama-server extension)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--prompts", help="a file of prompts, one per line (default: built in)")
    ap.add_argument("--model", help="the model id to send (default: the first of /v1/models)")
    ap.add_argument("--api-key")
    ap.add_argument("--warmup", type=int, default=1, help="requests sent first, not measured")
    ap.add_argument("--wait", type=int, default=120, help="seconds to wait for /health")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per request")
    ap.add_argument("--label", default="server")
    ap.add_argument("--out", help="JSON file (default: bench/results/serve_load-LABEL.json)")
    ap.add_argument("--keep-text", action="store_true", help="store each reply in the JSON")
    args = ap.parse_args(argv)
    if args.requests < 1:
        raise SystemExit("serve_load: --requests must be at least 1")
    if args.prompts:
        with open(args.prompts, encoding="utf-8") as f:
            args.prompt_list = [l.rstrip("\n") for l in f if l.strip()]
    else:
        args.prompt_list = DEFAULT_PROMPTS
    if not args.prompt_list:
        raise SystemExit("serve_load: no prompts")

    client = Client(args.url, args.api_key, args.timeout)
    wait_ready(client, args.wait)
    model = pick_model(client, args.model)
    for w in range(args.warmup):
        r = one_request(client, args, -1 - w, args.prompt_list[w % len(args.prompt_list)], model,
                        time.perf_counter())
        if "error" in r:
            raise SystemExit("serve_load: warm-up request failed: " + r["error"])

    results, wall = run_load(client, args, model)
    summary = summarize(results, wall)
    report = {
        "tool": "bench/serve_load.py",
        "label": args.label,
        "url": args.url,
        "model": model,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "settings": {
            "endpoint": args.endpoint, "requests": args.requests, "rate": args.rate,
            "max_tokens": args.max_tokens, "temperature": args.temperature,
            "ignore_eos": args.ignore_eos, "seed": args.seed, "warmup": args.warmup,
            "prompts": len(args.prompt_list),
        },
        "results": summary,
        "per_request": results,
    }
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                   "serve_load-%s.json" % args.label)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    s = summary
    print("%-16s %3d/%d ok  %6.2f req/s  %8.2f out tok/s  TTFT p50 %s p99 %s ms  ITL p50 %s p99 %s ms"
          % (args.label, s["completed"], s["requests"], s["requests_per_s"] or 0,
             s["output_tokens_per_s"] or 0, s["ttft_ms"]["p50"], s["ttft_ms"]["p99"],
             s["itl_ms"]["p50"], s["itl_ms"]["p99"]))
    print("serve_load: wrote " + out, file=sys.stderr)
    return 0 if s["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
