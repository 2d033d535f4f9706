#!/usr/bin/env python3
"""`vela chat` through a pseudo-terminal, as a person types: the prompt, an
answer, /clear, an unknown command, Ctrl-C at the prompt (the program stays),
Ctrl-C during a long answer (the answer stops, the program stays), /exit.
Where the build has libedit (`vela chat --help` says so): Up + Enter sends
the line sent before, Left moves the cursor to insert a letter, Ctrl-C drops
a half-typed line, and the history file is written (mode 0600).

    tests/chat_pty.py VELA_BINARY WORK_DIR

Standard library only. Prints "N passed, N failed" at the end.
"""
import os
import pty
import select
import subprocess
import sys
import time

vela, work = sys.argv[1], sys.argv[2]
os.makedirs(work, exist_ok=True)
model = os.path.join(work, "chat_tiny.gguf")
if not os.path.exists(model):
    subprocess.run([vela, "mkmodel", "-q", "--preset", "tiny", "-o", model], check=True)

editing = b"Line editing: libedit" in subprocess.run([vela, "chat", "--help"],
                                                    capture_output=True).stdout
state = os.path.join(work, "state")  # the history file goes here, not into $HOME
history_file = os.path.join(state, "vela", "chat_history")
if os.path.exists(history_file):
    os.remove(history_file)

pid, fd = pty.fork()
if pid == 0:
    os.environ["XDG_STATE_HOME"] = state
    os.environ["TERM"] = "xterm"  # what the pseudo-terminal answers to
    os.execv(vela, [vela, "chat", "-m", model, "--backend", "cpu", "-t", "2", "--temp", "1.5", "--seed", "3",
                    "-n", "100000", "--no-progress", "-c", "512", "--ignore-eos"])

buf = b""
cursor = 0  # what earlier checks matched ends here


def read_until(token, timeout=60.0):
    """Reads the terminal until token shows up after the last match."""
    global buf, cursor
    deadline = time.time() + timeout
    while token not in buf[cursor:]:
        left = deadline - time.time()
        if left <= 0:
            return False
        r, _, _ = select.select([fd], [], [], left)
        if r:
            try:
                d = os.read(fd, 4096)
            except OSError:
                return False
            if not d:
                return False
            buf += d
    cursor = buf.index(token, cursor) + len(token)
    return True


def send(s):
    os.write(fd, s)


results = []


def check(name, ok):
    results.append(ok)
    print(("ok   " if ok else "FAIL ") + name)
    if not ok:
        print("  terminal so far: %r" % buf[-400:])


check("the prompt shows", read_until(b"> "))
send(b"Hello there\r")
time.sleep(0.5)
send(b"\x03")  # random weights and --ignore-eos: answers end by Ctrl-C
check("an answer, then the prompt again", read_until(b"> ", 120))
send(b"/clear\r")
check("/clear", read_until(b"(conversation cleared)"))
send(b"/nope\r")
check("an unknown command is named", read_until(b"(unknown command /nope"))
read_until(b"> ")
send(b"\x03")
check("Ctrl-C at the prompt keeps the program", read_until(b"(/exit or Ctrl-D to leave)"))
send(b"Tell me a long story\r")
time.sleep(1.0)
send(b"\x03")
check("Ctrl-C stops the answer", read_until(b"(stopped)", 60))
check("and the prompt comes back", read_until(b"> ", 30))
if editing:
    # The line is edited in place: read what the program did with it
    # through unknown commands, which it names as it got them.
    read_until(b"> ")
    send(b"/first\r")
    check("a command to recall", read_until(b"(unknown command /first:"))
    read_until(b"> ")
    send(b"\x1b[A\r")  # Up, Enter
    check("Up + Enter sends the line sent before", read_until(b"(unknown command /first:"))
    read_until(b"> ")
    send(b"/helo\x1b[Dl\r")  # Left, then an l before the o
    check("Left moves the cursor: /helo becomes /hello", read_until(b"(unknown command /hello:"))
    read_until(b"> ")
    send(b"half typed")
    time.sleep(0.3)
    send(b"\x03")
    check("Ctrl-C drops a half-typed line", read_until(b"(/exit or Ctrl-D to leave)"))
    send(b"/x\r")
    check("and the next line starts empty", read_until(b"(unknown command /x:"))
    read_until(b"> ")
elif os.path.exists("/usr/include/histedit.h"):
    check("libedit-dev is installed, so vela chat edits lines (reconfigure the build)", False)
else:
    print("skip line editing: this vela is built without libedit")
send(b"/exit\r")
_, status = os.waitpid(pid, 0)
check("/exit leaves with status 0", os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0)
if editing:
    # libedit's format: a header, then one line each, spaces as \040
    kept = open(history_file).read().replace("\\040", " ") if os.path.exists(history_file) else ""
    check("the history file holds the session's lines, for its user alone",
          "Hello there" in kept and "/hello" in kept and "half typed" not in kept and
          os.stat(history_file).st_mode & 0o777 == 0o600)
passed = sum(results)
print("%d passed, %d failed" % (passed, len(results) - passed))
sys.exit(0 if passed == len(results) else 1)
