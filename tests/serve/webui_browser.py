#!/usr/bin/env python3
"""The chat page of `vela serve` in headless Chromium, on the real
SmolLM2-135M-Instruct model: the page loads under its Content-Security-Policy
(no error in the console), the markdown renderer's cases
(webui_markdown_test.js) pass inside it, a typed message gets a streamed
answer in the page, the stop button ends a long answer, and --no-webui
answers 404 at /. A screenshot of the conversation is saved.

    tests/serve/webui_browser.py VELA_BINARY WORK_DIR

Standard library only: Chromium is driven through the DevTools protocol on
a pipe (--remote-debugging-pipe: fd 3 in, fd 4 out, NUL-terminated JSON).
Exit 77 (ctest: skipped) when no Chromium is installed (apt-get install
chromium; or VELA_CHROMIUM=PATH) or the model is not in the cache (bash
tools/model_cache.sh). Prints "N passed, N failed" and the screenshots'
paths.
"""
import base64
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))
vela, work = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
os.makedirs(work, exist_ok=True)
os.environ.setdefault("VELA_BIN", vela)
os.environ.setdefault("VELA_SERVE_WORK", work)
sys.path.insert(0, here)
from serve_helpers import wait_ready, stop  # noqa: E402


def skip(why):
    print("SKIP: " + why)
    sys.exit(77)


chromium = os.environ.get("VELA_CHROMIUM") or next(
    (p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome",
                                           "google-chrome-stable", "chrome")) if p), None)
if not chromium:
    skip("no Chromium found (apt-get install chromium, or VELA_CHROMIUM=PATH): the chat page "
         "is not tested in a browser")
root = os.path.dirname(os.path.dirname(here))
model = subprocess.run(["bash", os.path.join(root, "tools", "model_cache.sh"), "--path"],
                       capture_output=True, text=True, check=True).stdout.strip()
if not os.path.exists(model):
    skip("%s is not in the model cache (bash tools/model_cache.sh fetches it)" % model)

results = []


def check(name, ok, detail=""):
    results.append(bool(ok))
    print(("ok   " if ok else "FAIL ") + name + ("" if ok or not detail else ": " + str(detail)))


def start_server(name, extra):
    log_path = os.path.join(work, name + ".log")
    log = open(log_path, "w")
    p = subprocess.Popen([vela, "serve", "-m", model, "--backend", "cpu", "-t", "2", "--port", "0",
                          "-np", "1", "-c", "2048", "--no-progress"] + extra,
                         stdout=log, stderr=subprocess.STDOUT)
    return p, wait_ready(p, log_path)


def http_get(port, path, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", path, headers=headers or {})
    r = c.getresponse()
    body = r.read()
    c.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, body


class Browser:
    """Headless Chromium over --remote-debugging-pipe."""

    def __init__(self, profile):
        to_chrome_r, self.to_chrome = os.pipe()
        self.from_chrome, from_chrome_w = os.pipe()

        def fds():  # the child's fd 3 reads our commands, fd 4 writes its answers
            a, b = os.dup(to_chrome_r), os.dup(from_chrome_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        args = [chromium, "--headless=new", "--remote-debugging-pipe", "--disable-gpu",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                "--disable-background-networking", "--disable-sync", "--mute-audio",
                "--user-data-dir=" + profile, "--window-size=900,900", "about:blank"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            args.insert(1, "--no-sandbox")  # Chromium refuses its sandbox as root
        self.log = open(os.path.join(work, "chromium.log"), "w")
        self.p = subprocess.Popen(args, preexec_fn=fds, pass_fds=(3, 4), stdout=self.log,
                                  stderr=subprocess.STDOUT)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self.buf = b""
        self.next_id = 0
        self.events = []
        self.session = None

    def _read_message(self, deadline):
        while b"\0" not in self.buf:
            if time.time() > deadline:
                raise TimeoutError("no answer from Chromium")
            d = os.read(self.from_chrome, 1 << 16)
            if not d:
                raise RuntimeError("Chromium closed its pipe (see chromium.log)")
            self.buf += d
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method, params=None, session=True, timeout=30):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self.to_chrome, json.dumps(msg).encode() + b"\0")
        deadline = time.time() + timeout
        while True:
            m = self._read_message(deadline)
            if m.get("id") == self.next_id:
                if "error" in m:
                    raise RuntimeError("%s: %s" % (method, m["error"]))
                return m.get("result", {})
            self.events.append(m)

    def open(self, url):
        target = self.call("Target.createTarget", {"url": "about:blank"}, session=False)
        self.session = self.call("Target.attachToTarget",
                                 {"targetId": target["targetId"], "flatten": True},
                                 session=False)["sessionId"]
        self.call("Runtime.enable")
        self.call("Log.enable")
        self.call("Page.enable")
        self.call("Page.navigate", {"url": url})

    def eval(self, expr, timeout=30):
        r = self.call("Runtime.evaluate", {"expression": expr, "returnByValue": True,
                                           "awaitPromise": True}, timeout=timeout)
        if "exceptionDetails" in r:
            raise RuntimeError("%s: %s" % (expr[:60], r["exceptionDetails"]))
        return r["result"].get("value")

    def wait_for(self, expr, timeout):
        """Polls expr until it is truthy; its last value."""
        deadline = time.time() + timeout
        v = None
        while time.time() < deadline:
            v = self.eval(expr)
            if v:
                return v
            time.sleep(0.1)
        return v

    def screenshot(self, path):
        png = base64.b64decode(self.call("Page.captureScreenshot", {"format": "png"})["data"])
        with open(path, "wb") as f:
            f.write(png)
        return path

    def problems(self):
        """Console errors and CSP violations the page reported."""
        out = []
        for m in self.events:
            if m.get("method") == "Runtime.consoleAPICalled" and m["params"]["type"] == "error":
                out.append(" ".join(str(a.get("value", a.get("description", "")))
                                    for a in m["params"]["args"]))
            if m.get("method") == "Runtime.exceptionThrown":
                out.append(m["params"]["exceptionDetails"].get("text", "exception"))
            if m.get("method") == "Log.entryAdded" and m["params"]["entry"]["level"] == "error":
                e = m["params"]["entry"]
                if "favicon" not in e.get("url", ""):
                    out.append(e.get("text", ""))
        return out

    def close(self):
        try:
            self.call("Browser.close", session=False, timeout=5)
        except Exception:
            pass
        try:
            self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        os.close(self.to_chrome)
        os.close(self.from_chrome)


t0 = time.time()
shots = []
p, port = start_server("webui", [])
browser = None
try:
    # HTTP: the page, its headers and files.
    st, h, body = http_get(port, "/")
    check("GET / is the page", st == 200 and h.get("content-type") == "text/html; charset=utf-8"
          and b"/webui/app.js" in body, (st, h.get("content-type")))
    csp = h.get("content-security-policy", "")
    check("a Content-Security-Policy allowing scripts from the server alone",
          "script-src 'self'" in csp and "default-src 'none'" in csp and "unsafe" not in csp, csp)
    check("revalidated on every load", h.get("cache-control") == "no-cache" and h.get("etag"), h)
    st2, _, _ = http_get(port, "/", {"If-None-Match": h.get("etag", "")})
    check("304 for the same build", st2 == 304, st2)
    st, h, _ = http_get(port, "/webui/app.js")
    check("the script's type", st == 200 and h.get("content-type", "").startswith("text/javascript"),
          (st, h.get("content-type")))
    check("no other file under /webui/", http_get(port, "/webui/nope.js")[0] == 404)

    # The browser.
    profile = tempfile.mkdtemp(prefix="vela-chromium-", dir=work)
    browser = Browser(profile)
    base = "http://127.0.0.1:%d" % port
    browser.open(base + "/")
    ready = browser.wait_for("document.readyState === 'complete' && typeof velaMarkdown === "
                             "'object' && document.getElementById('input') !== null", 30)
    check("the page loads with its scripts", ready)

    # The renderer's cases, in the page, on the copy vela serves.
    cases = open(os.path.join(here, "webui_markdown_test.js")).read()
    r = browser.eval(cases) or {}
    check("markdown cases in the browser: %s passed" % r.get("passed"),
          r.get("failed") == 0 and r.get("passed", 0) > 0, r.get("failures"))

    # A hostile answer shown the page's way, live: nothing of it runs or loads.
    browser.eval("""(() => {
        const div = document.createElement('div');
        div.className = 'msg assistant hostile';
        div.innerHTML = velaMarkdown.render('<img src=x onerror="window.pwned=1">' +
            '<script>window.pwned=2</script> [x](javascript:window.pwned=3)');
        document.getElementById('log').appendChild(div);
    })()""")
    time.sleep(0.3)
    check("a hostile answer runs nothing", browser.eval(
        "window.pwned === undefined && !document.querySelector('#log img, #log script, #log a')"
        " && document.querySelector('.hostile').textContent.includes('<script>')"))
    browser.eval("document.querySelector('.hostile').remove()")

    # A conversation: settings, a typed message, the streamed answer.
    browser.eval("""(() => {
        document.getElementById('settings').open = true;
        for (const [id, v] of [['temperature', '0'], ['max-tokens', '64'],
                               ['system', 'You are a helpful assistant. Answer briefly.']]) {
            const el = document.getElementById(id);
            el.value = v;
            el.dispatchEvent(new Event('change'));
        }
        const input = document.getElementById('input');
        input.focus();
        input.value = 'What is the capital of France?';
        input.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter', bubbles: true}));
    })()""")
    state = browser.wait_for("(() => { const a = document.querySelector('.msg.assistant');"
                             " return a && a.dataset.state !== 'streaming' && a.dataset.state; })()",
                             60)
    answer = browser.eval("document.querySelector('.msg.assistant').textContent")
    check("the streamed answer shows", state == "done" and answer and answer.strip(),
          (state, answer))
    print("     answer: %r" % (answer or "")[:200])
    check("the message shows as typed",
          browser.eval("document.querySelector('.msg.user').textContent") ==
          "What is the capital of France?")
    check("the settings were kept", browser.eval(
        "JSON.parse(localStorage.getItem('vela.chat.settings')).temperature") == "0")
    shots.append(browser.screenshot(os.path.join(work, "webui_chat.png")))

    # Stop: a long answer ends when the button is pressed.
    browser.eval("""(() => {
        const mt = document.getElementById('max-tokens');
        mt.value = '2000';
        mt.dispatchEvent(new Event('change'));
        const t = document.getElementById('temperature');
        t.value = '0.8';
        t.dispatchEvent(new Event('change'));
        document.getElementById('input').value = 'Write a very long story about a lighthouse keeper.';
        document.getElementById('send').click();
    })()""")
    started = browser.wait_for("(() => { const a = document.querySelectorAll('.msg.assistant')[1];"
                               " return a && a.textContent.length > 20; })()", 60)
    browser.eval("document.getElementById('stop').click()")
    state = browser.wait_for("(() => { const a = document.querySelectorAll('.msg.assistant')[1];"
                             " return a.dataset.state !== 'streaming' && a.dataset.state; })()", 10)
    check("Stop ends the answer", started and state == "stopped", (started, state))
    check("the page can send again",
          browser.eval("!document.getElementById('send').disabled && "
                       "document.getElementById('stop').disabled"))
    shots.append(browser.screenshot(os.path.join(work, "webui_stopped.png")))
    check("no console error or CSP violation", not browser.problems(), browser.problems())
finally:
    if browser:
        browser.close()
    stop(p)

# --no-webui: / is 404, the API unchanged.
p, port = start_server("webui-off", ["--no-webui"])
try:
    check("--no-webui: / is 404", http_get(port, "/")[0] == 404)
    check("--no-webui: /webui/app.js is 404", http_get(port, "/webui/app.js")[0] == 404)
    check("--no-webui: the API still answers", http_get(port, "/v1/models")[0] == 200)
finally:
    stop(p)

for s in shots:
    print("screenshot: " + s)
passed = sum(results)
print("%d passed, %d failed (%.1f s)" % (passed, len(results) - passed, time.time() - t0))
sys.exit(0 if passed == len(results) else 1)
