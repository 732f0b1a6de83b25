// tensoropt Pareto page: y-axis toggle, detail panel, and "Use this plan".
// Works from a file (download of the embedded plan.json text) and served by `tensoropt ui`
// (POST to the server, which writes DIR/plan.json); the mode comes from location.protocol and the
// server's mark in the page's meta block.
(function () {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const fig = JSON.parse($("tensoropt-figure").textContent);
  const meta = JSON.parse($("tensoropt-meta").textContent);
  // served by `tensoropt ui` (which marks its pages), not opened from a file or another web server
  const served = (location.protocol === "http:" || location.protocol === "https:") && meta.server === true;
  const gd = $("plot");
  const panel = $("panel");
  const state = { yMode: "time", current: null, selected: meta.selected, data: null, served: served };
  window.tensoropt = state; // inspected by tests and handy in the console

  // customdata per plan id (layout documented in tensoropt/plot/figure.py)
  const pointData = {};
  for (const t of fig.data) {
    if (t.meta && t.meta.kind === "frontier") for (const cd of t.customdata) pointData[cd[0]] = cd;
  }

  function el(tag, attrs, children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== null && v !== undefined && v !== false) e.setAttribute(k, v === true ? "" : v);
    }
    for (const c of [].concat(children === undefined ? [] : children)) {
      e.append(c instanceof Node ? c : String(c));
    }
    return e;
  }

  function breakable(text) {
    // allow line breaks after "." and "," and before "[" (module paths, labels); the text is unchanged
    const parts = String(text).split(/(?<=[.,])|(?=\[)/);
    return parts.flatMap((p, i) => (i ? [document.createElement("wbr"), p] : [p]));
  }

  function num(x) {
    // at most 6 characters: 3 significant digits (12.3, 0.0123, 1234), 2 for tiny values (2.5e-5)
    if (x === null || x === undefined || !isFinite(x)) return "n/a";
    if (x === 0) return "0";
    const a = Math.abs(x);
    if (a >= 1e5 || a < 0.01) return x.toExponential(1).replace("e+", "e");
    if (a >= 1000) return Math.round(x).toString();
    return Number(x.toPrecision(3)).toString();
  }

  // RFC 1951 inflate of a gzip member (RFC 1952), for browsers without DecompressionStream
  // (Firefox < 113, Safari < 16.4); the decoder is puff.c's (zlib/contrib/puff)
  const LBASE = [3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115,
    131, 163, 195, 227, 258];
  const LEXT = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0];
  const DBASE = [1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537,
    2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577];
  const DEXT = [0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13];
  const ORDER = [16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15];

  function gunzip(data) {
    let pos = 10, bitbuf = 0, bitcnt = 0, op = 0;
    const flags = data[3];
    if (flags & 4) pos += 2 + (data[pos] | (data[pos + 1] << 8));
    if (flags & 8) while (data[pos++]);
    if (flags & 16) while (data[pos++]);
    if (flags & 2) pos += 2;
    const n = data.length;
    const out = new Uint8Array((data[n - 4] | (data[n - 3] << 8) | (data[n - 2] << 16) | (data[n - 1] << 24)) >>> 0);
    const bits = (k) => {
      while (bitcnt < k) { bitbuf |= data[pos++] << bitcnt; bitcnt += 8; }
      const v = bitbuf & ((1 << k) - 1);
      bitbuf >>>= k; bitcnt -= k;
      return v;
    };
    const table = (lengths) => {
      const count = new Uint16Array(16), offs = new Uint16Array(16), symbol = new Uint16Array(lengths.length);
      for (const l of lengths) count[l]++;
      count[0] = 0;
      for (let i = 1; i < 16; i++) offs[i] = offs[i - 1] + count[i - 1];
      lengths.forEach((l, s) => { if (l) symbol[offs[l]++] = s; });
      return { count, symbol };
    };
    const decode = (h) => {
      let code = 0, first = 0, index = 0;
      for (let len = 1; len < 16; len++) {
        code |= bits(1);
        const count = h.count[len];
        if (code - first < count) return h.symbol[index + code - first];
        index += count; first = (first + count) << 1; code <<= 1;
      }
      throw new Error("corrupt embedded data");
    };
    const fixed = [table([...Array(288)].map((_, s) => (s < 144 ? 8 : s < 256 ? 9 : s < 280 ? 7 : 8))),
      table(Array(30).fill(5))];
    for (let last = 0; !last;) {
      last = bits(1);
      const type = bits(2);
      if (type === 0) {
        bitbuf = 0; bitcnt = 0; // to the byte boundary
        const len = data[pos] | (data[pos + 1] << 8);
        out.set(data.subarray(pos + 4, pos + 4 + len), op);
        pos += 4 + len; op += len;
        continue;
      }
      let lit = fixed[0], dist = fixed[1];
      if (type === 2) {
        const nlen = bits(5) + 257, ndist = bits(5) + 1, ncode = bits(4) + 4;
        const lengths = Array(19).fill(0);
        for (let i = 0; i < ncode; i++) lengths[ORDER[i]] = bits(3);
        const lencode = table(lengths), all = [];
        while (all.length < nlen + ndist) {
          const sym = decode(lencode);
          if (sym < 16) all.push(sym);
          else if (sym === 16) all.push(...Array(3 + bits(2)).fill(all[all.length - 1]));
          else all.push(...Array(sym === 17 ? 3 + bits(3) : 11 + bits(7)).fill(0));
        }
        lit = table(all.slice(0, nlen)); dist = table(all.slice(nlen));
      }
      for (;;) {
        const sym = decode(lit);
        if (sym < 256) { out[op++] = sym; continue; }
        if (sym === 256) break;
        const len = LBASE[sym - 257] + bits(LEXT[sym - 257]);
        const d = decode(dist), back = DBASE[d] + bits(DEXT[d]);
        for (let i = 0; i < len; i++, op++) out[op] = out[op - back];
      }
    }
    return out;
  }

  async function unpack(id) {
    // the text of an embedded gzip + base64 block
    const raw = atob($(id).textContent.trim());
    const bytes = new Uint8Array(raw.length);
    for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
    if (typeof DecompressionStream === "undefined") return new TextDecoder().decode(gunzip(bytes));
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return new Response(stream).text();
  }

  async function loadData() {
    return JSON.parse(await unpack("tensoropt-data"));
  }

  async function loadPlotly() {
    // plotly.js is embedded compressed (4.6 MiB -> 1.9 MiB): run it as an inline script
    const script = document.createElement("script");
    script.textContent = await unpack("tensoropt-plotly");
    document.head.append(script);
  }

  // every frontier trace's points as drawn first: the micro-batch filter shows a subset of them
  const allPoints = fig.data.map((t) => (t.meta && t.meta.kind === "frontier" ? t.customdata.slice() : null));

  function setMicroBatches(value) {
    // show only the plans of one micro-batch count (customdata[10]), or all
    state.microBatches = value;
    const idx = [], xs = [], ys = [], cds = [], opacity = [];
    allPoints.forEach((points, i) => {
      if (!points) return;
      const kept = points.filter((cd) => value === "all" || String(cd[10]) === value);
      idx.push(i); cds.push(kept); xs.push(kept.map((cd) => cd[3])); ys.push(kept.map(yValue));
      opacity.push(kept.map((cd) => (cd[6] ? 1 : 0.35)));
    });
    return Plotly.restyle(gd, { x: xs, y: ys, customdata: cds, "marker.opacity": opacity }, idx);
  }

  function fillMicroBatchFilter() {
    const counts = [...new Set(Object.values(pointData).map((cd) => cd[10]))].sort((a, b) => a - b);
    for (const m of counts) $("mbfilter").append(el("option", { value: String(m) }, `${m}`));
    $("mbfilter").disabled = counts.length < 2;
  }

  function traceIndex(kind) {
    return gd.data.findIndex((t) => t.meta && t.meta.kind === kind);
  }

  function yValue(cd) {
    return state.yMode === "time" ? cd[2] : cd[4];
  }

  function setRing(kind, id) {
    const i = traceIndex(kind);
    const cds = id && pointData[id] ? [pointData[id]] : [];
    Plotly.restyle(gd, {
      x: [cds.map((cd) => cd[3])],
      y: [cds.map(yValue)],
      customdata: [cds],
      showlegend: kind === "selected" && cds.length > 0,
    }, [i]);
  }

  function setYMode(mode) {
    state.yMode = mode;
    const indices = gd.data.map((_, i) => i);
    const ys = gd.data.map((t) => (t.customdata || []).map(yValue));
    const title = mode === "time" ? "Step time (s)" : "Throughput (samples/s)";
    Plotly.update(gd, { y: ys }, { "yaxis.title.text": title, "yaxis.autorange": true }, indices);
    return setScales();
  }

  function logTicks(values) {
    // 1-2-5 ticks spanning the values (plotly's default log ticks label every digit)
    const pos = values.filter((v) => v > 0);
    if (!pos.length) return [];
    const lo = Math.min(...pos), hi = Math.max(...pos), ticks = [];
    for (let e = Math.floor(Math.log10(lo)) - 1; e <= Math.ceil(Math.log10(hi)); e++) {
      for (const m of [1, 2, 5]) {
        const v = Number((m * 10 ** e).toPrecision(3));
        if (v >= lo / 2.5 && v <= hi * 2.5) ticks.push(v);
      }
    }
    return ticks;
  }

  function axisScale(axis, log, values) {
    const ticks = log ? logTicks(values) : null;
    return {
      [`${axis}.type`]: log ? "log" : "linear", [`${axis}.autorange`]: true,
      [`${axis}.tickmode`]: log ? "array" : "auto", [`${axis}.tickvals`]: ticks,
      [`${axis}.ticktext`]: ticks && ticks.map(String),
    };
  }

  function setScales() {
    const logx = $("logx").checked;
    const cds = Object.values(pointData);
    const budgetOnAxis = (gd.layout.shapes || []).length > 0;
    const xs = cds.map((cd) => cd[3]).concat(budgetOnAxis ? [meta.budget_x] : []);
    const update = Object.assign(axisScale("xaxis", logx, xs), axisScale("yaxis", $("logy").checked, cds.map(yValue)));
    // annotations on a log axis take log10 positions; shapes take data values
    (gd.layout.annotations || []).forEach((a, i) => {
      if (a.xref === "x" && meta.budget_x) update[`annotations[${i}].x`] = logx ? Math.log10(meta.budget_x) : meta.budget_x;
    });
    return Plotly.relayout(gd, update);
  }

  function download(name, text) {
    const url = URL.createObjectURL(new Blob([text], { type: "application/json" }));
    const a = el("a", { href: url, download: name });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  }

  function planText(id) {
    // a plan's exact plan.json text: put together from the pieces the plans share, once
    const runs = state.data.texts[id];
    if (!Array.isArray(runs)) return runs;
    const parts = [];
    for (let k = 0; k < runs.length; k += 2) {
      for (let i = runs[k]; i < runs[k] + runs[k + 1]; i++) parts.push(state.data.pieces[i]);
    }
    return (state.data.texts[id] = parts.join(""));
  }

  async function usePlan(id) {
    const plan = state.data.plans[id];
    const status = $("use-status");
    const command = $("run-command");
    status.classList.remove("error");
    try {
      if (served) {
        status.textContent = "Writing plan.json …";
        const resp = await fetch("api/select", {
          method: "POST",
          // the server answers only its own page: the token it embedded in this page's meta
          headers: { "Content-Type": "application/json", "X-Tensoropt-Token": meta.token },
          body: JSON.stringify({ plan_id: id }),
        });
        const body = await resp.json();
        if (!resp.ok) throw new Error(body.error || resp.statusText);
        status.textContent = `Wrote ${body.plan_path} and marked ${id} as selected. Run it with:`;
        command.textContent = body.command;
        markSelected(id);
      } else {
        download("plan.json", planText(id));
        status.textContent = `Downloaded plan.json (${id}). Run it with:`;
        command.textContent = plan.command;
      }
      $("command-row").classList.add("shown");
    } catch (err) {
      status.textContent = `Could not use plan ${id}: ${err.message}`;
      status.classList.add("error");
    }
  }

  function markSelected(id) {
    state.selected = id;
    setRing("selected", id);
    setRing("clicked", null);
    const h2 = panel.querySelector("h2");
    if (h2 && !h2.querySelector(".badge.selected")) h2.append(el("span", { class: "badge selected" }, "selected"));
  }

  function layerTable(layers) {
    // one row per operator: module path over its op, configuration, costs
    const head = el("tr", {}, [
      el("th", { title: "owning module, and the aten op" }, "Module / op"),
      el("th", { title: "configuration label" }, "Configuration"),
      el("th", { class: "num", title: "compute time per step" }, "Time (ms)"),
      el("th", { class: "num", title: "communication time per step" }, "Comm (ms)"),
      el("th", { class: "num", title: "memory per device" }, "Mem (MiB)"),
    ]);
    const rows = layers.map((l) => el("tr", { "data-node": l.node }, [
      el("td", { class: "layer" }, [
        el("span", { class: "module", title: l.module }, breakable(l.module || "(top level)")),
        el("span", { class: "op", title: `${l.op} (node ${l.node})` },
          String(l.op).replace(/^aten\./, "").replace(/\.default$/, "")),
      ]),
      el("td", { class: "config", title: l.config }, breakable(l.config)),
      el("td", { class: "num compute" }, num(l.compute_s * 1e3)),
      el("td", { class: "num comm" }, num(l.comm_s * 1e3)),
      el("td", { class: "num memory" }, num(l.memory_bytes / 2 ** 20)),
    ]));
    const cols = el("colgroup", {}, ["c-layer", "c-config", "c-num", "c-num", "c-num"].map(
      (c) => el("col", { class: c })));
    return el("table", { class: "layers", id: "layers" }, [cols, el("thead", {}, head), el("tbody", {}, rows)]);
  }

  async function fetchDetails(id) {
    // served pages fetch the details a large file does not embed
    const resp = await fetch(`api/plan?id=${encodeURIComponent(id)}`);
    const body = await resp.json();
    if (!resp.ok) throw new Error(body.error || resp.statusText);
    state.data.plans[id] = body.plan;
    state.data.texts[id] = body.text;
  }

  async function showPlan(id) {
    if (!state.data || !pointData[id]) return;
    state.current = id;
    setRing("clicked", id === state.selected ? null : id);
    if (!state.data.plans[id] && served) {
      try {
        await fetchDetails(id);
      } catch (err) {
        console.error(err);
      }
      if (state.current !== id) return; // another point was clicked meanwhile
    }
    const cd = pointData[id];
    if (state.data.plans[id] && !state.data.plans[id].layers && state.data.texts[id] !== undefined) {
      state.data.plans[id].layers = JSON.parse(planText(id)).layers; // the panel's rows: the plan file's
    }
    const plan = state.data.plans[id] || {
      devices: cd[1], mesh: "", time_s: cd[2], memory_bytes: cd[3] * meta.unit_bytes, throughput: cd[4],
      summary: cd[5], fits: cd[6], layers: null,
    };
    const badges = [el("span", { class: plan.fits ? "badge fits" : "badge over" },
      plan.fits ? "fits budget" : "over budget")];
    if (id === state.selected) badges.push(el("span", { class: "badge selected" }, "selected"));
    const unit = meta.memory_unit;
    const budget = meta.budget_x ? ` (budget ${num(meta.budget_x)} ${unit})` : "";
    const facts = [
      ["Devices", `${plan.devices}${plan.mesh ? ` (mesh ${plan.mesh})` : ""}`],
      ["Step time", plan.time_s < 1 ? `${num(plan.time_s * 1e3)} ms` : `${num(plan.time_s)} s`],
      ["Throughput", plan.throughput ? `${num(plan.throughput)} samples/s` : "n/a"],
      ["Memory", `${num(plan.memory_bytes / meta.unit_bytes)} ${unit} per device${budget}`],
      ["Split", plan.summary || "(no summary)"],
    ];
    const head = [
      el("h2", {}, [el("span", {}, "Plan "), el("span", { class: "plan-id", id: "plan-id" }, id), ...badges]),
      el("dl", { class: "facts", id: "facts" }, facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)])),
    ];
    if (!plan.layers) {
      panel.replaceChildren(...head, el("p", { class: "note", id: "no-details" },
        `To keep this file small it embeds the per-layer breakdown and plan file of ${meta.embedded} of ` +
        `its ${meta.plans} plans, evenly spread over each frontier (the fastest, the smallest and the ` +
        "selected plan among them); click a nearby point, or open the run folder with `tensoropt ui DIR`, " +
        "which shows every plan."));
      return;
    }
    const button = el("button", { class: "primary", id: "use-plan", type: "button" }, "Use this plan");
    button.addEventListener("click", () => usePlan(id));
    const copy = el("button", { type: "button", id: "copy-command", title: "copy the command" }, "Copy");
    copy.addEventListener("click", async () => {
      try {
        await navigator.clipboard.writeText($("run-command").textContent);
        copy.textContent = "Copied";
      } catch (err) {
        getSelection().selectAllChildren($("run-command")); // let the user press Ctrl-C
      }
    });
    const filter = el("input", { class: "filter", id: "layer-filter", type: "search",
      placeholder: `Filter the ${plan.layers.length} layers (module, op, configuration)` });
    const table = layerTable(plan.layers);
    filter.addEventListener("input", () => {
      const q = filter.value.trim().toLowerCase();
      for (const tr of table.tBodies[0].rows) tr.hidden = q !== "" && !tr.textContent.toLowerCase().includes(q);
    });
    panel.replaceChildren(
      ...head,
      el("div", { class: "actions" }, [button, el("span", { class: "status", id: "use-status" })]),
      el("div", { class: "command-row", id: "command-row" },
        [el("pre", { class: "command", id: "run-command" }), copy]),
      filter,
      table,
    );
  }

  const config = {
    responsive: true, displaylogo: false,
    modeBarButtonsToRemove: ["select2d", "lasso2d", "autoScale2d"],
    toImageButtonOptions: { filename: "pareto", format: "png", scale: 2 },
  };
  loadPlotly()
    .then(() => Plotly.newPlot(gd, fig.data, fig.layout, config))
    .then(() => {
      gd.on("plotly_click", (ev) => {
        const pt = ev.points.find((p) => p.data.meta && p.data.meta.kind === "frontier");
        if (pt) showPlan(pt.customdata[0]);
      });
      for (const r of document.querySelectorAll("input[name=ymode]")) {
        r.addEventListener("change", () => r.checked && setYMode(r.value));
      }
      fillMicroBatchFilter();
      $("mbfilter").addEventListener("change", () => setMicroBatches($("mbfilter").value));
      $("logx").addEventListener("change", setScales);
      $("logy").addEventListener("change", setScales);
      setRing("selected", state.selected); // meta is authoritative (the server patches it)
      return setScales();
    })
    .then(loadData)
    .then((d) => {
      state.data = d;
      if (state.selected && pointData[state.selected]) return showPlan(state.selected);
    })
    .then(() => {
      document.body.dataset.ready = "1";
    })
    .catch((err) => {
      panel.replaceChildren(el("div", { class: "status error" }, `Could not build the page: ${err}`));
      document.body.dataset.ready = "error";
    });
})();
