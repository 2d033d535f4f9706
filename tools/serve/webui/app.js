// The chat page of `vela serve` (served at /, embedded in the binary): a
// conversation with the served model over the server's own
// /v1/chat/completions, streamed as server-sent events. The user's text is
// shown with textContent; the model's goes through velaMarkdown.render
// (markdown.js), which escapes it before adding any tag. Each answer's
// element carries data-state: streaming, done, stopped or error (the page's
// test, tests/serve/webui_browser.py, waits on it).
(function () {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const log = $("log"), input = $("input"), form = $("composer");
  const sendButton = $("send"), stopButton = $("stop");
  const fields = {
    temperature: $("temperature"),
    max_tokens: $("max-tokens"),
    system: $("system"),
    api_key: $("api-key"),
  };
  const STORE = "vela.chat.settings";

  let messages = []; // the conversation: {role, content}
  let controller = null; // the running request's AbortController

  // --- settings ---------------------------------------------------------------------
  function loadSettings() {
    let saved = {};
    try {
      saved = JSON.parse(localStorage.getItem(STORE) || "{}") || {};
    } catch (e) {
      saved = {};
    }
    for (const [k, el] of Object.entries(fields)) if (typeof saved[k] === "string") el.value = saved[k];
  }
  function saveSettings() {
    const out = {};
    for (const [k, el] of Object.entries(fields)) out[k] = el.value;
    try {
      localStorage.setItem(STORE, JSON.stringify(out));
    } catch (e) {
      // private mode or storage off: the settings last as long as the page
    }
  }
  function headers() {
    const h = { "Content-Type": "application/json" };
    if (fields.api_key.value) h.Authorization = "Bearer " + fields.api_key.value;
    return h;
  }

  // --- the conversation on screen -----------------------------------------------------
  function bubble(role) {
    const div = document.createElement("div");
    div.className = "msg " + role;
    log.appendChild(div);
    return div;
  }
  function scrollDown() {
    log.scrollTop = log.scrollHeight;
  }
  function showAnswer(div, text) {
    div.innerHTML = window.velaMarkdown.render(text);
    scrollDown();
  }
  function note(div, text, cls) {
    const span = document.createElement("p");
    span.className = cls || "note";
    span.textContent = text;
    div.appendChild(span);
  }
  function setBusy(busy) {
    sendButton.disabled = busy;
    stopButton.disabled = !busy;
  }

  // --- one exchange ---------------------------------------------------------------------
  function requestBody() {
    const msgs = [];
    if (fields.system.value.trim()) msgs.push({ role: "system", content: fields.system.value });
    const body = { messages: msgs.concat(messages), stream: true };
    const t = parseFloat(fields.temperature.value);
    if (Number.isFinite(t)) body.temperature = t;
    const n = parseInt(fields.max_tokens.value, 10);
    if (Number.isFinite(n) && n > 0) body.max_tokens = n;
    return body;
  }

  // Reads the event stream; onDelta(text) for each piece of the answer.
  async function readEvents(response, onDelta) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let pending = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      pending += decoder.decode(value, { stream: true }).replace(/\r/g, "");
      let end;
      while ((end = pending.indexOf("\n\n")) >= 0) {
        const event = pending.slice(0, end);
        pending = pending.slice(end + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") return;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message || "the server reported an error");
          const choice = chunk.choices && chunk.choices[0];
          if (choice && choice.delta && typeof choice.delta.content === "string") onDelta(choice.delta.content);
        }
      }
    }
  }

  async function send(text) {
    messages.push({ role: "user", content: text });
    bubble("user").textContent = text;
    const div = bubble("assistant");
    div.dataset.state = "streaming";
    scrollDown();
    controller = new AbortController();
    setBusy(true);
    let reply = "", drawn = false;
    const draw = () => {
      drawn = false;
      showAnswer(div, reply);
    };
    try {
      const r = await fetch("/v1/chat/completions", {
        method: "POST",
        headers: headers(),
        body: JSON.stringify(requestBody()),
        signal: controller.signal,
      });
      if (!r.ok) {
        let msg = "HTTP " + r.status;
        try {
          const j = await r.json();
          if (j.error && j.error.message) msg += ": " + j.error.message;
        } catch (e) {
          // not JSON: the status says enough
        }
        throw new Error(msg);
      }
      await readEvents(r, (piece) => {
        reply += piece;
        if (!drawn) {
          drawn = true;
          requestAnimationFrame(draw);
        }
      });
      draw();
      div.dataset.state = "done";
    } catch (e) {
      draw();
      if (e.name === "AbortError") {
        note(div, "(stopped)");
        div.dataset.state = "stopped";
      } else {
        note(div, String(e.message || e), "error");
        div.dataset.state = "error";
      }
    } finally {
      controller = null;
      setBusy(false);
      if (reply) {
        messages.push({ role: "assistant", content: reply });
      } else if (div.dataset.state === "error") {
        // Nothing came back: the message goes back into the box to try again.
        messages.pop();
        if (!input.value) input.value = text;
      }
      scrollDown();
      input.focus();
    }
  }

  // --- wiring -----------------------------------------------------------------------------
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const text = input.value.trim();
    if (!text || controller) return;
    input.value = "";
    send(text);
  });
  input.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      form.requestSubmit();
    }
  });
  stopButton.addEventListener("click", () => {
    if (controller) controller.abort();
  });
  $("new-chat").addEventListener("click", () => {
    if (controller) controller.abort();
    messages = [];
    log.replaceChildren();
    input.focus();
  });
  for (const el of Object.values(fields)) el.addEventListener("change", saveSettings);
  loadSettings();
  setBusy(false);

  fetch("/v1/models", { headers: headers() })
    .then((r) => (r.ok ? r.json() : null))
    .then((j) => {
      const id = j && j.data && j.data[0] && j.data[0].id;
      if (id) {
        $("model").textContent = id;
        document.title = id + " · vela chat";
      }
    })
    .catch(() => {});
})();
