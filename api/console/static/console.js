// The console's one script (docs/console.md): each page calls the API's
// methods with the session cookie and the page's CSRF token, and renders
// their answers, or their errors, with DOM nodes (never HTML strings).

const meta = (name) => document.querySelector(`meta[name="${name}"]`).content;
const ctx = {
  page: meta("bc-page"), tenant: meta("bc-tenant"), csrf: meta("bc-csrf"),
  temporal: meta("bc-temporal"), ns: meta("bc-namespace"),
};

// APIError is an answer's {"error": {code, message, details}}.
class APIError extends Error {
  constructor(e) { super(e.message); this.code = e.code; this.details = e.details || {}; }
}

// call runs one API method, as the CLI does, and answers its JSON.
export async function call(method, input) {
  const [group, name] = method.split(".");
  const r = await fetch(`/api/compute/${group}/${name}`, {
    method: "POST", credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-Csrf-Token": ctx.csrf },
    body: JSON.stringify(input),
  });
  let body;
  try { body = await r.json(); } catch { body = { error: { code: "INTERNAL_ERROR", message: `HTTP ${r.status}` } }; }
  if (!r.ok) throw new APIError(body.error || { code: "INTERNAL_ERROR", message: `HTTP ${r.status}` });
  return body;
}

// inputSchema is a method's input schema from the API's OpenAPI document
// (fetched once): the forms take their limits from it.
let openapi;
async function inputSchema(method) {
  openapi ||= fetch("/api/openapi.json", { credentials: "same-origin" }).then((r) => r.json());
  const [group, name] = method.split(".");
  const op = (await openapi).paths?.[`/api/compute/${group}/${name}`]?.post;
  return op?.requestBody?.content?.["application/json"]?.schema || {};
}

// el builds an element: attributes, "on<event>" handlers, then children.
function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function errorBox(err) {
  const code = err.code || "ERROR";
  const why = err.details && err.details.reason ? ` (${err.details.reason})` : "";
  return el("div", { class: "error", role: "alert" }, el("strong", {}, code), " ", err.message + why);
}

const when = (ms) => (ms ? new Date(ms).toISOString().replace("T", " ").slice(0, 16) + " UTC" : "");
const id = (v) => el("span", { class: "id" }, v || "");

function workflowLink(workflowId) {
  if (!ctx.temporal || !workflowId) return "";
  const href = `${ctx.temporal}/namespaces/${encodeURIComponent(ctx.ns)}/workflows/${encodeURIComponent(workflowId)}`;
  return el("a", { href, target: "_blank", rel: "noopener" }, "workflow");
}

// table renders rows under columns [{title, value(row)}].
function table(caption, columns, rows, empty = "None.") {
  if (!rows.length) return el("p", { class: "muted" }, `${caption}: ${empty}`);
  return el("table", {},
    el("caption", {}, caption),
    el("thead", {}, el("tr", {}, columns.map((c) => el("th", { scope: "col" }, c.title)))),
    el("tbody", {}, rows.map((r) => el("tr", {}, columns.map((c) => el("td", {}, c.value(r)))))));
}

// list reads every page of a list method (at most 20 pages).
async function list(method, input) {
  const items = [];
  let cursor;
  for (let i = 0; i < 20; i++) {
    const out = await call(method, cursor ? { ...input, cursor } : input);
    items.push(...(out.items || []));
    if (!out.nextCursor) break;
    cursor = out.nextCursor;
  }
  return items;
}

// action is a button running fn, showing its error next to it.
function action(label, fn, attrs = {}) {
  const b = el("button", { type: "button", ...attrs, onclick: async () => {
    b.disabled = true;
    b.parentElement.querySelector(".error")?.remove();
    try { await fn(); } catch (err) { b.after(errorBox(err)); } finally { b.disabled = false; }
  } }, label);
  return b;
}

// live re-renders into box every interval while the page is open.
function live(box, render, every = 2000) {
  let stopped = false;
  const tick = async () => {
    if (stopped) return;
    try { box.replaceChildren(await render()); } catch (err) { box.replaceChildren(errorBox(err)); }
    setTimeout(tick, every);
  };
  tick();
  return () => { stopped = true; };
}

// block is preformatted text in a labelled region that takes the keyboard's
// focus, so a long one scrolls without a mouse.
const block = (label, text, attrs = {}) => el("pre", { tabindex: 0, role: "region", "aria-label": label, ...attrs }, text);

const gpus = (d) => (d ? `${d.count} × ${d.class}` : "");
const labelled = (text, input) => el("label", {}, text, input);

const pages = {
  async reservations(root) {
    const t = ctx.tenant;
    const pools = await list("pools.list", { tenantId: t });
    const pool = el("select", { id: "rsv-pool", name: "pool" }, pools.map((p) => el("option", { value: p.id }, `${p.name} (${p.gpuModel || p.class || p.id})`)));
    const count = el("input", { id: "rsv-gpus", type: "number", min: 1, max: 4096, value: 1, required: true });
    const hours = el("input", { id: "rsv-hours", type: "number", min: 1, value: 1, required: true });
    const result = el("div", { id: "rsv-result", "aria-live": "polite" });
    const schema = await inputSchema("reservations.create");
    const dur = schema.properties?.duration;
    if (dur?.maximum) hours.max = Math.floor(dur.maximum / 3600);
    const request = () => ({ tenantId: t, poolId: pool.value, devices: { class: "gpu", count: Number(count.value) },
      duration: Number(hours.value) * 3600 });
    const form = el("form", { class: "inline", "aria-label": "Reserve GPUs", onsubmit: (e) => e.preventDefault() },
      labelled("Pool", pool), labelled("GPUs", count), labelled("Hours, from now", hours),
      action("Check fit", async () => {
        const p = await call("capacity.preview", request());
        const where = (p.plan?.allocations || []).map((a) => `${a.nodeId}: ${(a.atoms || a.devices || []).length} atoms`).join("; ");
        result.replaceChildren(p.fits
          ? el("p", { class: "ok", id: "rsv-fits" }, `Fits${where ? ` on ${where}` : ""}.`)
          : el("p", { class: "error", id: "rsv-fits" }, `Does not fit: ${(p.reasons || []).map((r) => r.message || r.code).join("; ")}`));
      }, { class: "secondary", id: "rsv-check" }),
      action("Reserve", async () => {
        const key = "console-" + Array.from(crypto.getRandomValues(new Uint8Array(8)), (b) => b.toString(16).padStart(2, "0")).join("");
        const r = await call("reservations.create", { ...request(), idempotencyKey: key });
        result.replaceChildren(el("p", { class: "ok" }, "Reservation ", id(r.id), ` is ${r.state}.`));
      }, { id: "rsv-reserve" }),
      result);
    const listBox = el("div", { id: "rsv-list" });
    const events = el("div", { id: "rsv-events" });
    root.replaceChildren(el("h2", {}, "Reserve GPUs"), form, el("h2", {}, "Your reservations"), listBox, events);
    live(listBox, async () => table("Reservations", [
      { title: "Reservation", value: (r) => id(r.id) },
      { title: "Pool", value: (r) => id(r.poolId) },
      { title: "State", value: (r) => el("span", { class: "state", "data-id": r.id }, r.state) },
      { title: "Devices", value: (r) => gpus(r.devices) },
      { title: "Start", value: (r) => when(r.start) },
      { title: "End", value: (r) => when(r.end) },
      { title: "End reason", value: (r) => r.endReason || "" },
      { title: "Workflow", value: (r) => workflowLink(r.workflowId) },
      { title: "Actions", value: (r) => el("span", {},
        ["pending", "placed", "binding", "active"].includes(r.state)
          ? action("Release", () => call("reservations.release", { tenantId: t, reservationId: r.id }), { "aria-label": `Release ${r.id}` }) : "",
        " ", action("Events", async () => {
          const ev = await call("events.list", { tenantId: t, resourceId: r.id });
          events.replaceChildren(table(`Events of ${r.id}`, [
            { title: "At", value: (e) => when(e.at || e.createdAt) }, { title: "Type", value: (e) => e.type },
            { title: "Data", value: (e) => el("code", {}, JSON.stringify(e.data || {})) }], ev.items || []));
        }, { class: "secondary", "aria-label": `Events of ${r.id}` })) },
    ], await list("reservations.list", { tenantId: t }), "no reservation yet."));
  },

  async capacity(root) {
    const t = ctx.tenant;
    const pools = await list("pools.list", { tenantId: t });
    const from = Date.now(), to = from + 24 * 3600 * 1000;
    const sections = [];
    for (const p of pools) {
      let tl;
      try { tl = await call("capacity.timeline", { tenantId: t, poolId: p.id, from, to, buckets: 24 }); } catch (err) {
        sections.push(el("h2", {}, p.name), errorBox(err));
        continue;
      }
      const any = (tl.allocatable.gpu || 0) > 0 || tl.buckets.some((b) => (b.booked.gpu || 0) > 0);
      sections.push(el("h2", {}, `${p.name} — next 24 hours`),
        ...(any ? [chart(tl, "gpu"), timelineTable(tl, "gpu")] : [el("p", { class: "muted" }, "This pool has no bookable GPU.")]));
    }
    root.replaceChildren(el("div", { class: "legend", "aria-hidden": "true" },
      el("span", { class: "allocated" }, "allocated"), el("span", { class: "reserved" }, "reserved"), el("span", { class: "available" }, "available")),
    ...(sections.length ? sections : [el("p", { class: "muted" }, "No pool.")]));
  },

  async nodes(root) {
    const t = ctx.tenant;
    const detail = el("div", { id: "node-detail" });
    const box = el("div", { id: "node-list" });
    root.replaceChildren(box, detail);
    live(box, async () => table("Nodes", [
      { title: "Node", value: (n) => el("span", {}, n.name, el("br"), id(n.id)) },
      { title: "Pool", value: (n) => id(n.poolId) },
      { title: "Provisioning", value: (n) => n.provisionState },
      { title: "Connectivity", value: (n) => n.connectivity || "" },
      { title: "Conditions", value: (n) => (n.conditions || []).map((c) => `${c.type}=${c.status}`).join(", ") },
      { title: "Schedulable", value: (n) => (n.schedulable ? "yes" : `no: ${(n.unschedulableReasons || n.noScheduleReasons || []).join(", ")}`) },
      { title: "Cordon / drain", value: (n) => el("span", { class: "cordon", "data-id": n.id }, n.cordoned ? `cordoned${n.drainState ? `, ${n.drainState}` : ""}` : "schedulable") },
      { title: "GPUs", value: (n) => (n.gpuCount ? `${n.gpuCount} × ${n.gpuModel || "GPU"}` : "") },
      { title: "Actions", value: (n) => el("span", {},
        n.cordoned
          ? action("Uncordon", () => call("nodes.uncordon", { tenantId: t, nodeId: n.id }), { "aria-label": `Uncordon ${n.name}` })
          : action("Cordon", () => call("nodes.cordon", { tenantId: t, nodeId: n.id }), { "aria-label": `Cordon ${n.name}` }),
        " ", action("Inventory", () => showInventory(detail, n), { class: "secondary", "aria-label": `Inventory of ${n.name}` })) },
    ], await list("nodes.list", { tenantId: t }), "no node."), 3000);
  },

  async instances(root) {
    const t = ctx.tenant;
    const box = el("div", {});
    root.replaceChildren(box);
    live(box, async () => table("Instances", [
      { title: "Instance", value: (i) => el("span", {}, i.name, el("br"), id(i.id)) },
      { title: "State", value: (i) => `${i.state} (wants ${i.desiredState})` },
      { title: "Size", value: (i) => `${i.vcpu} vCPU, ${i.memoryMiB} MiB${i.gpus ? `, ${i.gpus} GPU` : ""}` },
      { title: "Address", value: (i) => i.address || "" },
      { title: "Workflow", value: (i) => workflowLink(i.workflowId || i.id) },
      { title: "Actions", value: (i) => el("span", {},
        action("Start", () => call("instances.start", { tenantId: t, instanceId: i.id }), { "aria-label": `Start ${i.name}` }), " ",
        action("Stop", () => call("instances.stop", { tenantId: t, instanceId: i.id }), { class: "secondary", "aria-label": `Stop ${i.name}` })) },
    ], await list("instances.list", { tenantId: t }), "no instance."), 3000);
  },

  async sandboxes(root) {
    const t = ctx.tenant;
    const out = el("div", { id: "sbx-output", "aria-live": "polite" });
    const box = el("div", {});
    root.replaceChildren(box, out);
    const rows = await list("sandboxes.list", { tenantId: t });
    box.replaceChildren(table("Sandboxes", [
      { title: "Sandbox", value: (s) => id(s.id) },
      { title: "State", value: (s) => s.state },
      { title: "Runtime", value: (s) => s.runtime || "" },
      { title: "Expires", value: (s) => when(s.expiresAt) },
      { title: "End reason", value: (s) => s.endReason || "" },
      { title: "Workflow", value: (s) => workflowLink(s.workflowId) },
      { title: "Exec", value: (s) => {
        const cmd = el("input", { type: "text", value: "uname -a", "aria-label": `Command for ${s.id}` });
        return el("span", {}, cmd, " ", action("Run", async () => {
          const opened = await call("sandboxes.exec", { tenantId: t, sandboxId: s.id, command: ["sh", "-c", cmd.value] });
          const r = await execTunnel(opened);
          out.replaceChildren(el("h2", {}, `Output of ${s.id}`),
            el("p", { id: "sbx-exit" }, `exit ${r.status.exitCode}${r.status.error ? `: ${r.status.error}` : ""}`),
            block("Standard output", r.stdout, { id: "sbx-stdout" }), r.stderr ? block("Standard error", r.stderr) : "");
        }, { "aria-label": `Run in ${s.id}` }));
      } },
    ], rows, "no sandbox."));
  },

  async "cloud-resources"(root) {
    const t = ctx.tenant;
    root.replaceChildren(table("Cloud resources", [
      { title: "Resource", value: (r) => el("span", {}, r.name, el("br"), id(r.id)) },
      { title: "Kind", value: (r) => `${r.provider || ""} ${r.kind}` },
      { title: "State", value: (r) => `${r.state}${r.reason ? ` (${r.reason})` : ""}` },
      { title: "Outputs", value: (r) => el("code", {}, JSON.stringify(r.outputs || {})) },
      // Secret outputs are references to secrets, never their values.
      { title: "Secret outputs", value: (r) => el("code", {}, JSON.stringify(r.secretOutputs || {})) },
      { title: "Workflow", value: (r) => workflowLink(r.id) },
    ], await list("cloudResources.list", { tenantId: t }), "no cloud resource."));
  },

  async events(root) {
    const t = ctx.tenant;
    const seen = [];
    let cursor;
    const box = el("div", { id: "events-list" });
    root.replaceChildren(el("p", { class: "muted" }, "New events appear as they are published."), box);
    live(box, async () => {
      for (let i = 0; i < 10; i++) {
        const out = await call("events.list", cursor ? { tenantId: t, cursor } : { tenantId: t });
        seen.unshift(...(out.items || []).slice().reverse());
        if (!out.nextCursor || !(out.items || []).length) { if (out.nextCursor) cursor = out.nextCursor; break; }
        cursor = out.nextCursor;
      }
      seen.splice(500);
      return table("Events, newest first", [
        { title: "At", value: (e) => when(e.at || e.createdAt) },
        { title: "Type", value: (e) => e.type },
        { title: "Resource", value: (e) => el("span", {}, e.resourceType || "", " ", id(e.resourceId)) },
        { title: "Data", value: (e) => el("code", {}, JSON.stringify(e.data || {})) },
      ], seen, "no event yet.");
    });
  },

  async sites(root) {
    const t = ctx.tenant;
    root.replaceChildren(table("Sites", [
      { title: "Site", value: (s) => el("span", {}, s.name, el("br"), id(s.id)) },
      { title: "Kind", value: (s) => s.kind || "" },
      { title: "Region", value: (s) => s.region || "" },
      { title: "Created", value: (s) => when(s.createdAt) },
    ], await list("sites.list", { tenantId: t }), "no site."));
  },

  // The operator's pools with their offers and quotas, as the fleet
  // document (fleet.export) holds them, and this tenant's own quotas.
  async pools(root) {
    const t = ctx.tenant;
    const pools = await list("pools.list", { tenantId: t });
    const parts = [table("Pools", [
      { title: "Pool", value: (p) => el("span", {}, p.name, el("br"), id(p.id)) },
      { title: "Class", value: (p) => p.class || "" },
      { title: "GPU model", value: (p) => p.gpuModel || "" },
      { title: "Sharing", value: (p) => p.sharing || "" },
      { title: "Site", value: (p) => id(p.siteId) },
    ], pools, "no pool.")];
    try {
      const doc = (await call("fleet.export", { tenantId: t })).document || {};
      for (const p of doc.pools || []) {
        parts.push(table(`Offers of ${p.name}`, [
          { title: "Tenant", value: (o) => o.tenant },
          { title: "Quota", value: (o) => el("code", {}, JSON.stringify(o.quota || {})) },
          { title: "Priority", value: (o) => o.priority ?? "" },
          { title: "Suspended", value: (o) => (o.suspended ? "yes" : "no") },
        ], p.offers || [], "not offered."));
      }
    } catch (err) { parts.push(errorBox(err)); }
    try {
      const q = await call("quotas.get", { tenantId: t });
      parts.push(table("Quotas of this tenant", [
        { title: "Pool", value: (r) => id(r.poolId) },
        { title: "Quota", value: (r) => el("code", {}, JSON.stringify(r.quota ?? r)) },
      ], q.items || []));
    } catch (err) { parts.push(errorBox(err)); }
    root.replaceChildren(...parts);
  },
};

// execTunnel runs an exec tunnel (sandboxes.exec's answer) to its end over
// its WebSocket, the token as the second subprotocol (a browser cannot set
// headers): frames of a 1-byte channel, a 4-byte big-endian length and the
// payload; stdin is closed at once (frame 1), stdout is 2, stderr 3, and 4
// is the exit status in JSON, the last frame.
function execTunnel(opened) {
  const u = new URL(opened.url, location.href);
  u.protocol = u.protocol === "https:" || u.protocol === "wss:" ? "wss:" : "ws:";
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(u.href, ["bc-tunnel", opened.token]);
    ws.binaryType = "arraybuffer";
    const text = { 2: new TextDecoder(), 3: new TextDecoder() }, got = { 2: "", 3: "" };
    let buf = new Uint8Array(0), done = false;
    ws.onopen = () => ws.send(new Uint8Array([1, 0, 0, 0, 0]));
    ws.onmessage = (m) => {
      const chunk = new Uint8Array(m.data), next = new Uint8Array(buf.length + chunk.length);
      next.set(buf);
      next.set(chunk, buf.length);
      buf = next;
      while (buf.length >= 5) {
        const n = new DataView(buf.buffer, buf.byteOffset, buf.byteLength).getUint32(1);
        if (buf.length < 5 + n) break;
        const ch = buf[0], payload = buf.slice(5, 5 + n);
        buf = buf.slice(5 + n);
        if (ch === 2 || ch === 3) got[ch] += text[ch].decode(payload, { stream: true });
        if (ch === 4) {
          done = true;
          ws.close();
          resolve({ stdout: got[2], stderr: got[3], status: JSON.parse(new TextDecoder().decode(payload)) });
        }
      }
    };
    ws.onclose = (e) => {
      if (!done) reject(new APIError({ code: "UNAVAILABLE", message: `the exec tunnel closed before the command's exit (${e.code} ${e.reason})` }));
    };
  });
}

// chart draws one resource's buckets as stacked bars (allocated, reserved,
// available); the table after it holds the same numbers for screen readers.
function chart(tl, cls) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  const w = 720, h = 160, n = tl.buckets.length || 1, bw = w / n;
  const max = Math.max(1, tl.allocatable[cls] || 0, ...tl.buckets.map((b) => (b.booked[cls] || 0) + (b.available[cls] || 0)));
  svg.setAttribute("viewBox", `0 0 ${w} ${h + 16}`);
  svg.setAttribute("width", "100%");
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", `${cls} over the next ${n} buckets: allocated, reserved and available`);
  tl.buckets.forEach((b, i) => {
    let y = h;
    for (const part of ["allocated", "reserved", "available"]) {
      const v = (b[part] && b[part][cls]) || 0;
      const bh = (v / max) * h;
      const r = document.createElementNS(ns, "rect");
      r.setAttribute("x", String(i * bw + 1));
      r.setAttribute("y", String(y - bh));
      r.setAttribute("width", String(Math.max(bw - 2, 1)));
      r.setAttribute("height", String(bh));
      r.setAttribute("class", part);
      y -= bh;
      svg.append(r);
    }
    if (i % 6 === 0) {
      const tx = document.createElementNS(ns, "text");
      tx.setAttribute("x", String(i * bw + 2));
      tx.setAttribute("y", String(h + 13));
      tx.textContent = new Date(b.start).toISOString().slice(11, 16);
      svg.append(tx);
    }
  });
  return svg;
}

function timelineTable(tl, cls) {
  const d = el("details", {}, el("summary", {}, "The numbers"));
  d.append(table(`${cls} per hour`, [
    { title: "From", value: (b) => when(b.start) },
    { title: "Allocated", value: (b) => b.allocated[cls] || 0 },
    { title: "Reserved", value: (b) => b.reserved[cls] || 0 },
    { title: "Available", value: (b) => b.available[cls] || 0 },
  ], tl.buckets));
  return d;
}

async function showInventory(box, n) {
  const t = ctx.tenant;
  const inv = await call("inventory.get", { tenantId: t, nodeId: n.id });
  const parts = [el("h2", {}, `Inventory of ${n.name}`), block("Inventory", JSON.stringify(inv, null, 2))];
  try {
    const diff = await call("inventory.diff", { tenantId: t, nodeId: n.id });
    parts.push(el("h2", {}, "Changes since the previous report"), block("Inventory changes", JSON.stringify(diff, null, 2)));
  } catch (err) { parts.push(errorBox(err)); }
  box.replaceChildren(...parts);
}

const root = document.getElementById("page");
const render = pages[ctx.page];
if (render) render(root).catch((err) => root.replaceChildren(errorBox(err)));
