// A code cell on a sandbox's Jupyter kernel (POST /v1/sandboxes/{id}/code, NDJSON): the #cell card's
// textarea runs on the sandbox's default kernel of the chosen language; stdout and stderr show as
// text, each result's text/plain as text and its image/png as an <img> from a data: URL (the CSP
// allows data: images), an error as its name and value. Built with DOM calls only.

import { stream } from "./api.js";

const $ = (id) => document.getElementById(id);
let current = null; // the sandbox id the card is open on

function block(kind, text) {
  const pre = document.createElement("pre");
  pre.className = `cell-${kind}`;
  pre.textContent = text;
  return pre;
}

/** What one event adds to the output: text under its kind, or the PNG of a result. */
function show(output, event) {
  if (event.type === "stdout" || event.type === "stderr") {
    const last = output.lastElementChild;
    if (last?.className === `cell-${event.type}`) last.textContent += event.text;
    else output.append(block(event.type, event.text));
  } else if (event.type === "result") {
    const png = event.data?.["image/png"];
    if (png) {
      const img = document.createElement("img");
      img.className = "cell-image";
      img.alt = event.data["text/plain"] ?? "image";
      img.src = `data:image/png;base64,${png}`;
      output.append(img);
    } else if (event.data?.["text/plain"] !== undefined) {
      output.append(block("result", event.data["text/plain"]));
    }
  } else if (event.type === "error") {
    output.append(block("error", `${event.name}: ${event.value}`));
  } else if (event.type === "end" && event.error) {
    output.append(block("error", `the stream broke: ${event.error}`));
  }
}

export function closeCell() {
  current = null;
  $("cell").hidden = true;
}

/** Open the #cell card on sandbox `id` (its output cleared when it is another sandbox). */
export function openCell(id) {
  if (current !== id) {
    $("cell-output").replaceChildren();
    $("cell-status").textContent = "";
  }
  current = id;
  $("cell-title").textContent = id;
  $("cell").hidden = false;
  $("cell-code").focus();
}

/** Run the textarea's code on the open sandbox and show its events as they come. */
export async function runCell() {
  const id = current;
  if (!id) return;
  const output = $("cell-output");
  const status = $("cell-status");
  const button = $("cell-run");
  output.replaceChildren();
  status.textContent = "running…";
  button.disabled = true;
  try {
    let end = null;
    await stream("POST", `/v1/sandboxes/${encodeURIComponent(id)}/code`,
      { code: $("cell-code").value, language: $("cell-language").value }, (event) => {
        if (current !== id) return;
        if (event.type === "end") end = event;
        show(output, event);
      });
    if (current === id) {
      status.textContent = end?.timed_out ? "timed out" : `done [${end?.execution_count ?? "?"}]`;
    }
  } catch (err) {
    if (current === id) status.textContent = `error: ${err.message}`;
  } finally {
    button.disabled = false;
  }
}
