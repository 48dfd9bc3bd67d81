"""The report's inline stylesheet and its small table-sorting script (no network resources)."""

CSS = """
:root { --ink: #1f2933; --muted: #6b7785; --line: #e3e8ee; --bg: #f6f8fa; --good: #1a7f37; --bad: #b42318;
        --accent: #2f6fed; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: var(--ink);
       background: var(--bg); }
header { background: #17202a; color: #fff; padding: 22px 32px 18px; }
header h1 { margin: 0 0 4px; font-size: 22px; font-weight: 600; }
header .meta { color: #b8c4d0; font-size: 13px; }
header nav { margin-top: 10px; font-size: 13px; }
header nav a { color: #9ec1ff; text-decoration: none; margin-right: 16px; }
header nav a:hover { text-decoration: underline; }
header .meta span + span::before { content: "·"; margin: 0 8px; color: #6b7785; }
main { padding: 20px 32px 40px; max-width: 1500px; }
section { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 16px 20px;
          margin-bottom: 18px; }
h2 { font-size: 16px; margin: 0 0 12px; }
h3 { font-size: 14px; margin: 16px 0 8px; color: #36424e; }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(200px, 1fr)); gap: 12px; }
.card { border: 1px solid var(--line); border-radius: 8px; padding: 10px 14px; background: #fbfcfd; }
.card .k { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
.card .v { font-size: 18px; font-weight: 600; margin-top: 2px; white-space: nowrap; }
.card .v .arrow { color: var(--muted); font-weight: 400; margin: 0 4px; }
.card .d { font-size: 12px; margin-top: 2px; }
.good { color: var(--good); } .bad { color: var(--bad); } .muted { color: var(--muted); }
.timings { margin-top: 12px; color: var(--muted); font-size: 13px; }
.timings b { color: var(--ink); font-weight: 600; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { background: #f1f4f7; font-weight: 600; position: sticky; top: 0; white-space: nowrap; }
th.sortable { cursor: pointer; user-select: none; }
th.sortable::after { content: " ⇅"; color: #9aa5b1; font-weight: 400; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr:hover td { background: #f8fafc; }
.scroll { max-height: 520px; overflow: auto; border: 1px solid var(--line); border-radius: 6px; }
code, .mono { font-family: "SFMono-Regular", Menlo, Consolas, monospace; font-size: 12px; }
.ops { font-family: "SFMono-Regular", Menlo, Consolas, monospace; font-size: 12px; color: #36424e; }
.swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 6px;
          border: 1px solid rgba(0,0,0,.25); vertical-align: -1px; }
.bar { position: relative; min-width: 120px; }
.bar i { position: absolute; left: 0; top: 4px; bottom: 4px; background: #d6e4ff; border-radius: 3px; }
.bar span { position: relative; }
.pill { display: inline-block; padding: 0 7px; border-radius: 10px; background: #eef2f6; font-size: 12px;
        margin: 1px 2px 1px 0; white-space: nowrap; }
.legend { margin: 4px 0 10px; font-size: 12px; color: var(--muted); }
.legend span { margin-right: 14px; white-space: nowrap; }
.pictures { display: grid; grid-template-columns: 1fr; gap: 14px; }
.picture { border: 1px solid var(--line); border-radius: 6px; overflow: auto; max-height: 780px; background: #fff; }
.picture h3 { margin: 0; padding: 8px 12px; background: #f1f4f7; border-bottom: 1px solid var(--line);
              position: sticky; top: 0; left: 0; }
.picture svg.graph { display: block; max-width: 100%; height: auto; margin: 8px auto; }
.note { background: #fff8e6; border: 1px solid #f2d58b; border-radius: 6px; padding: 8px 12px; margin: 0 0 10px; }
.reasons td:first-child { width: 220px; } .reasons td.num { width: 70px; }
.meter { height: 12px; margin-top: 3px; background: #f1f4f7; border-radius: 3px; }
.meter i { display: block; height: 100%; background: #f5b971; border-radius: 3px; }
.name { font-family: "SFMono-Regular", Menlo, Consolas, monospace; font-size: 12px; word-break: break-all; }
footer { color: var(--muted); font-size: 12px; padding: 0 32px 24px; }
"""

# Click a header to sort its table: numbers by data-v, text by content; a second click reverses.
SORT_SCRIPT = """
document.querySelectorAll("table.sort").forEach(function (table) {
  table.querySelectorAll("th.sortable").forEach(function (th, col) {
    th.addEventListener("click", function () {
      var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      var desc = th.dataset.dir !== "desc"; th.dataset.dir = desc ? "desc" : "asc";
      rows.sort(function (a, b) {
        var x = a.cells[col], y = b.cells[col];
        var u = x.dataset.v !== undefined ? parseFloat(x.dataset.v) : x.textContent.toLowerCase();
        var v = y.dataset.v !== undefined ? parseFloat(y.dataset.v) : y.textContent.toLowerCase();
        return (u < v ? -1 : u > v ? 1 : 0) * (desc ? -1 : 1);
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
"""
