// Rolling time-series charts (uPlot) fed one point per refresh: the overview's message rates
// and queued messages, and a queue's rates on its page.

import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";

/** How many points a chart keeps: 10 minutes at the 5 s refresh. */
const POINTS_MAX = 120;
const COLOURS = ["#e8590c", "#1c7ed6", "#2f9e44", "#ae3ec9"];

export class RollingChart {
  /** `series` names the lines; `el` receives the chart. */
  constructor(el, title, series) {
    this.el = el;
    this.names = series;
    this.data = [[], ...series.map(() => [])];
    this.plot = new uPlot(
      {
        title,
        width: Math.max(320, el.clientWidth || 560),
        height: 200,
        scales: { y: { range: (u, min, max) => [0, Math.max(1, max * 1.1)] } },
        series: [{}, ...series.map((label, i) => ({ label, stroke: COLOURS[i % COLOURS.length], width: 2 }))],
        axes: [{}, { size: 60 }],
      },
      this.data,
      el,
    );
  }

  /** Adds one point per series, at `t` (seconds). The last values are kept on the element
   * (`data-last`) so that the browser test can read what the chart shows. */
  push(t, values) {
    this.data[0].push(t);
    values.forEach((v, i) => this.data[i + 1].push(v));
    if (this.data[0].length > POINTS_MAX) this.data.forEach((s) => s.shift());
    this.plot.setData(this.data);
    this.el.dataset.last = JSON.stringify(Object.fromEntries(this.names.map((n, i) => [n, values[i]])));
    this.el.dataset.points = String(this.data[0].length);
  }

  destroy() {
    this.plot.destroy();
  }
}
