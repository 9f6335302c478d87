// The chat page: a client of the server's own OpenAI API (/v1/models, /v1/chat/completions),
// with nothing loaded from elsewhere. Replies stream token by token; each turn shows its time to
// first token, prompt and cached tokens, and where each image's embedding came from
// (usage.prompt_tokens_details.mm_items, reported with --enable-cache-report).
"use strict";

const $ = (id) => document.getElementById(id);
const SOURCES = {
  encoded: "encoded",
  embedding_cache: "embedding cache",
  prefix_cache: "prefix cache",
};

const state = {
  history: [], // OpenAI messages of the finished turns
  mediaNames: [], // names of the images and videos in history, in the order the server sees them
  pending: [], // attachments of the message being written: {name, type, url}
  controller: null,
  model: "default",
};

function requestHeaders() {
  const headers = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) headers.Authorization = `Bearer ${key}`;
  return headers;
}

function errorMessage(body, response) {
  return body?.error?.message ?? body?.message ?? `HTTP ${response.status}`;
}

async function loadModel() {
  try {
    const response = await fetch("/v1/models", { headers: requestHeaders() });
    const body = await response.json().catch(() => null);
    if (!response.ok) throw new Error(errorMessage(body, response));
    state.model = body.data[0].id;
    $("model").textContent = state.model;
    const info = await fetch("/model_info", { headers: requestHeaders() })
      .then((r) => (r.ok ? r.json() : null))
      .catch(() => null);
    if (info?.description) $("model").textContent = info.description;
    $("model").title = state.model;
  } catch (error) {
    $("model").textContent = `cannot list models: ${error.message}`;
  }
}

// Attachments ----------------------------------------------------------------------------------
function readAsDataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

async function attach(files) {
  for (const file of files) {
    state.pending.push({ name: file.name, type: file.type, url: await readAsDataUrl(file) });
  }
  renderAttachments();
}

function isVideo(attachment) {
  return attachment.type.startsWith("video/");
}

function mediaElement(attachment) {
  if (attachment.type.startsWith("image/")) {
    const img = document.createElement("img");
    img.className = "thumb";
    img.src = attachment.url;
    img.alt = attachment.name;
    img.title = attachment.name;
    return img;
  }
  const span = document.createElement("span");
  span.className = "file";
  span.textContent = `[${attachment.name}]`;
  return span;
}

function renderAttachments() {
  $("attachments").replaceChildren(...state.pending.map(mediaElement));
}

// Conversation ---------------------------------------------------------------------------------
function addTurn(role) {
  const turn = document.createElement("div");
  turn.className = `turn ${role}`;
  const body = document.createElement("div");
  body.className = "body";
  turn.append(body);
  $("conversation").append(turn);
  return { turn, body };
}

function showUserTurn(text, attachments) {
  const { turn, body } = addTurn("user");
  body.textContent = text;
  if (attachments.length) {
    const media = document.createElement("div");
    media.append(...attachments.map(mediaElement));
    turn.prepend(media);
  }
}

function userMessage(text, attachments) {
  const parts = attachments.map((a) =>
    isVideo(a)
      ? { type: "video_url", video_url: { url: a.url } }
      : { type: "image_url", image_url: { url: a.url } },
  );
  if (text) parts.push({ type: "text", text });
  return { role: "user", content: parts };
}

function statsLine(ttftMs, usage, names) {
  const stats = document.createElement("div");
  stats.className = "stats";
  const figures = [ttftMs === null ? "no tokens" : `TTFT ${Math.round(ttftMs)} ms`];
  if (usage) figures.push(`${usage.prompt_tokens} prompt tokens`);
  const details = usage?.prompt_tokens_details;
  if (details) figures.push(`${details.cached_tokens} cached`);
  stats.append(figures.join(" · "));
  if (!usage) return stats;
  if (!details) {
    stats.append(" · cache figures: start the server with --enable-cache-report");
    return stats;
  }
  const items = details.mm_items ?? [];
  if (items.length) stats.append(" ·");
  items.forEach((item, index) => {
    const tag = document.createElement("span");
    tag.className = `source ${item.source}`;
    const name = names[index] ?? `${item.modality} ${index + 1}`;
    tag.textContent = `${item.modality} ${index + 1} (${name}): ${SOURCES[item.source] ?? item.source}`;
    stats.append(" ", tag);
  });
  return stats;
}

async function* sseData(stream) {
  const reader = stream.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (line.startsWith("data: ")) yield line.slice(6);
      }
    }
  }
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").hidden = !busy;
}

async function send(event) {
  event.preventDefault();
  const text = $("prompt").value.trim();
  const attachments = state.pending;
  if (!text && !attachments.length) return;
  $("intro")?.remove();
  showUserTurn(text, attachments);
  const message = userMessage(text, attachments);
  const names = [...state.mediaNames, ...attachments.map((a) => a.name)];
  $("prompt").value = "";
  state.pending = [];
  renderAttachments();

  const reply = addTurn("assistant");
  const started = performance.now();
  let ttft = null;
  let answer = "";
  let usage = null;
  state.controller = new AbortController();
  setBusy(true);
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: requestHeaders(),
      signal: state.controller.signal,
      body: JSON.stringify({
        model: state.model,
        messages: [...state.history, message],
        stream: true,
        stream_options: { include_usage: true },
        max_tokens: Number($("max-tokens").value),
        temperature: Number($("temperature").value),
      }),
    });
    if (!response.ok) {
      throw new Error(errorMessage(await response.json().catch(() => null), response));
    }
    for await (const data of sseData(response.body)) {
      if (data === "[DONE]") break;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      const delta = chunk.choices?.[0]?.delta?.content;
      if (delta) {
        ttft ??= performance.now() - started;
        answer += delta;
        reply.body.textContent = answer;
      }
      if (chunk.usage) usage = chunk.usage;
    }
  } catch (error) {
    if (error.name !== "AbortError") {
      reply.turn.classList.add("error");
      reply.body.textContent = error.message; // the server's message, as it is
      setBusy(false);
      return; // the failed turn stays on screen but out of the conversation
    }
  }
  state.history.push(message, { role: "assistant", content: answer });
  state.mediaNames = names;
  reply.turn.append(statsLine(ttft, usage, names));
  setBusy(false);
}

function newChat() {
  state.controller?.abort();
  state.history = [];
  state.mediaNames = [];
  state.pending = [];
  renderAttachments();
  $("conversation").replaceChildren();
}

function setUp() {
  $("composer").addEventListener("submit", send);
  $("stop").addEventListener("click", () => state.controller?.abort());
  $("new-chat").addEventListener("click", newChat);
  $("api-key").addEventListener("change", loadModel);
  $("files").addEventListener("change", async (event) => {
    await attach(event.target.files);
    event.target.value = "";
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("prompt").addEventListener("paste", (event) => {
    if (event.clipboardData.files.length) attach(event.clipboardData.files);
  });
  const composer = $("composer");
  composer.addEventListener("dragover", (event) => {
    event.preventDefault();
    composer.classList.add("dragging");
  });
  composer.addEventListener("dragleave", () => composer.classList.remove("dragging"));
  composer.addEventListener("drop", (event) => {
    event.preventDefault();
    composer.classList.remove("dragging");
    attach(event.dataTransfer.files);
  });
  loadModel();
}

setUp();
