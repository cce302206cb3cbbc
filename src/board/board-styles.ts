/** The board's style sheet, served as `assets/board.css`. */
export const BOARD_STYLES = `
:root { --ink: #1d2330; --muted: #5f6b7a; --line: #dde2e8; --panel: #f6f8fa; --accent: #2457c5; --bad: #b42318; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--ink); background: #fff; }
header { display: flex; gap: 16px; align-items: center; padding: 12px 24px; border-bottom: 1px solid var(--line); }
header h1 { font-size: 18px; margin: 0; }
.scope { background: var(--panel); border: 1px solid var(--line); border-radius: 12px; padding: 2px 10px; }
.updated { color: var(--muted); margin-left: auto; }
nav { display: flex; gap: 16px; padding: 8px 24px; border-bottom: 1px solid var(--line); }
nav a { color: var(--accent); text-decoration: none; }
main { padding: 0 24px 48px; max-width: 1100px; }
section { border-bottom: 1px solid var(--line); padding: 8px 0 20px; }
h2 { font-size: 16px; }
h3 { font-size: 14px; margin: 18px 0 6px; }
.cards { display: flex; gap: 12px; flex-wrap: wrap; }
.card { background: var(--panel); border: 1px solid var(--line); border-radius: 6px; padding: 10px 14px; min-width: 150px; }
.card .value { font-size: 24px; font-weight: 600; }
.card .label { color: var(--muted); }
.note { color: var(--muted); }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { color: var(--muted); font-weight: 500; }
tr.lease-passed td { background: #fff4e5; }
td.key { font-family: ui-monospace, monospace; }
td.route .handler { color: var(--muted); font-size: 12px; }
td.error, p.error { color: var(--bad); }
.pair { display: flex; gap: 48px; flex-wrap: wrap; }
dl { display: grid; grid-template-columns: max-content auto; gap: 2px 16px; margin: 0; }
dt { color: var(--muted); }
dd { margin: 0; }
button { font: inherit; padding: 3px 12px; border: 1px solid var(--line); border-radius: 4px; background: #fff; cursor: pointer; }
button:hover { border-color: var(--accent); }
button:disabled { opacity: 0.5; cursor: default; }
form label { margin-right: 12px; }
input { font: inherit; padding: 3px 6px; border: 1px solid var(--line); border-radius: 4px; }
pre { background: var(--panel); padding: 8px; overflow: auto; max-height: 300px; }
.chart svg { width: 100%; max-width: 900px; height: auto; }
.chart .grid { stroke: var(--line); }
.chart .axis { fill: var(--muted); font-size: 10px; }
.legend { list-style: none; display: flex; gap: 14px; flex-wrap: wrap; padding: 0; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 4px; border-radius: 2px; }
.bar.executed, .swatch.executed { fill: #2e7d32; background: #2e7d32; }
.bar.takeover, .swatch.takeover { fill: #00897b; background: #00897b; }
.bar.replayed, .swatch.replayed { fill: #1565c0; background: #1565c0; }
.bar.failure-stored, .swatch.failure-stored { fill: #f9a825; background: #f9a825; }
.bar.kept, .swatch.kept { fill: #6d4c41; background: #6d4c41; }
.bar.released, .swatch.released { fill: #b0bec5; background: #b0bec5; }
.bar.conflict, .swatch.conflict { fill: #ef6c00; background: #ef6c00; }
.bar.lease-lost, .swatch.lease-lost { fill: #ad1457; background: #ad1457; }
.bar.mismatch, .swatch.mismatch { fill: #8e24aa; background: #8e24aa; }
.bar.unavailable, .swatch.unavailable { fill: #c62828; background: #c62828; }
.bar.error, .swatch.error { fill: #424242; background: #424242; }
dialog { border: 1px solid var(--line); border-radius: 8px; max-width: 520px; }
dialog .buttons { display: flex; justify-content: flex-end; gap: 8px; }
#toast { position: fixed; bottom: 16px; right: 16px; padding: 8px 14px; border-radius: 6px; background: var(--ink); color: #fff; display: none; max-width: 480px; }
#toast.shown { display: block; }
#toast.error { background: var(--bad); }
`;
