// flowlab's live Bokeh document: the front end of flowlab/widgets/live.py (read its docstring first).
// Kernel -> page only: this module never sets or saves model state, so nothing flows back to a busy kernel.

const LOGS = (globalThis.__flowlab_live_logs ??= new Map());   // widget key -> messages since the last keyframe
const LOADING = (globalThis.__flowlab_bokeh_loading ??= new Map());   // BokehJS version -> Promise<Bokeh>
const MAX_LOG = 5000;
// widget key -> its views. Updating a display (the end of every cell updates the static copy a saved notebook keeps)
// makes the page render the widget anew, leaving the old view's element out of the page; building the document
// again was a ~0.5 s task, so the new view takes the old one's drawing over instead (``View.adopt``).
const VIEWS = (globalThis.__flowlab_live_views ??= new Map());

async function gunzip(view) {
  const stream = new Blob([view]).stream().pipeThrough(new DecompressionStream("gzip"));
  return await new Response(stream).text();
}

// BokehJS from the kernel's BokehRuntime model, evaluated once per page and version. Every view awaits the same
// promise: a view must not start while the second bundle (Div, Checkbox) is still loading.
async function loadBokeh(model) {
  const ref = model.get("_runtime");
  const runtime = await model.widget_manager.get_model(ref.slice("IPY_MODEL_".length));
  const version = runtime.get("version");
  if (!LOADING.has(version)) {
    LOADING.set(version, (async () => {
      const probes = runtime.get("probes");
      for (const [i, bundle] of runtime.get("bundles").entries()) {
        const bokeh = globalThis.Bokeh?.[version];
        if (bokeh && probes[i] in bokeh.Models) continue;      // this page has it already
        // Bokeh's bundles are scripts that register `Bokeh[version]` on `this`
        new Function(await gunzip(bundle)).call(globalThis);
      }
      const bokeh = globalThis.Bokeh?.[version];
      if (!bokeh) throw new Error(`BokehJS ${version} did not load`);
      adjust(bokeh);
      return bokeh;
    })());
  }
  return LOADING.get(version);
}

// BokehJS 3.9 as the live widgets use it, adjusted where it did work that changed nothing on the screen (each
// function below says what and how much it cost): once per BokehJS version in the page, whichever view loads it first.
function adjust(Bokeh) {
  if (Bokeh.__flowlabAdjusted) return;
  Bokeh.__flowlabAdjusted = true;
  layoutOnlyOnChange(Bokeh);
  cssValuesKept(Bokeh);
  emptyGlyphElementsStayPut(Bokeh);
  paintsShareFrames(Bokeh);
  dataUpdatesSkipRepeats(Bokeh);
  colorBarImageKept(Bokeh);
}

// A function that has `then` run once after the task calling it (the next task: a MessageChannel message; timers
// are throttled to once a second in a hidden tab), however often that task calls it.
function afterThisTask(then) {
  const channel = new MessageChannel();
  let asked = false;
  channel.port1.onmessage = () => { asked = false; then(); };
  return () => {
    if (asked) return;
    asked = true;
    channel.port2.postMessage(null);
  };
}

// BokehJS 3.9 lays a plot out again before a paint when one of its side panels (axes, titles) "changed size", but an
// axis's layout box is mostly left 0×0 by a layout of the whole document, so the check holds on almost every paint,
// and each plot's relayout is one of the whole document, measuring every element of it: a two-row WatchPanel laid
// its document out ~7 times per update, most of the page's work (issue 33). Here a plot is laid out again only when
// the room its side panels take on some side changes (or a layout was requested): per side, the sum of its panels'
// sizes or the plot's min_border there, whichever is larger, as BokehJS computes the frame's inset. A y-axis whose
// tick labels grow from 42 to 46 px inside a 50 px border moves nothing (a relayout every few seconds while a loss
// fell, each a frame of 33-75 ms); the axis draws its labels from the frame's edge whatever its box says.
// It changes no result, only skips layouts that would come out the same.
function layoutOnlyOnChange(Bokeh) {
  const plot = Bokeh.require("models/plots/plot_canvas").PlotView.prototype;
  const original = plot._invalidate_layout_if_needed;
  const borders = {left: "left", right: "right", above: "top", below: "bottom"};
  plot._invalidate_layout_if_needed = function () {
    if (this._needs_layout) {
      this.__flowlabPanelSizes = undefined;
      return original.call(this);
    }
    const room = {left: 0, right: 0, above: 0, below: 0};
    for (const panel of this.model.side_panels) {
      const layout = this.renderer_views.get(panel)?.layout;
      if (layout == null) continue;
      const side = layout.panel?.side;
      if (!(side in room) || layout._content_size == null) return original.call(this);    // not a side panel
      const { width, height } = layout._content_size();
      room[side] += layout.panel.is_horizontal ? height : width;
    }
    const model = this.model;
    const key = Object.entries(borders).map(([side, border]) =>
      Math.max(room[side], model[`min_border_${border}`] ?? model.min_border ?? 0)).join(" ");
    if (key === this.__flowlabPanelSizes) return;
    this.__flowlabPanelSizes = key;
    return original.call(this);
  };
}

// BokehJS 3.9 draws each line, fill and text of a plot (axis lines, ticks, tick labels, grids, titles, borders) with
// values it reads at every paint from the element's CSS (--bk-* variables, and the plot's font size, through
// getComputedStyle), several reads per visual, and the first read after any change of style brings the style of the
// whole page up to date first: in the page benchmark this was ~40% of the main thread's tasks over 40 ms, and with
// these reads kept for one task only, still up to six forced style updates in a frame (issue 33). Here the values
// are kept until BokehJS changes something that can change them (a style sheet that sets custom properties, a sheet
// installed or removed, an element's classes or inline styles) or for CSS_VALUES_KEPT_MS at most, so a change from
// outside BokehJS (a theme) shows within that time. A sheet is written only when its text changes (BokehJS writes
// each renderer's position sheet again at every paint, mostly with the same text, and a rewritten sheet makes the
// page's style dirty).
const CSS_VALUES_KEPT_MS = 1000;

function cssValuesKept(Bokeh) {
  const visual = Bokeh.require("core/visuals/visual").VisualProperties.prototype;
  let cache = new Map();         // element -> Map(property -> value)
  let since = performance.now(), checked = false;     // when the cache started; its age checked in this task
  const forget = () => { cache = new Map(); since = performance.now(); };
  const uncheckLater = afterThisTask(() => { checked = false; });
  const value = (el, property, read) => {
    if (!checked) {               // once a task: the age
      checked = true;
      uncheckLater();
      if (performance.now() - since > CSS_VALUES_KEPT_MS) forget();
    }
    let values = cache.get(el);
    if (values === undefined) cache.set(el, (values = new Map()));
    if (!values.has(property)) values.set(property, read());
    return values.get(property);
  };
  visual._get_css_value = function (name) {
    const property = `${this.css_prefix}${name}`;
    return value(this.obj.el, property, () => getComputedStyle(this.obj.el).getPropertyValue(property));
  };
  const plot = Bokeh.require("models/plots/plot_canvas").PlotView.prototype;
  const fontSize = Object.getOwnPropertyDescriptor(plot, "base_font_size");
  Object.defineProperty(plot, "base_font_size", {
    configurable: true,
    get() { return value(this.el, "font-size", () => fontSize.get.call(this)); },
  });
  const dom = Bokeh.require("core/dom");
  const inline = dom.InlineStyleSheet.prototype;
  const update = inline._update;
  inline._update = function (css) {
    const before = this.el.textContent;
    if (before === css) return;
    // only a sheet that sets or set a custom property can change a --bk-* value; the sheets BokehJS rewrites while
    // it paints place elements (left, top, width, height)
    if (css.includes("--") || before.includes("--")) forget();
    update.call(this, css);
  };
  // whatever else changes what an element's CSS says: sheets coming and going, its classes, its inline styles
  const forgetting = [[dom.StyleSheet.prototype, ["install", "uninstall"]],
                      [Bokeh.require("core/dom_view").DOMComponentView.prototype, ["_update_css_classes"]],
                      [Bokeh.require("models/ui/styled_element").StyledElementView.prototype, ["_apply_styles"]]];
  for (const [proto, methods] of forgetting) {
    for (const method of methods) {
      const original = proto[method];
      proto[method] = function (...args) {
        forget();
        return original.apply(this, args);
      };
    }
  }
}

// BokehJS 3.9 gives every renderer an element, in a layer under the plot's canvas, and at every paint places it over
// what the renderer draws, through a style sheet of the element's own (left, top, width, height). A glyph renderer
// draws on the canvas and puts nothing in its element, yet that box is its glyphs' extent, which moves whenever the
// data does: every update rewrote a sheet per glyph (~50 a second for two WatchPanels and a TrainingProgress), and
// each rewrite had the page bring its styles up to date: half of the CPU time of the panels' paints (issue 33: 28 ->
// 12 ms a frame, median).
// Here a glyph renderer's element is placed only while it holds something besides its style sheets; an empty one is
// invisible wherever it is. It changes no pixel.
function emptyGlyphElementsStayPut(Bokeh) {
  const glyph = Bokeh.require("models/renderers/glyph_renderer").GlyphRendererView.prototype;
  const original = glyph.update_position;
  glyph.update_position = function () {
    if (this.el.childNodes.length === 0 && [...this.shadow_el.children].every((e) => e.localName === "style")) return;
    return original.call(this);
  };
}

// BokehJS paints every plot whose data changed in one animation frame: a message that updates a WatchPanel and a
// TrainingProgress has five or six plots paint in one task, 15-25 ms of CPU, and on a machine whose other core
// trains, twice that in wall time: the page's long tasks (issue 33). Here the plots that come due once a frame has
// painted for PAINT_BUDGET_MS wait for the next frame (first in it, in the order they came), so a frame holds about
// that much painting whatever the number of plots; each is painted once, with its latest data. Only BokehJS's
// throttled repaint goes through this: a paint after a layout is still immediate.
const PAINT_BUDGET_MS = 8;

function paintsShareFrames(Bokeh) {
  const plot = Bokeh.require("models/plots/plot_canvas").PlotView.prototype;
  const repaint = plot.repaint;
  let started = null;                 // when this task's first paint started; null until one does
  const restartLater = afterThisTask(() => { started = null; });
  const waiting = new Set();          // plots left for the next frame, in order
  let requested = false;
  const next = () => {
    requested = false;
    const due = [...waiting];
    waiting.clear();
    for (const view of due) {
      if (!view.is_destroyed) shared.call(view);
    }
  };
  const shared = plot.repaint = function () {
    const now = performance.now();
    if (started === null) {
      started = now;
      restartLater();
    } else if (now - started >= PAINT_BUDGET_MS) {
      waiting.add(this);
      if (!requested) {
        requested = true;
        requestAnimationFrame(next);
      }
      return;
    }
    waiting.delete(this);
    return repaint.call(this);
  };
}

// BokehJS gives each glyph renderer five glyph views (the glyph, and its selected, unselected, muted and decimated
// forms), and at every data update each derived view redefines, per property, an accessor that reads the glyph's
// value (``_inherit_from``), two Object.defineProperty calls that leave the object in V8's slow dictionary mode; and it
// copies each column through an index of the rows shown (``Indices.select``) that, when every row is shown, is a plain
// copy. Those were the largest items of the page's message tasks (issue 33). Here an accessor already reading the same
// base is kept, and an all-rows selection is a slice. Values are unchanged.
function dataUpdatesSkipRepeats(Bokeh) {
  const glyph = Bokeh.require("models/glyphs/glyph").GlyphView.prototype;
  const inheritFrom = glyph._inherit_from, defineAttr = glyph._define_attr;
  glyph._inherit_from = function (attr, base) {
    const bases = (this.__flowlabBases ??= new Map());
    if (bases.get(attr) === base && this[`inherited_${attr}`] === true) return;
    bases.set(attr, base);
    return inheritFrom.call(this, attr, base);
  };
  glyph._define_attr = function (attr, value) {
    this.__flowlabBases?.delete(attr);
    return defineAttr.call(this, attr, value);
  };
  const bits = Bokeh.require("core/util/bitset").BitSet.prototype;
  const select = bits.select;
  const plain = new Set([Array, Float64Array, Float32Array, Int32Array, Uint32Array, Int16Array, Uint16Array,
                         Int8Array, Uint8Array, Uint8ClampedArray]);    // (not BokehJS's n-d arrays: shaped)
  bits.select = function (array) {
    if (plain.has(array?.constructor) && this.size <= array.length && this.count === this.size) {
      return array.slice(0, this.size);
    }
    return select.call(this, array);
  };
}

// BokehJS draws a color bar's palette into a new canvas, and reads it back with getImageData, at every layout of its
// plot; a HealthPanel's map sets its colour range at each update, which lays the bar out again: ~40% of the JavaScript
// of the page's longest message tasks while a HealthPanel drew (issue 33). Here the image is drawn again only when
// what it shows changes: the palette, its orientation or the part of it shown.
function colorBarImageKept(Bokeh) {
  const bar = Bokeh.require("models/annotations/color_bar").ColorBarView.prototype;
  const draw = bar._set_canvas_image;
  bar._set_canvas_image = function () {
    const key = [this.color_mapper, this.color_mapper.palette, this.orientation, this._index_low, this._index_high];
    if (this.__flowlabImageKey?.every((part, i) => part === key[i])) return;
    this.__flowlabImageKey = key;
    return draw.call(this);
  };
}

function column(spec, buffers) {
  if (!spec || spec.buffer === undefined) return spec;
  const view = buffers[spec.buffer];
  // copy: a DataView's offset need not be a multiple of 8
  return new Float64Array(view.buffer.slice(view.byteOffset, view.byteOffset + view.byteLength));
}

function splice(old, at, added) {
  if (old.length < at) return null;
  if (!(added instanceof Float64Array)) return Array.from(old).slice(0, at).concat(added);   // text
  const out = new Float64Array(at + added.length);
  out.set(at === old.length ? old : old.slice(0, at));
  out.set(added, at);
  return out;
}

// One rendering of the document in `el`: built from the snapshot, then kept current by the messages.
class View {
  constructor(Bokeh, el) {
    this.Bokeh = Bokeh;
    this.el = el;
    this.doc = null;
    this.views = null;
    this.seq = -1;
  }

  async build(snapshot) {
    this.dispose();
    const { Document } = this.Bokeh.require("document/index");
    this.doc = Document.from_json(snapshot.doc);
    this.seq = snapshot.seq;
    this.views = await this.Bokeh.embed.add_document_standalone(this.doc, this.el);
  }

  // Take over the drawing of a view of the same widget whose element left the page.
  adopt(el) {
    el.replaceChildren(...this.el.childNodes);
    this.el = el;
  }

  apply(msg, buffers) {
    if (!this.doc || msg.seq <= this.seq) return;
    if (!msg.key && msg.seq !== this.seq + 1) return;      // missed a message: wait for the next keyframe
    for (const [id, props] of msg.props) this.doc.get_model_by_id(id)?.setv(props);
    for (const [id, at, columns] of msg.data) {
      const source = this.doc.get_model_by_id(id);
      if (!source) continue;
      const data = {};
      for (const [name, spec] of Object.entries(columns)) {
        const added = column(spec, buffers);
        data[name] = at === 0 ? added : splice(source.data[name] ?? [], at, added);
        if (data[name] === null) return;                       // cannot happen in sequence; be safe
      }
      source.data = data;
    }
    this.seq = msg.seq;
  }

  dispose() {
    this.views?.clear();
    const documents = this.Bokeh.documents;
    const i = this.doc ? documents.indexOf(this.doc) : -1;
    if (i >= 0) documents.splice(i, 1);
    this.doc = this.views = null;
    this.el.replaceChildren();
  }
}

function showError(el, error) {
  console.error("flowlab live widget:", error);
  const pre = document.createElement("pre");
  pre.textContent = `flowlab: this widget could not be drawn: ${error}`;
  el.replaceChildren(pre);
}

export default {
  initialize({ model }) {
    const key = model.get("_key");
    const log = [];
    LOGS.set(key, log);
    const keep = (msg, buffers) => {
      if (msg.key) log.length = 0;
      log.push([msg, buffers]);
      if (log.length > MAX_LOG) log.splice(0, log.length - MAX_LOG);
    };
    model.on("msg:custom", keep);
    return () => {
      model.off("msg:custom", keep);
      LOGS.delete(key);
    };
  },

  async render({ model, el }) {
    el.classList.add("flowlab-live");
    let view = null;
    let chain = Promise.resolve();           // builds and updates run one after the other
    const run = (step) => (chain = chain.then(step).catch((e) => showError(el, e)));
    const rebuild = () => run(async () => {
      const snapshot = JSON.parse(model.get("_snapshot"));
      if (!view || snapshot.seq <= view.seq) return;        // not loaded, or already as new
      await view.build(snapshot);
      for (const [msg, buffers] of LOGS.get(model.get("_key")) ?? []) view.apply(msg, buffers);
    });
    const update = (msg, buffers) => run(() => view.apply(msg, buffers));
    const detach = () => {
      model.off("change:_snapshot", rebuild);
      model.off("msg:custom", update);
    };
    const key = model.get("_key");
    run(async () => {
      await new Promise((resolve) => setTimeout(resolve, 0));     // the view this one replaces has left the page
      const views = VIEWS.get(key) ?? new Set();
      VIEWS.set(key, views);
      const gone = [...views].filter((v) => !v.el.isConnected);
      const taken = gone.find((v) => v.doc);
      for (const v of gone) {
        v.owner.detach();                     // this view's listeners take over from its
        await v.owner.idle();                 // the updates it had queued go first, in order
        if (v !== taken) {
          views.delete(v);
          v.dispose();
        }
      }
      if (taken) {
        taken.adopt(el);
        view = taken;
      } else {
        view = new View(await loadBokeh(model), el);
        views.add(view);
      }
      view.owner = {detach, idle: () => chain};
    });
    rebuild();                      // a view taken over that is as new as the snapshot keeps its drawing
    model.on("change:_snapshot", rebuild);
    model.on("msg:custom", update);
    return () => {
      detach();
      run(() => {
        if (view && view.owner?.detach === detach) {        // not taken over by a later view
          VIEWS.get(key)?.delete(view);
          view.dispose();
        }
      });
    };
  },
};
