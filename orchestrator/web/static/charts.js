// Line charts as inline SVG, drawn from plain arrays: no library, no canvas, no build step.
// drawLineChart(svg, series, options): series = [{ name, points: [[timeMs, value|null], ...], main, color }];
// options.xRange = [t0, t1] widens the time axis (so charts of one run share it); options.marks shades
// time spans ([t0, t1, title]); options.events draws a vertical rule per moment ({ at, kind, title }:
// class "event event-<kind>", counted in svg.dataset.events); options.integer keeps the y ticks on whole
// numbers (counts) with a unit of headroom above the highest value.
// Points beyond two per pixel column are decimated (min and max kept per column), so thousands of
// points cost no more to draw than the chart's width. The chart records its point count in
// svg.dataset.points (what the browser test reads).

const NS = "http://www.w3.org/2000/svg";
const MARGIN = { left: 58, right: 14, top: 22, bottom: 26 }; // the legend sits in the top margin
const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];

function svgEl(tag, attrs = {}, text) {
  const node = document.createElementNS(NS, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}

function niceStep(range, targetTicks) {
  const raw = range / targetTicks;
  const power = Math.pow(10, Math.floor(Math.log10(raw)));
  const scaled = raw / power;
  const nice = scaled < 1.5 ? 1 : scaled < 3 ? 2 : scaled < 7 ? 5 : 10;
  return nice * power;
}

function fmtTick(value, step) {
  const decimals = Math.max(0, -Math.floor(Math.log10(step)));
  if (Math.abs(value) >= 1e5 || (Math.abs(value) > 0 && Math.abs(value) < 1e-3)) return value.toExponential(1);
  return value.toFixed(Math.min(decimals, 6));
}

function fmtClock(ms, spanMs) {
  const d = new Date(ms);
  const hh = String(d.getHours()).padStart(2, "0");
  const mm = String(d.getMinutes()).padStart(2, "0");
  const ss = String(d.getSeconds()).padStart(2, "0");
  if (spanMs > 2 * 86400e3) return `${d.getMonth() + 1}/${d.getDate()} ${hh}:${mm}`;
  return spanMs > 3600e3 ? `${hh}:${mm}` : `${hh}:${mm}:${ss}`;
}

/** Keep at most ~2 points per pixel column: the first, min and max of each column, in time order. */
export function decimate(points, x0, x1, columns) {
  if (points.length <= columns * 2) return points;
  const out = [];
  let column = -1;
  let bucket = [];
  const flush = () => {
    if (!bucket.length) return;
    let lo = bucket[0];
    let hi = bucket[0];
    for (const p of bucket) {
      if (p[1] !== null && (lo[1] === null || p[1] < lo[1])) lo = p;
      if (p[1] !== null && (hi[1] === null || p[1] > hi[1])) hi = p;
    }
    const keep = lo[0] <= hi[0] ? [lo, hi] : [hi, lo];
    out.push(keep[0]);
    if (keep[1] !== keep[0]) out.push(keep[1]);
    bucket = [];
  };
  const span = x1 - x0 || 1;
  for (const p of points) {
    const c = Math.floor(((p[0] - x0) / span) * (columns - 1));
    if (c !== column) { flush(); column = c; }
    bucket.push(p);
  }
  flush();
  return out;
}

function extent(series, zeroBased, xRange, integer) {
  let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity, count = 0;
  for (const s of series) {
    for (const [x, y] of s.points) {
      if (y === null || !Number.isFinite(y)) continue;
      count += 1;
      x0 = Math.min(x0, x); x1 = Math.max(x1, x);
      y0 = Math.min(y0, y); y1 = Math.max(y1, y);
    }
  }
  if (!count) return null;
  if (xRange) { x0 = Math.min(x0, xRange[0]); x1 = Math.max(x1, xRange[1]); }
  if (zeroBased) { y0 = Math.min(0, y0); y1 = Math.max(0, y1); }
  if (integer) y1 = Math.floor(y1) + 1; // a line at the highest count stays clear of the top edge
  if (x1 === x0) { x0 -= 30e3; x1 += 30e3; }
  if (y1 === y0) { const pad = Math.abs(y0) * 0.1 || 1; y0 -= pad; y1 += pad; }
  return { x0, x1, y0, y1, count };
}

function drawAxes(svg, box, ext, formatY, integer) {
  const { x0, x1, y0, y1 } = ext;
  const yStep = integer ? Math.max(1, Math.round(niceStep(y1 - y0, 4))) : niceStep(y1 - y0, 4);
  for (let v = Math.ceil(y0 / yStep) * yStep; v <= y1 + yStep * 1e-9; v += yStep) {
    const y = box.y(v);
    svg.append(svgEl("line", { x1: MARGIN.left, x2: box.width - MARGIN.right, y1: y, y2: y, class: "grid" }));
    svg.append(svgEl("text", { x: MARGIN.left - 6, y: y + 4, "text-anchor": "end", class: "tick" },
      formatY ? formatY(v) : fmtTick(v, yStep)));
  }
  const ticks = Math.max(2, Math.floor((box.width - MARGIN.left - MARGIN.right) / 110));
  for (let i = 0; i <= ticks; i += 1) {
    const t = x0 + ((x1 - x0) * i) / ticks;
    const anchor = i === 0 ? "start" : i === ticks ? "end" : "middle";
    svg.append(svgEl("text", { x: box.x(t), y: box.height - 8, "text-anchor": anchor, class: "tick" },
      fmtClock(t, x1 - x0)));
  }
}

function pathOf(points, box) {
  let d = "";
  let pen = false;
  for (const [x, y] of points) {
    if (y === null || !Number.isFinite(y)) { pen = false; continue; }
    d += `${pen ? "L" : "M"}${box.x(x).toFixed(1)},${box.y(y).toFixed(1)}`;
    pen = true;
  }
  return d;
}

function drawLegend(svg, series, box) {
  if (series.length < 2) return;
  let x = MARGIN.left + 8;
  series.forEach((s, i) => {
    const color = s.color || (s.main ? "#111827" : PALETTE[i % PALETTE.length]);
    svg.append(svgEl("rect", { x, y: 6, width: 10, height: 3, fill: color }));
    const label = svgEl("text", { x: x + 14, y: 11, class: "legend" }, s.name);
    svg.append(label);
    x += 24 + 7 * s.name.length;
    if (x > box.width - 80) x = box.width; // no room: drop the rest of the legend
  });
}

/** Draw series into svg (replacing what was there). */
export function drawLineChart(
  svg, series,
  {
    height = 220, formatY, zeroBased = false, xRange = null, empty = "no data yet", marks = [], events = [],
    integer = false,
  } = {},
) {
  const width = Math.max(240, Math.round(svg.clientWidth || svg.parentNode.clientWidth || 600));
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("height", String(height));
  svg.replaceChildren();
  const ext = extent(series, zeroBased, xRange, integer);
  svg.dataset.points = String(ext ? ext.count : 0);
  svg.dataset.events = "0";
  if (!ext) {
    svg.append(svgEl("text", { x: width / 2, y: height / 2, "text-anchor": "middle", class: "empty" }, empty));
    return;
  }
  const plotW = width - MARGIN.left - MARGIN.right;
  const plotH = height - MARGIN.top - MARGIN.bottom;
  const box = {
    width, height,
    x: (t) => MARGIN.left + ((t - ext.x0) / (ext.x1 - ext.x0)) * plotW,
    y: (v) => MARGIN.top + (1 - (v - ext.y0) / (ext.y1 - ext.y0)) * plotH,
  };
  drawAxes(svg, box, ext, formatY, integer);
  for (const [t0, t1, title] of marks) { // shaded time spans, drawn under the lines
    const x0 = Math.max(MARGIN.left, box.x(t0));
    const x1 = Math.min(width - MARGIN.right, box.x(t1));
    if (x1 <= x0) continue;
    const rect = svgEl("rect", { x: x0, y: MARGIN.top, width: x1 - x0, height: plotH, class: "mark" });
    rect.append(svgEl("title", {}, title));
    svg.append(rect);
  }
  drawEvents(svg, events, box, ext);
  series.forEach((s, i) => {
    const points = decimate(s.points, ext.x0, ext.x1, plotW);
    const color = s.color || (s.main ? "#111827" : PALETTE[i % PALETTE.length]);
    const d = pathOf(points, box);
    if (d) svg.append(svgEl("path", { d, fill: "none", stroke: color, "stroke-width": s.main ? 2 : 1.25,
      class: s.main ? "series main" : "series", "data-series": s.name }));
  });
  drawLegend(svg, series, box);
  addHover(svg, series.find((s) => s.main) || series[0], box, formatY);
}

/** A vertical rule per event within the time axis, under the lines, with its title on hover. */
function drawEvents(svg, events, box, ext) {
  let drawn = 0;
  for (const { at, kind, title } of events) {
    if (at < ext.x0 || at > ext.x1) continue;
    const x = box.x(at);
    const rule = svgEl("line", { x1: x, x2: x, y1: MARGIN.top, y2: box.height - MARGIN.bottom,
      class: `event event-${kind}`, "data-kind": kind });
    rule.append(svgEl("title", {}, title));
    svg.append(rule);
    drawn += 1;
  }
  svg.dataset.events = String(drawn);
}

/** A vertical rule and the nearest value of `main` under the mouse. */
function addHover(svg, main, box, formatY) {
  const points = main.points.filter((p) => p[1] !== null && Number.isFinite(p[1]));
  if (!points.length) return;
  const rule = svgEl("line", { y1: MARGIN.top, y2: box.height - MARGIN.bottom, class: "hover", visibility: "hidden" });
  const label = svgEl("text", { y: MARGIN.top + 10, class: "hover-label", visibility: "hidden" });
  const area = svgEl("rect", { x: MARGIN.left, y: MARGIN.top, width: box.width - MARGIN.left - MARGIN.right,
    height: box.height - MARGIN.top - MARGIN.bottom, fill: "transparent" });
  svg.append(rule, label, area);
  area.addEventListener("mousemove", (event) => {
    const scale = box.width / svg.getBoundingClientRect().width;
    const x = event.offsetX * scale;
    let best = points[0];
    for (const p of points) if (Math.abs(box.x(p[0]) - x) < Math.abs(box.x(best[0]) - x)) best = p;
    const px = box.x(best[0]);
    rule.setAttribute("x1", String(px));
    rule.setAttribute("x2", String(px));
    label.setAttribute("x", String(px + (px > box.width / 2 ? -6 : 6)));
    label.setAttribute("text-anchor", px > box.width / 2 ? "end" : "start");
    const value = formatY ? formatY(best[1]) : Number(best[1].toPrecision(4)).toString();
    label.textContent = `${value} at ${new Date(best[0]).toLocaleTimeString()}`;
    rule.setAttribute("visibility", "visible");
    label.setAttribute("visibility", "visible");
  });
  area.addEventListener("mouseleave", () => {
    rule.setAttribute("visibility", "hidden");
    label.setAttribute("visibility", "hidden");
  });
}
