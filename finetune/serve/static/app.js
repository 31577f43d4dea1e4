// The page of `finetune serve`: reviews in, labels, probabilities and shaded words out. No build step, no library.
"use strict";

const TEXT_COLUMNS = ["text", "review", "content", "body", "sentence"]; // as `finetune predict` guesses
const els = {
  reviews: document.getElementById("reviews"),
  run: document.getElementById("run"),
  download: document.getElementById("download"),
  status: document.getElementById("status"),
  info: document.getElementById("model-info"),
  drop: document.getElementById("drop"),
  file: document.getElementById("file"),
  fileNote: document.getElementById("file-note"),
  tokenField: document.getElementById("token-field"),
  token: document.getElementById("token"),
  output: document.getElementById("output"),
  body: document.querySelector("#results tbody"),
  rawCsv: document.getElementById("raw-csv"),
};
// A spreadsheet runs a cell starting with these as a formula; such a cell is written after a ' (OWASP),
// and read back without it, as finetune/config/csv_cells.py does for `finetune predict`.
const FORMULA_STARTS = ["=", "+", "-", "@", "\t", "\r", "\n", "\0"];
// A formula's sign counts in its fullwidth form too, and after what a reader trims or does not show:
// whitespace, a byte-order mark, zero-width characters, NUL (the same class as csv_cells.py's).
const FORMULA_SIGNS = ["=", "+", "-", "@", "\uff1d", "\uff0b", "\uff0d", "\uff20"];
const HIDDEN_LEAD = /^[\t\n\v\f\r \x1c-\x1f\x85\xa0\u1680\u2000-\u200d\u2028\u2029\u202f\u205f\u2060\u3000\ufeff\x00]*/;
let classes = [];
let tags = false; // a multi_label run: each review gets a set of tags, each with its own probability
let stars = false; // a regression or ordinal run: each review gets a rating and its level; classes are the levels
let maxReviews = 64; // per request; /info gives the server's limit
let results = [];

function headers() {
  const h = { "Content-Type": "application/json" };
  const token = els.token.value.trim() || sessionStorage.getItem("finetune-token");
  if (token) h.Authorization = "Bearer " + token;
  return h;
}

function setStatus(text, isError) {
  els.status.textContent = text;
  els.status.classList.toggle("error", Boolean(isError));
}

async function loadInfo() {
  const response = await fetch("/info", { headers: headers() });
  if (response.status === 401) {
    els.tokenField.hidden = false;
    els.info.textContent = "This server needs a token: enter it next to the button.";
    return;
  }
  const info = await response.json();
  classes = info.classes;
  tags = info.task === "multi_label";
  stars = info.task === "regression" || info.task === "ordinal";
  maxReviews = info.limits.max_reviews;
  let test = "";
  if (info.test && stars) {
    test = ` · test MAE ${info.test.mae.toFixed(3)}, QWK ${info.test.quadratic_weighted_kappa.toFixed(3)}`;
  } else if (info.test && tags) {
    test = ` · test micro-F1 ${info.test.micro_f1.toFixed(3)}, macro-F1 ${info.test.macro_f1.toFixed(3)}`;
  } else if (info.test) {
    test = ` · test accuracy ${(info.test.accuracy * 100).toFixed(1)}%, macro-F1 ${info.test.macro_f1.toFixed(3)}`;
  }
  const kind = stars ? `${info.task} rating, levels` : tags ? "tags" : "classes";
  els.info.textContent = `${info.base_model || info.model_dir} (${info.backend}) · ${kind}: ${classes.join(", ")}${test}`;
  // Tags: no shading (a review's words push each tag differently); each chip's tooltip lists its top words.
  // Stars: no shading either (/explain reads class probabilities; the page falls back to /predict).
  els.run.textContent = stars ? "Rate" : tags ? "Tag and explain" : "Label and explain";
  document.getElementById("label-heading").textContent = stars ? "Stars" : tags ? "Tags" : "Label";
  document.querySelector("#output .legend").hidden = tags || stars; // the shading legend
}

// RFC 4180 CSV (quoted fields, doubled quotes, line breaks inside quotes); TSV when the name says so.
function parseDelimited(text, delimiter) {
  const rows = [];
  let row = [], field = "", quoted = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (quoted) {
      if (c === '"' && text[i + 1] === '"') { field += '"'; i++; }
      else if (c === '"') quoted = false;
      else field += c;
    } else if (c === '"' && field === "") quoted = true;
    else if (c === delimiter) { row.push(field); field = ""; }
    else if (c === "\n" || c === "\r") {
      if (c === "\r" && text[i + 1] === "\n") i++;
      row.push(field); rows.push(row); row = []; field = "";
    } else field += c;
  }
  if (field !== "" || row.length) { row.push(field); rows.push(row); }
  return rows.filter((r) => r.some((value) => value.trim() !== ""));
}

// Whether a cell starts a formula, counting one behind leading quotes (so a review's own '=x keeps its quote).
function needsGuard(text) {
  const unquoted = text.replace(/^'+/, "");
  return FORMULA_STARTS.includes(unquoted.charAt(0)) || FORMULA_SIGNS.includes(unquoted.replace(HIDDEN_LEAD, "").charAt(0));
}

function unguard(cell) {
  return !els.rawCsv.checked && cell.startsWith("'") && needsGuard(cell.slice(1)) ? cell.slice(1) : cell;
}

async function readFile(file) {
  const text = (await file.text()).replace(/^\ufeff/, "");
  const rows = parseDelimited(text, /\.tsv$/i.test(file.name) ? "\t" : ",").map((r) => r.map(unguard));
  if (rows.length < 2) { setStatus(`${file.name} has no rows under its header`, true); return; }
  const header = rows[0].map((name) => name.trim());
  let column = header.findIndex((name) => TEXT_COLUMNS.includes(name.toLowerCase()));
  if (column < 0) column = 0;
  const reviews = rows.slice(1).map((r) => (r[column] || "").replace(/\s*\n\s*/g, " ").trim()).filter(Boolean);
  els.reviews.value = reviews.join("\n");
  els.fileNote.textContent = `${reviews.length} reviews from ${file.name} (column "${header[column]}")`;
}

async function post(route, reviews) {
  const response = await fetch(route, { method: "POST", headers: headers(), body: JSON.stringify({ reviews }) });
  const body = await response.json().catch(() => ({ error: `HTTP ${response.status}` }));
  return { ok: response.ok, status: response.status, body };
}

async function run() {
  const reviews = els.reviews.value.split("\n").map((line) => line.trim()).filter(Boolean);
  if (!reviews.length) { setStatus("Type or paste a review first (one per line).", true); return; }
  if (els.token.value.trim()) sessionStorage.setItem("finetune-token", els.token.value.trim());
  els.run.disabled = true;
  results = [];
  try {
    for (let start = 0; start < reviews.length; start += maxReviews) {
      const chunk = reviews.slice(start, start + maxReviews);
      setStatus(`Labelling reviews ${start + 1}–${start + chunk.length} of ${reviews.length}…`);
      let answer = await post("/explain", chunk);
      if (answer.status === 501) answer = await post("/predict", chunk); // an int8 export: labels without words
      if (!answer.ok) {
        if (answer.status === 401) els.tokenField.hidden = false;
        setStatus(answer.body.error || `HTTP ${answer.status}`, true);
        return;
      }
      answer.body.results.forEach((result, i) => results.push({ review: chunk[i], ...result }));
    }
    render();
    setStatus(`${results.length} review${results.length === 1 ? "" : "s"} labelled.`);
  } catch (error) {
    setStatus(`The server did not answer (${error.message}).`, true);
  } finally {
    els.run.disabled = false;
  }
}

// The review with each word shaded: green towards the label, red away from it, alpha by strength.
function shadedReview(result) {
  const cell = document.createElement("td");
  cell.className = "review";
  const text = result.text || result.review;
  const words = (result.words || []).slice().sort((a, b) => a.start - b.start);
  const strongest = Math.max(1e-12, ...words.map((w) => Math.abs(w.score)));
  let at = 0;
  for (const word of words) {
    if (word.start < at) continue;
    cell.append(text.slice(at, word.start));
    const strength = Math.abs(word.score) / strongest;
    const piece = text.slice(word.start, word.end);
    if (strength < 0.05) {
      cell.append(piece);
    } else {
      const mark = document.createElement("mark");
      mark.className = "word " + (word.score > 0 ? "towards" : "away");
      const alpha = (0.12 + 0.6 * strength).toFixed(2);
      mark.style.background = word.score > 0 ? `rgba(22, 163, 74, ${alpha})` : `rgba(220, 38, 38, ${alpha})`;
      mark.title = `${word.score > 0 ? "+" : ""}${word.score.toFixed(3)}`;
      mark.textContent = piece;
      cell.append(mark);
    }
    at = word.end;
  }
  cell.append(text.slice(at));
  return cell;
}

function probabilityBars(probabilities) {
  const cell = document.createElement("td");
  for (const [name, p] of Object.entries(probabilities)) {
    const line = document.createElement("div");
    line.className = "probability";
    line.innerHTML = '<span class="name"></span><span class="track"><span class="bar"></span></span><span class="value"></span>';
    line.querySelector(".name").textContent = name;
    line.querySelector(".bar").style.display = "block";
    line.querySelector(".bar").style.width = `${(p * 100).toFixed(1)}%`;
    line.querySelector(".value").textContent = p.toFixed(3);
    cell.append(line);
  }
  return cell;
}

// A multi_label review's tags as chips, each titled with the words behind it; "no tag" when none reached its threshold.
function tagChips(labels, topWords) {
  const cell = document.createElement("td");
  cell.className = "tags";
  for (const name of labels) {
    const chip = document.createElement("span");
    chip.className = "tag";
    chip.textContent = name;
    const words = (topWords || {})[name] || [];
    if (words.length) chip.title = words.map((w) => `${w.word} (${w.score.toFixed(3)})`).join(", ");
    cell.append(chip);
  }
  if (!labels.length) {
    const none = document.createElement("span");
    none.className = "no-tag";
    none.textContent = "no tag";
    cell.append(none);
  }
  return cell;
}

// A rating as stars: as many filled as the level's place among the levels (its name and rating beside them).
function starCell(result) {
  const cell = document.createElement("td");
  cell.className = "stars";
  const filled = classes.indexOf(result.label) + 1;
  const shown = document.createElement("span");
  shown.className = "star-glyphs";
  shown.textContent = "★".repeat(filled) + "☆".repeat(Math.max(0, classes.length - filled));
  shown.title = `level ${result.label}`;
  const value = document.createElement("span");
  value.className = "rating";
  value.textContent = ` ${result.label} (${result.rating.toFixed(2)})`;
  cell.append(shown, value);
  return cell;
}

// An ordinal run's P(rating > level) bars, or a regression's rating on the levels' scale.
function ratingDetails(result) {
  if (result.prob_above) {
    return probabilityBars(Object.fromEntries(Object.entries(result.prob_above).map(([name, p]) => [`> ${name}`, p])));
  }
  const cell = document.createElement("td");
  cell.textContent = `rating ${result.rating.toFixed(4)}`;
  return cell;
}

function render() {
  els.body.replaceChildren();
  results.forEach((result, i) => {
    const row = document.createElement("tr");
    row.className = "result";
    const number = document.createElement("td");
    number.textContent = String(i + 1);
    if (result.rating !== undefined) {
      row.append(number, shadedReview({ ...result, words: [] }), starCell(result), ratingDetails(result));
      els.body.append(row);
      return;
    }
    if (result.labels) {
      // Shading is per label; a tags review is shown as read, its words in each chip's tooltip.
      row.append(number, shadedReview({ ...result, words: [] }), tagChips(result.labels, result.top_words), probabilityBars(result.scores));
      els.body.append(row);
      return;
    }
    const label = document.createElement("td");
    label.className = "label";
    label.textContent = result.label;
    row.append(number, shadedReview(result), label, probabilityBars(result.probabilities));
    els.body.append(row);
  });
  els.output.hidden = false;
  els.download.disabled = results.length === 0;
}

function csvField(value) {
  let text = String(value ?? "");
  // Text only: the probabilities are numbers, written as numbers.
  if (typeof value === "string" && !els.rawCsv.checked && needsGuard(text)) text = "'" + text;
  return /[",\n\r]/.test(text) ? `"${text.replace(/"/g, '""')}"` : text;
}

function downloadCsv() {
  if (results[0].labels) { downloadTagsCsv(); return; }
  if (results[0].rating !== undefined) { downloadStarsCsv(); return; }
  const names = classes.length ? classes : Object.keys(results[0].probabilities);
  const lines = [["review", "label", ...names.map((n) => `prob_${n}`), "top_words"].map(csvField).join(",")];
  for (const r of results) {
    const top = (r.top_words || []).map((w) => `${w.word} (${w.score.toFixed(3)})`).join("; ");
    lines.push([r.review, r.label, ...names.map((n) => r.probabilities[n]), top].map(csvField).join(","));
  }
  saveCsv(lines);
}

// A multi_label run's results as `finetune predict` writes them: the tags joined by "|", a prob_<tag> per tag.
function downloadTagsCsv() {
  const names = classes.length ? classes : Object.keys(results[0].scores);
  const lines = [["review", "labels", ...names.map((n) => `prob_${n}`)].map(csvField).join(",")];
  for (const r of results) {
    lines.push([r.review, r.labels.join("|"), ...names.map((n) => r.scores[n])].map(csvField).join(","));
  }
  saveCsv(lines);
}

// A ratings run's results as `finetune predict` writes them: label (the level), rating, prob_above_<level>.
function downloadStarsCsv() {
  const above = Object.keys(results[0].prob_above || {});
  const lines = [["review", "label", "rating", ...above.map((n) => `prob_above_${n}`)].map(csvField).join(",")];
  for (const r of results) {
    lines.push([r.review, r.label, r.rating, ...above.map((n) => r.prob_above[n])].map(csvField).join(","));
  }
  saveCsv(lines);
}

function saveCsv(lines) {
  const link = document.createElement("a");
  link.href = URL.createObjectURL(new Blob([lines.join("\r\n") + "\r\n"], { type: "text/csv" }));
  link.download = "predictions.csv";
  link.click();
  URL.revokeObjectURL(link.href);
}

els.run.addEventListener("click", run);
els.download.addEventListener("click", downloadCsv);
els.reviews.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) run();
});
els.file.addEventListener("change", () => els.file.files[0] && readFile(els.file.files[0]));
els.drop.addEventListener("dragover", (event) => { event.preventDefault(); els.drop.classList.add("over"); });
els.drop.addEventListener("dragleave", () => els.drop.classList.remove("over"));
els.drop.addEventListener("drop", (event) => {
  event.preventDefault();
  els.drop.classList.remove("over");
  if (event.dataTransfer.files[0]) readFile(event.dataTransfer.files[0]);
});
els.token.addEventListener("change", () => { sessionStorage.setItem("finetune-token", els.token.value.trim()); loadInfo(); });
loadInfo().catch((error) => { els.info.textContent = `The server did not answer /info (${error.message}).`; });
