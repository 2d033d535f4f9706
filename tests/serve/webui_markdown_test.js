// Cases of the chat page's markdown renderer (tools/serve/webui/markdown.js):
// first that a reply cannot inject markup (<script>, <img onerror>, event
// handlers, javascript: links, a quote breaking out of an href), then the
// markup it does render, as exact HTML.
//
//   node tests/serve/webui_markdown_test.js tools/serve/webui/markdown.js
//
// tests/serve/webui_browser.py also evaluates this file inside the served
// page, where velaMarkdown is the copy embedded in vela and the DOM checks
// run too (the HTML parsed by the browser: no element or attribute outside
// the renderer's list). The value of the script is {passed, failed, failures}.
var velaMarkdownResult = (function () {
  "use strict";
  const md = typeof velaMarkdown !== "undefined" ? velaMarkdown : require(require("path").resolve(process.argv[2]));
  const failures = [];
  let passed = 0;
  const check = (name, ok, detail) => {
    if (ok) passed++;
    else failures.push(name + (detail ? ": " + detail : ""));
  };

  // The renderer's output grammar: known tags with known attributes whose
  // values hold no quote, and text with no <, >, " or ' left raw.
  const TAGS = new Set(["p", "br", "h1", "h2", "h3", "h4", "h5", "h6", "strong", "em", "code",
    "pre", "ul", "ol", "li", "blockquote", "hr", "a"]);
  const ATTRS = {
    a: { href: /^(https?:\/\/|mailto:)/i, rel: /^noopener noreferrer nofollow$/, target: /^_blank$/ },
    code: { class: /^language-[\w+#.-]+$/ },
    ol: { start: /^\d+$/ },
  };
  function grammarProblem(html) {
    const rest = html.replace(/<(\/?)([a-z0-9]+)((?:\s+[a-z]+="[^"<>]*")*)\s*>/g, (all, close, name, attrs) => {
      if (!TAGS.has(name)) return "<BAD TAG " + name + ">";
      const re = /\s+([a-z]+)="([^"]*)"/g;
      let m;
      while ((m = re.exec(attrs))) {
        const want = (ATTRS[name] || {})[m[1]];
        if (close || !want || !want.test(m[2])) return "<BAD ATTR " + m[1] + ">";
      }
      return "";
    });
    const bad = /[<>"']/.exec(rest);
    return bad ? "raw " + JSON.stringify(bad[0]) + " in " + JSON.stringify(rest) : null;
  }
  // In a browser: what the HTML parser makes of it.
  function domProblem(html) {
    if (typeof document === "undefined") return null;
    const t = document.createElement("template");
    t.innerHTML = html;
    for (const el of t.content.querySelectorAll("*")) {
      if (!TAGS.has(el.localName)) return "element <" + el.localName + ">";
      for (const a of el.attributes)
        if (/^on/i.test(a.name) || !(ATTRS[el.localName] || {})[a.name]) return "attribute " + a.name + " on <" + el.localName + ">";
      if (el.localName === "a" && !/^(https?:|mailto:)$/.test(new URL(el.href).protocol)) return "link to " + el.href;
    }
    return null;
  }
  function textOf(html) {
    if (typeof document === "undefined") return null;
    const t = document.createElement("template");
    t.innerHTML = html;
    return t.content.textContent;
  }

  // Hostile replies: no markup of theirs survives, and where the text is
  // plain, a browser shows it as the model wrote it.
  const hostile = [
    ["script tag", "<script>alert(1)</script>", true],
    ["img onerror", '<img src=x onerror="alert(1)">', true],
    ["svg onload in a heading", "# Title <svg onload=alert(1)>", false],
    ["html in bold", "**<i onclick=alert(1)>bold</i>**", false],
    ["iframe in a list", "- <iframe src=javascript:alert(1)></iframe>", false],
    ["javascript: link", "[click](javascript:alert(1))", false],
    ["JAVASCRIPT: link", "[click](JAVASCRIPT:alert%281%29)", false],
    ["javascript: link with spaces", "[click]( javascript:alert`1`)", false],
    ["data: link, base64", "[x](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)", false],
    ["vbscript: link", "[x](vbscript:msgbox)", false],
    ["relative link", "[x](//evil.example/x)", false],
    ["data: link", "[click](data:text/html,<script>alert(1)</script>)", false],
    ["quote out of an href", '[x](https://a.example/"onmouseover="alert(1))', false],
    ["quote out of an href 2", "[x](https://a.example/'onmouseover='alert)", false],
    ["tag in an href", "[x](https://a.example/<script>)", false],
    ["entity text stays text", "&lt;script&gt; &amp; &#106;avascript", true],
    ["html in inline code", "`<b onmouseover=alert(1)>x</b>`", false],
    ["html in a code block", "```html\n<script>alert(1)</script>\n<img src=x onerror=alert(1)>\n```", false],
    ["unclosed code block", "```\n<script>alert(1)</script>", false],
    ["fence language breakout", '```"><img src=x onerror=alert(1)>\ncode\n```', false],
    ["NUL placeholders", "a\u00000\u0000b `c` \u00001\u0000", false],
    ["style tag", "<style>body{display:none}</style>", true],
    ["nested markup in a link", "[**`<script>`**](https://example.com/a_b*c*)", false],
    ["blockquote html", "> <img src=x onerror=alert(1)>", false],
  ];
  for (const [name, text, plain] of hostile) {
    let html;
    try {
      html = md.render(text);
    } catch (e) {
      check(name, false, "threw " + e);
      continue;
    }
    const g = grammarProblem(html);
    check(name + " (output grammar)", !g, g + " in " + JSON.stringify(html));
    const d = domProblem(html);
    check(name + " (parsed by the browser)", !d, d + " in " + JSON.stringify(html));
    const shown = textOf(html);
    if (plain && shown !== null)
      check(name + " (shown as written)", shown === text, JSON.stringify(shown));
  }
  check("escapeHtml", md.escapeHtml(`<a href="x" onclick='y'>&</a>`) ===
    "&lt;a href=&quot;x&quot; onclick=&#39;y&#39;&gt;&amp;&lt;/a&gt;");

  // What it renders.
  const LINK = ' rel="noopener noreferrer nofollow" target="_blank"';
  const cases = [
    ["# Title", "<h1>Title</h1>"],
    ["### Three ###", "<h3>Three</h3>"],
    ["**b** and *i* and __B__ and _I_ and `c`",
      "<p><strong>b</strong> and <em>i</em> and <strong>B</strong> and <em>I</em> and <code>c</code></p>"],
    ["2 * 3 * 4 and snake_case_name", "<p>2 * 3 * 4 and snake_case_name</p>"],
    ["- a\n- **b**\n* c", "<ul><li>a</li><li><strong>b</strong></li><li>c</li></ul>"],
    ["1. a\n2. b", "<ol><li>a</li><li>b</li></ol>"],
    ["3. a", '<ol start="3"><li>a</li></ol>'],
    ["[vela](https://example.com/?a=1&b=2)", '<p><a href="https://example.com/?a=1&amp;b=2"' + LINK + ">vela</a></p>"],
    ["[mail](mailto:a@b.c)", '<p><a href="mailto:a@b.c"' + LINK + ">mail</a></p>"],
    ["```c\nint x = 1 < 2;\n```\nafter", '<pre><code class="language-c">int x = 1 &lt; 2;</code></pre>\n<p>after</p>'],
    ["~~~\n**not bold**\n~~~", "<pre><code>**not bold**</code></pre>"],
    ["line1\nline2\n\npara2", "<p>line1<br>line2</p>\n<p>para2</p>"],
    ["text\n- item", "<p>text</p>\n<ul><li>item</li></ul>"],
    ["> quoted\n> *twice*", "<blockquote>quoted<br><em>twice</em></blockquote>"],
    ["---", "<hr>"],
    ["a\r\nb", "<p>a<br>b</p>"],
    ["", ""],
  ];
  for (const [text, want] of cases) {
    const got = md.render(text);
    check("renders " + JSON.stringify(text), got === want, "got " + JSON.stringify(got) + ", want " + JSON.stringify(want));
  }
  return { passed: passed, failed: failures.length, failures: failures };
})();

if (typeof module !== "undefined" && typeof require !== "undefined" && require.main === module) {
  for (const f of velaMarkdownResult.failures) console.log("FAIL " + f);
  console.log(velaMarkdownResult.passed + " passed, " + velaMarkdownResult.failed + " failed");
  process.exit(velaMarkdownResult.failed ? 1 : 0);
}
velaMarkdownResult;
