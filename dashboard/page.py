"""What a browser can ask a served dashboard page: JavaScript expressions for Playwright's
``page.evaluate`` (the browser tests and ``benchmarks/dashboard_latency.py`` use them), and the
renderer name they find the training curve by."""

from __future__ import annotations

__all__ = ["CURVE_NAME", "CURVE_POINTS", "FIGURE_IDS", "TITLES"]

CURVE_NAME = "gnnpipe-training-curve"  # bokeh renderer name of the training curves


def _every(model_type: str, value: str) -> str:
    """An expression listing ``value`` (JS, of model ``m``) for every bokeh model of a type."""
    return f"""() => {{
  const out = [];
  for (const doc of window.Bokeh.documents)
    for (const m of doc.all_models)
      if (m.type === '{model_type}' || (m.constructor && m.constructor.__name__ === '{model_type}'))
        out.push({value});
  return out;
}}"""


#: Points on the longest training curve.
CURVE_POINTS = f"""() => {{
  let n = 0;
  for (const doc of window.Bokeh.documents)
    for (const m of doc.all_models)
      if (m.name === '{CURVE_NAME}') {{
        const cols = Object.values(m.data_source.data);
        if (cols.length) n = Math.max(n, cols[0].length);
      }}
  return n;
}}"""
#: Every plot title's text.
TITLES = _every("Title", "m.text")
#: Every figure's model id: a plot swapped whole for an update gets a new one.
FIGURE_IDS = _every("Figure", "m.id")
