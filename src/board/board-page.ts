import type { BoardScope } from './board.options.js';

export { BOARD_SCRIPT } from './board-script.js';
export { BOARD_STYLES } from './board-styles.js';

function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

/**
 * The board's one page. No inline script or style (the page runs under a
 * policy of `script-src 'self'; style-src 'self'`): the script reads the
 * base path and the anti-forgery token from the two meta elements.
 */
export function boardPage(page: { base: string; csrfToken: string; scope: BoardScope }): string {
  const base = escapeHtml(page.base);
  const scoped = 'tenant' in page.scope ? page.scope.tenant : undefined;
  const scopeText = scoped === undefined ? 'All tenants' : `Tenant ${scoped}`;
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="board-base" content="${base}">
<meta name="board-csrf" content="${escapeHtml(page.csrfToken)}">
<meta name="board-tenant" content="${escapeHtml(scoped ?? '')}">
<title>Idempotency board</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="${base}/assets/board.css">
<script src="${base}/assets/board.js" defer></script>
</head>
<body>
<header>
  <h1>Idempotency board</h1>
  <span class="scope" id="scope">${escapeHtml(scopeText)}</span>
  <span class="updated" id="updated"></span>
  <button type="button" id="refresh">Refresh</button>
</header>
<nav>
  <a href="#overview">Overview</a>
  <a href="#stuck">Stuck keys</a>
  <a href="#lookup">Lookup</a>
  <a href="#dead">Dead letters</a>
</nav>
<main>
<section id="overview">
  <h2>Overview</h2>
  <div class="cards" id="key-cards"></div>
  <p class="note" id="keys-note"></p>
  <h3>Keys per tenant</h3>
  <table id="tenants"><thead><tr><th>Tenant</th><th>In flight</th><th>Past their lease</th><th>Completed</th><th>Expired, awaiting the sweep</th></tr></thead><tbody></tbody></table>
  <div class="pair">
    <div><h3>Sweeper (this instance)</h3><dl id="sweeper"></dl></div>
    <div><h3>Outbox</h3><dl id="outbox"></dl></div>
  </div>
  <div id="outcomes">
    <h3>Outcomes per minute, last hour (this instance)</h3>
    <div id="chart" class="chart"></div>
    <ul id="legend" class="legend"></ul>
    <h3>Per route, last hour</h3>
    <table id="routes"><thead><tr><th>Route</th></tr></thead><tbody></tbody></table>
  </div>
</section>
<section id="stuck">
  <h2>Stuck keys</h2>
  <p class="note">In-flight keys, those past their lease first, then the longest held. Keys are never shown whole: their first and last characters, length and tag tell them apart.</p>
  <table id="stuck-keys"><thead><tr><th>Tenant</th><th>Key</th><th>Attempt</th><th>Age</th><th>Lease ends</th><th></th></tr></thead><tbody></tbody></table>
</section>
<section id="lookup">
  <h2>Lookup</h2>
  <form id="lookup-form" autocomplete="off">
    <label>Tenant <input name="tenant" id="lookup-tenant" required></label>
    <label>Key <input name="key" id="lookup-key" required></label>
    <button type="submit">Look up</button>
  </form>
  <div id="lookup-result"></div>
</section>
<section id="dead">
  <h2>Dead letters</h2>
  <p class="note">Outbox messages that used up their attempts. Redrive one once its cause is fixed: it is delivered again from its first attempt.</p>
  <button type="button" id="redrive-all">Redrive all</button>
  <table id="dead-letters"><thead><tr><th>Id</th><th>Tenant</th><th>Topic</th><th>Attempts</th><th>Last error</th><th>Created</th><th></th></tr></thead><tbody></tbody></table>
</section>
</main>
<dialog id="confirm">
  <form method="dialog">
    <p id="confirm-text"></p>
    <div class="buttons"><button value="cancel" id="confirm-cancel">Cancel</button> <button value="ok" id="confirm-ok">Confirm</button></div>
  </form>
</dialog>
<div id="toast" role="status" aria-live="polite"></div>
</body>
</html>
`;
}
