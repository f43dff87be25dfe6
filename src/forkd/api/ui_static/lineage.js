// The lineage picture: snapshots, the sandboxes forked from each, the
// snapshots branched from those sandboxes, and so on, drawn left to right as
// SVG. Fork-tree children are marked with their tree; a branch whose source
// sandbox is gone hangs from a "gone" placeholder.

const SVG = "http://www.w3.org/2000/svg";
const COL = 230; // horizontal distance between generations
const ROW = 34; // vertical distance between leaves
const W = 190;
const H = 24;

/** Nodes {key, kind, label, title, parent, data} for the snapshots and sandboxes. */
export function buildGraph(snapshots, sandboxes) {
  const nodes = new Map();
  const alive = new Set(sandboxes.map((s) => s.id));
  for (const snap of snapshots) {
    let parent = null;
    if (snap.branched_from) {
      parent = `b:${snap.branched_from}`;
      if (!alive.has(snap.branched_from) && !nodes.has(parent)) {
        nodes.set(parent, { key: parent, kind: "gone", label: `${snap.branched_from} (gone)`,
          title: "killed since it was branched", parent: null, order: snap.created_at_unix });
      }
    }
    const kind = snap.status === "writing" ? "writing" : snap.status === "failed" ? "failed" : "snapshot";
    nodes.set(`s:${snap.tag}`, { key: `s:${snap.tag}`, kind, label: snap.tag, parent, data: snap,
      title: `snapshot ${snap.tag} (${snap.status ?? "ready"})`, order: snap.created_at_unix });
  }
  for (const sb of sandboxes) {
    const meta = sb.metadata ?? {};
    const tree = meta.fork_tree_id;
    const label = tree ? `${sb.id} #${meta.fork_index}` : sb.id;
    const parent = nodes.has(`s:${sb.snapshot_tag}`) ? `s:${sb.snapshot_tag}` : null;
    nodes.set(`b:${sb.id}`, { key: `b:${sb.id}`, kind: tree ? "tree" : "sandbox", label, parent, data: sb,
      title: tree ? `sandbox ${sb.id}, child ${meta.fork_index} of fork-tree ${tree}` : `sandbox ${sb.id}`,
      order: sb.created_at_unix });
  }
  return nodes;
}

/** Place every node: depth → x, leaves one row each, a parent centred on its children. */
export function layout(nodes) {
  const children = new Map();
  const roots = [];
  for (const node of nodes.values()) {
    if (node.parent && nodes.has(node.parent)) {
      if (!children.has(node.parent)) children.set(node.parent, []);
      children.get(node.parent).push(node);
    } else {
      roots.push(node);
    }
  }
  const byAge = (a, b) => (a.order ?? 0) - (b.order ?? 0) || a.label.localeCompare(b.label);
  let row = 0;
  let depthMax = 0;
  const place = (node, depth) => {
    depthMax = Math.max(depthMax, depth);
    node.x = 10 + depth * COL;
    const kids = (children.get(node.key) ?? []).sort(byAge);
    if (kids.length === 0) {
      node.y = 10 + row++ * ROW;
      return;
    }
    for (const kid of kids) place(kid, depth + 1);
    node.y = (kids[0].y + kids[kids.length - 1].y) / 2;
  };
  for (const root of roots.sort(byAge)) place(root, 0);
  return { width: 20 + depthMax * COL + W, height: Math.max(20 + row * ROW, 60) };
}

function el(name, attrs, text) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

/** Draw the graph into the <svg> element. */
export function drawLineage(svg, snapshots, sandboxes) {
  const nodes = buildGraph(snapshots, sandboxes);
  const { width, height } = layout(nodes);
  svg.replaceChildren();
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  if (nodes.size === 0) {
    svg.append(el("text", { x: 10, y: 30, class: "empty" }, "No snapshots yet: POST /v1/snapshots or `forkd snapshot`."));
    return;
  }
  const edges = el("g", { class: "edges" });
  const boxes = el("g", { class: "nodes" });
  for (const node of nodes.values()) {
    const parent = node.parent && nodes.get(node.parent);
    if (parent) {
      const x1 = parent.x + W;
      const y1 = parent.y + H / 2;
      const x2 = node.x;
      const y2 = node.y + H / 2;
      const mid = (x1 + x2) / 2;
      // Sandbox → snapshot is a branch (dashed); snapshot → sandbox a fork.
      const branch = node.key.startsWith("s:");
      edges.append(el("path", { d: `M${x1},${y1} C${mid},${y1} ${mid},${y2} ${x2},${y2}`,
        class: branch ? "edge branch" : "edge fork" }));
    }
    const g = el("g", { class: `node ${node.kind}`, "data-key": node.key, transform: `translate(${node.x},${node.y})` });
    g.append(el("title", {}, node.title));
    g.append(el("rect", { width: W, height: H, rx: node.key.startsWith("s:") ? 4 : 12 }));
    const label = node.label.length > 27 ? `${node.label.slice(0, 26)}…` : node.label;
    g.append(el("text", { x: 8, y: 16 }, label));
    boxes.append(g);
  }
  svg.append(edges, boxes);
}
