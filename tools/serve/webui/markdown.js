// The chat page's markdown renderer: headings, bold, italic, inline code,
// fenced code blocks, lists, block quotes, rules, links and paragraphs.
//
// The contract: the model's text is HTML-escaped before any tag is added,
// so the output holds only the tags written below (p, br, h1-h6, strong,
// em, code, pre, ul, ol, li, blockquote, hr, a), and an <a> only with an
// http:, https: or mailto: href (anything else stays text). The page sets
// the result as innerHTML; its Content-Security-Policy is the second line of
// defence, not the first. Works in a browser (window.velaMarkdown) and in
// node (module.exports) for tests/serve/webui_markdown_test.js.
(function (root) {
  "use strict";

  function escapeHtml(s) {
    return s
      .replace(/&/g, "&amp;")
      .replace(/</g, "&lt;")
      .replace(/>/g, "&gt;")
      .replace(/"/g, "&quot;")
      .replace(/'/g, "&#39;");
  }

  // \u0000 marks the placeholders below; the model's own NULs are dropped.
  const HOLE = /\u0000(\d+)\u0000/g;

  function emphasis(s) {
    return s
      .replace(/\*\*(?=\S)([^*\n]*?\S)\*\*/g, "<strong>$1</strong>")
      .replace(/(^|[^\w])__(?=\S)([^_\n]*?\S)__(?!\w)/g, "$1<strong>$2</strong>")
      .replace(/\*(?=\S)([^*\n]*?\S)\*/g, "<em>$1</em>")
      .replace(/(^|[^\w])_(?=\S)([^_\n]*?\S)_(?!\w)/g, "$1<em>$2</em>");
  }

  // One block's inline markup. raw is the model's text; every character of
  // it reaches the output through escapeHtml.
  function inline(raw) {
    const held = []; // finished HTML of code spans and links
    const hold = (html) => "\u0000" + (held.push(html) - 1) + "\u0000";
    // Code spans first: their content is literal.
    let s = raw.replace(/`([^`\n]+)`/g, (_, code) => hold("<code>" + escapeHtml(code) + "</code>"));
    s = escapeHtml(s);
    // Links on the escaped text: the URL cannot hold a quote or a tag, and
    // only these schemes make a link.
    s = s.replace(/\[([^\]\n]+)\]\(([^()\s\u0000]+)\)/g, (all, text, url) =>
      /^(https?:\/\/|mailto:)/i.test(url)
        ? hold('<a href="' + url + '" rel="noopener noreferrer nofollow" target="_blank">' +
               emphasis(text) + "</a>")
        : all);
    s = emphasis(s);
    // Held pieces may hold others (a code span in a link's text).
    while (/\u0000\d+\u0000/.test(s)) s = s.replace(HOLE, (_, i) => held[Number(i)]);
    return s;
  }

  const FENCE = /^\s{0,3}(`{3,}|~{3,})\s*([\w+#.-]*)[^`]*$/;
  const HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
  const RULE = /^\s{0,3}([-*_])(\s*\1){2,}\s*$/;
  const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
  const QUOTE = /^\s{0,3}>\s?(.*)$/;

  function render(text) {
    const lines = String(text).replace(/\u0000/g, "").replace(/\r\n?/g, "\n").split("\n");
    const out = [];
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      let m;
      if ((m = FENCE.exec(line))) {
        // Up to the closing fence; a stream still inside the block shows it open.
        const body = [];
        for (i++; i < lines.length; i++) {
          const close = /^\s{0,3}(`{3,}|~{3,})\s*$/.exec(lines[i]);
          if (close && close[1][0] === m[1][0] && close[1].length >= m[1].length) {
            i++;
            break;
          }
          body.push(lines[i]);
        }
        const lang = m[2] ? ' class="language-' + escapeHtml(m[2]) + '"' : "";
        out.push("<pre><code" + lang + ">" + escapeHtml(body.join("\n")) + "</code></pre>");
        continue;
      }
      if (!line.trim()) {
        i++;
        continue;
      }
      if ((m = HEADING.exec(line))) {
        const n = m[1].length;
        out.push("<h" + n + ">" + inline(m[2]) + "</h" + n + ">");
        i++;
        continue;
      }
      if (RULE.test(line)) {
        out.push("<hr>");
        i++;
        continue;
      }
      if ((m = ITEM.exec(line))) {
        // One list of the first item's kind; deeper items stay in it (flat).
        const ordered = /\d/.test(m[2]);
        const start = ordered ? parseInt(m[2], 10) : 1;
        const items = [];
        while (i < lines.length && (m = ITEM.exec(lines[i])) && /\d/.test(m[2]) === ordered) {
          items.push("<li>" + inline(m[3]) + "</li>");
          i++;
        }
        out.push(ordered
          ? "<ol" + (start !== 1 ? ' start="' + start + '"' : "") + ">" + items.join("") + "</ol>"
          : "<ul>" + items.join("") + "</ul>");
        continue;
      }
      if (QUOTE.test(line)) {
        const body = [];
        while (i < lines.length && (m = QUOTE.exec(lines[i]))) {
          body.push(inline(m[1]));
          i++;
        }
        out.push("<blockquote>" + body.join("<br>") + "</blockquote>");
        continue;
      }
      // A paragraph: up to a blank line or the start of another block.
      const para = [];
      while (i < lines.length && lines[i].trim() && !FENCE.test(lines[i]) &&
             !HEADING.test(lines[i]) && !RULE.test(lines[i]) && !ITEM.test(lines[i]) &&
             !QUOTE.test(lines[i])) {
        para.push(inline(lines[i]));
        i++;
      }
      out.push("<p>" + para.join("<br>") + "</p>");
    }
    return out.join("\n");
  }

  const api = { render: render, escapeHtml: escapeHtml };
  if (typeof module !== "undefined" && module.exports) module.exports = api;
  else root.velaMarkdown = api;
})(typeof window !== "undefined" ? window : this);
