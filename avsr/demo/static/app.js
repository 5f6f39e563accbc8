// The avsr demo page: collect an upload or a recording, POST it to /api/transcribe, show the answer.
// Plain browser JavaScript, no build step. Every text from the server is set with textContent.
"use strict";

const $ = (id) => document.getElementById(id);
const LABELS = { audiovisual: "audio-visual", audio: "audio only", video: "video only" };
const state = { maxBytes: 50 * 2 ** 20, tab: "upload", recording: null, recorder: null, stream: null };

function el(tag, attrs = {}, text = null) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== null) node.textContent = text;
  return node;
}

function setStatus(text, kind) {
  const status = $("status");
  status.textContent = text;
  status.dataset.state = kind;
}

function fmt(x, digits = 2) {
  return typeof x === "number" && isFinite(x) ? x.toFixed(digits) : "–";
}

function mb(bytes) {
  return (bytes / 2 ** 20).toFixed(1) + " MB";
}

// ---- the input: upload tab, record tab, a player for what will be sent --------------------------------

function showMedia(blob) {
  const video = $("player"), audio = $("audio-player");
  for (const p of [video, audio]) {
    p.hidden = true;
    p.pause();
    if (p.src) URL.revokeObjectURL(p.src);
    p.removeAttribute("src");
    p.srcObject = null;
  }
  if (!blob) return;
  const isAudio = (blob.type || "").startsWith("audio/");
  const player = isAudio ? audio : video;
  player.src = URL.createObjectURL(blob);
  player.muted = false;
  player.hidden = false;
}

function selectTab(name) {
  state.tab = name;
  for (const b of document.querySelectorAll(".tab")) b.classList.toggle("active", b.dataset.tab === name);
  $("tab-upload").hidden = name !== "upload";
  $("tab-record").hidden = name !== "record";
  if (name === "upload") showMedia($("video-file").files[0] || $("audio-file").files[0] || null);
  else showMedia(state.recording ? state.recording.blob : null);
}

function recorderType(withVideo) {
  const kinds = withVideo
    ? ["video/webm;codecs=vp8,opus", "video/webm", "video/mp4"]
    : ["audio/webm;codecs=opus", "audio/webm", "audio/ogg", "audio/mp4"];
  return kinds.find((t) => window.MediaRecorder && MediaRecorder.isTypeSupported(t)) || "";
}

async function startRecording() {
  const camera = $("rec-camera").checked, mic = $("rec-mic").checked;
  if (!camera && !mic) return setStatus("choose the camera, the microphone or both", "error");
  if (!navigator.mediaDevices || !window.MediaRecorder)
    return setStatus("this browser cannot record (a page served over http://127.0.0.1 or https is needed)", "error");
  try {
    state.stream = await navigator.mediaDevices.getUserMedia({
      video: camera ? { width: { ideal: 640 }, height: { ideal: 480 }, frameRate: { ideal: 25 } } : false,
      audio: mic ? { channelCount: 1, echoCancellation: false, noiseSuppression: false } : false,
    });
  } catch (err) {
    return setStatus("no access to the camera or microphone: " + err.message, "error");
  }
  showMedia(null);
  const live = $("player");
  if (camera) {
    live.srcObject = state.stream;
    live.muted = true;
    live.hidden = false;
    live.play();
  }
  const type = recorderType(camera);
  const chunks = [];
  const recorder = new MediaRecorder(state.stream, type ? { mimeType: type } : {});
  const started = performance.now();
  recorder.ondataavailable = (e) => e.data.size && chunks.push(e.data);
  recorder.onstop = () => {
    state.stream.getTracks().forEach((t) => t.stop());
    const blob = new Blob(chunks, { type: recorder.mimeType || type });
    const seconds = (performance.now() - started) / 1000;
    const ext = blob.type.includes("mp4") ? ".mp4" : blob.type.includes("ogg") ? ".ogg" : ".webm";
    state.recording = { blob, field: camera ? "video" : "audio", name: "recording" + ext, seconds };
    showMedia(blob);
    $("rec-time").textContent = "";
    setStatus(`recorded ${seconds.toFixed(1)} s (${mb(blob.size)}): ready to transcribe`, "ready");
    $("rec-start").disabled = false;
    $("rec-stop").disabled = true;
  };
  recorder.start(250);
  state.recorder = recorder;
  $("rec-start").disabled = true;
  $("rec-stop").disabled = false;
  setStatus("recording…", "recording");
  const tick = () => {
    if (recorder.state !== "recording") return;
    $("rec-time").textContent = ((performance.now() - started) / 1000).toFixed(1) + " s";
    setTimeout(tick, 200);
  };
  tick();
}

function stopRecording() {
  if (state.recorder && state.recorder.state === "recording") state.recorder.stop();
}

// ---- the request -----------------------------------------------------------------------------------

function formData() {
  const form = new FormData();
  let bytes = 0, given = 0;
  if (state.tab === "record") {
    const rec = state.recording;
    if (!rec) throw new Error("record something first");
    form.append(rec.field, rec.blob, rec.name);
    bytes += rec.blob.size;
  } else {
    for (const field of ["video", "audio"]) {
      const file = $(field + "-file").files[0];
      if (file) {
        form.append(field, file, file.name);
        bytes += file.size;
        given += 1;
      }
    }
    if (!given) throw new Error("choose a video or an audio file first");
  }
  if (bytes > state.maxBytes)
    throw new Error(`the input is ${mb(bytes)}, more than the server's limit of ${mb(state.maxBytes)}`);
  if ($("modality").value) form.append("modality", $("modality").value);
  if ($("compare").checked) form.append("compare", "1");
  return form;
}

async function transcribe() {
  let form;
  try {
    form = formData();
  } catch (err) {
    return setStatus(err.message, "error");
  }
  const button = $("transcribe");
  button.disabled = true;
  const started = performance.now();
  setStatus("transcribing… (a face video first goes through the mouth-ROI stage)", "busy");
  try {
    const response = await fetch("/api/transcribe", { method: "POST", body: form });
    let answer;
    try {
      answer = await response.json();
    } catch (_) {
      answer = { error: `HTTP ${response.status} ${response.statusText}` };
    }
    if (!response.ok) {
      setStatus(`error (HTTP ${response.status}): ${answer.error || answer.detail || "unknown"}`, "error");
      return;
    }
    render(answer);
    const seconds = (performance.now() - started) / 1000;
    setStatus(`done in ${seconds.toFixed(1)} s`, "done");
  } catch (err) {
    setStatus("the server did not answer: " + err.message, "error");
  } finally {
    button.disabled = false;
  }
}

// ---- the answer ------------------------------------------------------------------------------------

function seek(start, end) {
  const player = [$("player"), $("audio-player")].find((p) => !p.hidden && p.src);
  if (!player) return;
  player.currentTime = start;
  player.play();
  const stop = () => {
    if (player.currentTime >= end) {
      player.pause();
      player.removeEventListener("timeupdate", stop);
    }
  };
  player.addEventListener("timeupdate", stop);
}

function wordChips(words, container) {
  container.replaceChildren();
  for (const w of words || []) {
    const chip = el("button", { type: "button", class: "word", title: `score ${fmt(w.score)}: click to play` });
    chip.append(el("span", {}, w.word), el("small", {}, `${fmt(w.start)}–${fmt(w.end)} s`));
    chip.addEventListener("click", () => seek(w.start, w.end));
    container.append(chip);
  }
}

function renderModalities(modalities) {
  const box = $("modalities-box"), body = $("modalities").querySelector("tbody");
  body.replaceChildren();
  box.hidden = !modalities;
  if (!modalities) return;
  for (const name of ["audiovisual", "video", "audio"]) {
    const m = modalities[name];
    if (!m) continue;
    const row = el("tr", { "data-modality": name });
    const text = el("td");
    text.append(el("div", { class: "mod-text" }, m.text || "(no words)"));
    const words = el("div", { class: "words small" });
    wordChips(m.words, words);
    text.append(words);
    row.append(el("th", {}, LABELS[name]), text, el("td", {}, fmt(m.score)));
    body.append(row);
  }
}

function gateBar(label, value, note) {
  const row = el("div", { class: "gate" });
  row.append(el("span", { class: "gate-label" }, label));
  const bar = el("span", { class: "bar" });
  const fill = el("span", { class: "fill" });
  fill.style.width = Math.round(100 * value) + "%";
  bar.append(fill);
  row.append(bar, el("span", { class: "gate-value" }, fmt(value)), el("span", { class: "meta" }, note));
  return row;
}

function renderFusion(fusion) {
  const card = $("fusion-card"), box = $("fusion");
  box.replaceChildren();
  card.hidden = !fusion;
  if (!fusion) return;
  if (typeof fusion.audio_gate === "number")
    box.append(gateBar("audio gate", fusion.audio_gate,
      fusion.audio_gate > 0.5 ? "the fused input rests on the audio" : "the fused input leans on the lips"));
  if (typeof fusion.video_trust === "number")
    box.append(gateBar("video trust", fusion.video_trust,
      fusion.video_trust > 0.5 ? "the lips are taken to belong to the sound" : "the lips are not trusted"));
  if (typeof fusion.video_sync === "number")
    box.append(el("p", { class: "meta" }, `lips in sync with the sound: margin ${fmt(fusion.video_sync)}, ` +
      `bar ${fmt(fusion.video_sync_bar)} (lower where the audio is unsure)` +
      (typeof fusion.video_ctc_entropy === "number"
        ? `; lips read with confidence: entropy ${fmt(fusion.video_ctc_entropy)}, at most ` +
          `${fmt(fusion.video_entropy_bar)}` : "") +
      ": the search " + (fusion.video_trust > 0.5 ? "uses the lips whole" : "decodes the audio alone")));
  if (fusion.audio_gate === undefined && fusion.video_trust === undefined)
    box.append(el("p", { class: "meta" }, "no gates reported: the model has none, or the search ranks " +
      "no single-stream views (view weights 0)"));
  const dl = el("dl");
  const add = (k, v) => dl.append(el("dt", {}, k), el("dd", {}, v));
  add("view weights", `video ${fmt(fusion.video_weight)} · audio ${fmt(fusion.audio_weight)} · ` +
    `audio confidence ${fmt(fusion.audio_confidence)}`);
  const views = Object.entries(fusion.views || {});
  if (views.length) for (const [name, text] of views) add(`${name}-only view`, text || "(no words)");
  else add("ranking", "one search over the fused input (no single-stream views)");
  box.append(dl);
}

function renderRoi(roi) {
  $("roi-card").hidden = !roi;
  if (!roi) return;
  $("roi-gif").src = roi.gif;
  $("roi-strip").src = roi.strip;
  $("roi-times").textContent = "frames at " + roi.strip_times.map((t) => t.toFixed(2)).join(", ") + " s";
  $("roi-meta").textContent = `${roi.num_frames} frames at ${roi.fps} fps, ${roi.size[0]}×${roi.size[1]} ` +
    "gray: what the lip-reading front-end sees (centre 88×88)";
}

const SHOWN = new Set(["roi", "fusion", "modalities", "score", "duration_s", "allowed", "audio_gate",
  "video_trust", "video_sync", "audio_ctc_confidence", "video_ctc_entropy"]);

function renderFacts(answer) {
  const info = answer.info || {};
  const dl = $("facts");
  dl.replaceChildren();
  const add = (k, v) => dl.append(el("dt", {}, k), el("dd", {}, typeof v === "string" ? v : JSON.stringify(v)));
  add("duration", fmt(info.duration_s) + " s");
  add("modalities the input allows", (info.allowed || []).map((m) => LABELS[m]).join(", "));
  for (const [k, v] of Object.entries(info)) if (!SHOWN.has(k)) add(k.replaceAll("_", " "), v);
  const short = JSON.stringify(answer, (k, v) =>
    typeof v === "string" && v.startsWith("data:") ? `${v.slice(0, 22)}… (${Math.round(v.length / 1024)} kB)` : v, 2);
  $("raw").textContent = short;
  $("facts-card").hidden = false;
}

function render(answer) {
  $("result-card").hidden = false;
  $("result-modality").textContent = LABELS[answer.modality] || answer.modality;
  const transcript = $("transcript");
  transcript.textContent = answer.text;
  transcript.classList.toggle("empty", !answer.text);
  const info = answer.info || {};
  $("transcript-meta").textContent = `score ${fmt(info.score)} · ${fmt(info.duration_s)} s` +
    (answer.words.length ? " · word times from CTC alignment, click a word to hear it" : "") +
    (info.words_note ? ` · ${info.words_note}` : "");
  wordChips(answer.words, $("words"));
  renderModalities(info.modalities);
  renderRoi(info.roi);
  renderFusion(info.fusion);
  renderFacts(answer);
}

// ---- wiring ---------------------------------------------------------------------------------------------

async function loadInfo() {
  try {
    const info = await (await fetch("/api/info")).json();
    state.maxBytes = info.max_upload_mb * 2 ** 20;
    $("model").textContent = `model: ${info.model || "(given in Python)"} · uploads up to ${info.max_upload_mb} MB`;
  } catch (err) {
    $("model").textContent = "the server did not answer /api/info: " + err.message;
  }
}

for (const b of document.querySelectorAll(".tab")) b.addEventListener("click", () => selectTab(b.dataset.tab));
for (const id of ["video-file", "audio-file"]) $(id).addEventListener("change", () => selectTab("upload"));
$("rec-start").addEventListener("click", startRecording);
$("rec-stop").addEventListener("click", stopRecording);
$("transcribe").addEventListener("click", transcribe);
$("curl").textContent = `curl -F video=@talk.mp4 -F compare=1 ${location.origin}/api/transcribe`;
loadInfo();
