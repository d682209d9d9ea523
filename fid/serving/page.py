"""The one page `fid serve` shows at GET /: a question box that calls POST /api/ask and shows
the answer and a table of the passages read (rank, id, title, retrieval score, the reader's
attention share, the text with the answer marked where it occurs).

Self-contained (inline CSS and script, no external assets: the page works offline and loads
nothing from elsewhere), and kept here as a Python string rather than a package data file so
that every install of the package has it without packaging rules. The server sends it with a
Content-Security-Policy that allows exactly this script and style (`csp`), so that nothing
injected into the page could run. The script builds every cell with textContent, never
innerHTML: a passage's text is shown, never interpreted.

The table's rows carry the API's values as data attributes (data-id, data-score,
data-attention: JavaScript's String(number) is the shortest text that round-trips, as Python's
repr), so that a browser test reads what the page was given, as well as what it shows.
"""

from __future__ import annotations

import base64
import hashlib

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 70rem; padding: 0 1rem;
       color: #1d1d1f; }
h1 { font-size: 1.4rem; }
#system { color: #555; font-size: 0.9rem; }
form { display: flex; gap: 0.5rem; margin: 1rem 0; }
#question { flex: 1; font-size: 1rem; padding: 0.4rem; }
button { font-size: 1rem; padding: 0.4rem 1rem; }
#error { color: #a00; white-space: pre-wrap; }
#answer { font-size: 1.3rem; font-weight: 600; }
table { border-collapse: collapse; width: 100%; margin-top: 1rem; font-size: 0.9rem; }
th, td { border-bottom: 1px solid #ddd; padding: 0.35rem; text-align: left; vertical-align: top; }
td.number { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.bar { background: #4a78c2; height: 0.35rem; margin-top: 0.2rem; }
mark { background: #ffe27a; }
"""

SCRIPT = """
"use strict";
const $ = (id) => document.getElementById(id);

function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

// The passage's text with each occurrence of the answer (ignoring case) in a <mark>.
function markedText(td, text, answer) {
  const needle = answer.trim().toLowerCase();
  const haystack = text.toLowerCase();
  let start = 0;
  let found = needle ? haystack.indexOf(needle) : -1;
  while (found >= 0) {
    td.append(document.createTextNode(text.slice(start, found)));
    const mark = document.createElement("mark");
    mark.textContent = text.slice(found, found + needle.length);
    td.append(mark);
    start = found + needle.length;
    found = haystack.indexOf(needle, start);
  }
  td.append(document.createTextNode(text.slice(start)));
}

function show(reply) {
  $("answer").textContent = reply.answer;
  $("seconds").textContent = `answered in ${reply.seconds.toFixed(3)} s`;
  const body = $("passages").tBodies[0];
  body.replaceChildren();
  for (const p of reply.passages) {
    const row = body.insertRow();
    row.dataset.id = p.id;
    row.dataset.score = String(p.score);
    row.dataset.attention = String(p.attention);
    cell(row, String(p.rank), "number rank");
    cell(row, p.id, "id");
    cell(row, p.title, "title");
    cell(row, p.score.toFixed(4), "number score");
    const share = cell(row, `${(100 * p.attention).toFixed(1)}%`, "number attention");
    const bar = document.createElement("div");
    bar.className = "bar";
    bar.style.width = `${Math.round(100 * p.attention)}%`;
    share.append(bar);
    markedText(cell(row, "", "text"), p.text, reply.answer);
  }
  $("result").hidden = false;
}

async function ask(event) {
  event.preventDefault();
  const question = $("question").value;
  $("error").textContent = "";
  $("ask").disabled = true;
  try {
    const response = await fetch("/api/ask", {
      method: "POST",
      headers: {"Content-Type": "application/json"},
      body: JSON.stringify({question}),
    });
    const reply = await response.json();
    if (!response.ok) throw new Error(reply.error || `HTTP ${response.status}`);
    show(reply);
  } catch (error) {
    $("result").hidden = true;
    $("error").textContent = error.message;
  } finally {
    $("ask").disabled = false;
  }
}

async function describe() {
  const response = await fetch("/api/health");
  const health = await response.json();
  $("system").textContent = `${health.system}; a question may take up to ` +
    `${health.question_max_tokens} reader tokens.`;
}

$("form").addEventListener("submit", ask);
describe().catch((error) => { $("system").textContent = error.message; });
"""

PAGE = f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>fid serve</title>
<style>{STYLE}</style>
</head>
<body>
<h1>Ask the trained system</h1>
<p id="system"></p>
<form id="form">
  <input id="question" name="question" aria-label="Question" autocomplete="off" autofocus
         placeholder="Who governs Stolria?">
  <button id="ask" type="submit">Ask</button>
</form>
<p id="error" role="alert"></p>
<section id="result" aria-live="polite" hidden>
  <p>Answer: <span id="answer"></span> <small id="seconds"></small></p>
  <table id="passages">
    <caption>Passages read, best retrieved first (attention: the share of the reader's
      cross-attention on each passage at its first decoding step)</caption>
    <thead><tr><th>rank</th><th>id</th><th>title</th><th>retrieval score</th>
      <th>attention</th><th>passage</th></tr></thead>
    <tbody></tbody>
  </table>
</section>
<script>{SCRIPT}</script>
</body>
</html>
"""


def _sha256(source: str) -> str:
    """A CSP source expression allowing exactly this inline text."""
    digest = hashlib.sha256(source.encode("utf-8")).digest()
    return f"'sha256-{base64.b64encode(digest).decode('ascii')}'"


def csp() -> str:
    """The page's Content-Security-Policy: its own inline script and style only, requests to
    this server only, no frames around it (clickjacking), no forms sent elsewhere."""
    return (
        f"default-src 'none'; script-src {_sha256(SCRIPT)}; style-src {_sha256(STYLE)}; "
        "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    )
