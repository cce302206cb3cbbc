// Sends one fixed sequence of requests to two running instances of the sample app and compares every answer byte
// for byte (status line, header names in order with their values, body), after a listed set of normalisations of
// what must differ between two runs (dates, generated ids, this run's keys). Written for issue 27: the sample's
// answers are the same on both adapters before and after a refactor of the request path.
//
//   node scripts/compare-sample-answers.mjs --tree-a <dir> --tree-b <dir> --adapter express|fastify \
//     --db-a <postgres url> --db-b <postgres url> [--port-a 3101] [--port-b 3102]
//       starts `node <tree>/sample-app/start.mjs` in each tree (PORT, HTTP_ADAPTER, DATABASE_URL set; no broker),
//       runs the sequence, stops both. --adapter-a / --adapter-b pick an adapter per side.
//   node scripts/compare-sample-answers.mjs --url-a http://127.0.0.1:3101 --url-b http://127.0.0.1:3102 \
//     [--db-a <url>] [--db-b <url>]
//       compares two instances already running.
//
// A --db-x lets the in-flight step wait for the first attempt's claim in that database (as the e2e spec does)
// instead of a fixed pause. Other options: --show prints every normalised answer; --raw also prints them before
// normalisation. Exit status 0 when every answer is identical, 1 when any differs, 2 on a usage or start-up error.
// Trees need `node_modules` and a database of their own each (keys are per run, but the ledger and tables are not).
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createWriteStream } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { clearTimeout, setTimeout } from 'node:timers';
import { setTimeout as sleep } from 'node:timers/promises';
import { URL } from 'node:url';
import { parseArgs } from 'node:util';

const API_KEY_A = 'demo-key-tenant-a';
const API_KEY_B = 'demo-key-tenant-b';
const START_TIMEOUT_MS = 180_000;
/** Long enough that the duplicates sent meanwhile meet the first attempt in flight. */
const SLOW_MS = 2_000;

/** The normalisations, applied to the head and body of each answer in sequence order; printed at every run. */
const RULES = [
  'N1 header Date: value -> <date>',
  'N2 generated ids ch_/ord_/re_/py_ + hex -> <prefix>_#n, numbered per side by first appearance in the sequence ' +
    '(so a replay must repeat the id of its first answer to stay equal)',
  'N3 ISO 8601 timestamps (2026-01-02T03:04:05.678Z) -> <time#n>, numbered the same way',
  "N4 this run's token (in idempotency keys, refund ids, customers) -> <run>; both sides' tokens have the same length, " +
    'so Content-Length is compared as is',
  'N5 header ETag: the hash after W/"<length>- -> <hash> (it is a hash of a body holding N2/N3 values); the length stays',
  'N6 measured latencies, JSON members "responseTime" and "responseTimeMs" (GET /health) -> "<ms>"; in an answer ' +
    "where N6 changed the body, Content-Length and the ETag's length are those of the normalised body",
  'Not normalised: status line, header names, their order and case, every other header value (Content-Length, ' +
    'Retry-After, Idempotent-Replayed, Location after N2), body bytes',
];

function usage(message) {
  console.error(`${message}\n\nUsage: see the comment at the top of scripts/compare-sample-answers.mjs.`);
  process.exit(2);
}

const { values: args } = parseArgs({
  options: {
    'tree-a': { type: 'string' },
    'tree-b': { type: 'string' },
    'url-a': { type: 'string' },
    'url-b': { type: 'string' },
    'db-a': { type: 'string' },
    'db-b': { type: 'string' },
    'port-a': { type: 'string', default: '3101' },
    'port-b': { type: 'string', default: '3102' },
    adapter: { type: 'string' },
    'adapter-a': { type: 'string' },
    'adapter-b': { type: 'string' },
    show: { type: 'boolean', default: false },
    raw: { type: 'boolean', default: false },
  },
});

// ---------------------------------------------------------------------------------------------------------------
// Raw HTTP: one connection per request, `Connection: close`, every byte the server sent kept.

/**
 * @param {string} baseUrl
 * @param {string} method
 * @param {string} path
 * @param {Array<[string, string]>} headers in order; a name may repeat
 * @param {string | Buffer | undefined} body sent as application/json unless a Content-Type is given
 */
function rawRequest(baseUrl, method, path, headers = [], body = undefined) {
  const url = new URL(baseUrl);
  const payload = body === undefined ? undefined : Buffer.from(body);
  const lines = [`${method} ${path} HTTP/1.1`, `Host: ${url.host}`];
  for (const [name, value] of headers) lines.push(`${name}: ${value}`);
  if (payload) {
    if (!headers.some(([name]) => name.toLowerCase() === 'content-type')) lines.push('Content-Type: application/json');
    lines.push(`Content-Length: ${payload.length}`);
  }
  lines.push('Connection: close', '', '');
  return new Promise((resolvePromise, reject) => {
    const socket = connect({ host: url.hostname, port: Number(url.port) });
    const chunks = [];
    socket.setTimeout(60_000, () => socket.destroy(new Error(`${method} ${path}: no answer within 60 s`)));
    socket.on('connect', () => {
      socket.write(lines.join('\r\n'));
      if (payload) socket.write(payload);
    });
    socket.on('data', (chunk) => chunks.push(chunk));
    socket.on('error', reject);
    socket.on('close', () => {
      const bytes = Buffer.concat(chunks);
      const end = bytes.indexOf('\r\n\r\n');
      if (end < 0) return reject(new Error(`${method} ${path}: no complete head in ${bytes.length} bytes`));
      const head = bytes.subarray(0, end).toString('latin1').split('\r\n');
      const response = { statusLine: head[0], headers: head.slice(1), body: bytes.subarray(end + 4) };
      response.status = Number(response.statusLine.split(' ')[1]);
      response.text = () => decodedBody(response).toString('utf8');
      response.json = () => JSON.parse(response.text());
      resolvePromise(response);
    });
  });
}

/** The body with chunked framing removed (for reading values out of it; comparisons use the bytes as sent). */
function decodedBody(response) {
  const chunked = response.headers.some((line) => /^transfer-encoding:\s*chunked/i.test(line));
  if (!chunked) return response.body;
  const parts = [];
  let at = 0;
  for (;;) {
    const lineEnd = response.body.indexOf('\r\n', at);
    const size = parseInt(response.body.subarray(at, lineEnd).toString('latin1'), 16);
    if (!size) break;
    parts.push(response.body.subarray(lineEnd + 2, lineEnd + 2 + size));
    at = lineEnd + 2 + size + 2;
  }
  return Buffer.concat(parts);
}

// ---------------------------------------------------------------------------------------------------------------
// The sequence. Each step returns [name, response] pairs, in a fixed order whatever order they arrived in.

/**
 * @typedef {{ label: string, url: string, token: string, db?: string, state: Record<string, string> }} Target
 */

const chargeBody = (t, extra = {}) => ({ amount: 2500, currency: 'usd', customer: `cus-${t.token}`, ...extra });
const key = (t, name) => `cmp-${t.token}-${name}`;
const auth = (apiKey = API_KEY_A) => ['Authorization', `Bearer ${apiKey}`];
const postCharge = (t, body, headers) =>
  rawRequest(t.url, 'POST', '/charges', headers, typeof body === 'string' ? body : JSON.stringify(body));
const REQUEST_REFUND =
  'mutation Refund($input: RequestRefundInput!) { requestRefund(input: $input) { id refundId chargeId amount status source created } }';
const refund = (t, input, headers) =>
  rawRequest(t.url, 'POST', '/graphql', headers, JSON.stringify({ query: REQUEST_REFUND, variables: { input } }));

/** Waits until the first attempt of `k` holds its key: in the database when one is given, else a fixed pause. */
async function untilClaimed(t, k) {
  if (!t.db) return sleep(SLOW_MS / 3);
  const { default: pg } = await import('pg');
  const client = new pg.Client({ connectionString: t.db });
  await client.connect();
  try {
    const deadline = Date.now() + 20_000;
    while ((await client.query('SELECT 1 FROM idempotency_keys WHERE key = $1', [k])).rowCount === 0) {
      if (Date.now() > deadline) throw new Error(`${t.label}: the first attempt never claimed ${k}`);
      await sleep(20);
    }
  } finally {
    await client.end();
  }
}

/** @type {Array<[string, (t: Target) => Promise<Array<[string, any]>>]>} */
const STEPS = [
  ['health (public, no module)', async (t) => [['health', await rawRequest(t.url, 'GET', '/health')]]],
  [
    'POST /charges: a new key, its replays, another body under it',
    async (t) => {
      const k = key(t, 'new');
      const body = chargeBody(t, { metadata: { b: 1, a: 2 } });
      const first = await postCharge(t, body, [auth(), ['Idempotency-Key', k]]);
      t.state.chargeId = first.json().id;
      const replay = await postCharge(t, body, [auth(), ['Idempotency-Key', k]]);
      // The same JSON with its members in another order: the same request.
      const reordered = { metadata: { a: 2, b: 1 }, customer: body.customer, currency: body.currency, amount: body.amount };
      const replayReordered = await postCharge(t, reordered, [auth(), ['Idempotency-Key', k]]);
      const mismatch = await postCharge(t, { ...body, amount: 9999 }, [auth(), ['Idempotency-Key', k]]);
      const otherTenant = await postCharge(t, body, [auth(API_KEY_B), ['Idempotency-Key', k]]);
      return [
        ['charge.new (201)', first],
        ['charge.replay (201, replayed)', replay],
        ['charge.replay-reordered-json (201, replayed)', replayReordered],
        ['charge.other-body (422)', mismatch],
        ['charge.same-key-other-tenant (201, new)', otherTenant],
      ];
    },
  ],
  [
    'POST /charges: a duplicate while the first attempt runs',
    async (t) => {
      const k = key(t, 'slow');
      const body = chargeBody(t, { simulate: { delayMs: SLOW_MS } });
      const slow = postCharge(t, body, [auth(), ['Idempotency-Key', k]]);
      await untilClaimed(t, k);
      const duplicate = await postCharge(t, body, [auth(), ['Idempotency-Key', k]]);
      const otherBody = await postCharge(t, { ...body, amount: 1 }, [auth(), ['Idempotency-Key', k]]);
      const first = await slow;
      const replay = await postCharge(t, body, [auth(), ['Idempotency-Key', k]]);
      return [
        ['inflight.first (201)', first],
        ['inflight.duplicate (409)', duplicate],
        ['inflight.other-body (422)', otherBody],
        ['inflight.replay-after (201, replayed)', replay],
      ];
    },
  ],
  [
    'POST /charges: the key header refused',
    async (t) => {
      const body = chargeBody(t);
      const cases = [
        ['key.missing (400)', [auth()]],
        ['key.empty (400)', [auth(), ['Idempotency-Key', '']]],
        ['key.comma (400)', [auth(), ['Idempotency-Key', 'a,b']]],
        ['key.bad-quote (400)', [auth(), ['Idempotency-Key', '"unterminated']]],
        ['key.space (400)', [auth(), ['Idempotency-Key', `${key(t, 'sp')} x`]]],
        ['key.too-long (400)', [auth(), ['Idempotency-Key', `${key(t, 'long')}-${'x'.repeat(300)}`]]],
        ['key.twice (400)', [auth(), ['Idempotency-Key', key(t, 'tw1')], ['Idempotency-Key', key(t, 'tw2')]]],
      ];
      const out = [];
      for (const [name, headers] of cases) out.push([name, await postCharge(t, body, headers)]);
      return out;
    },
  ],
  [
    'POST /charges: authentication and bodies refused',
    async (t) => {
      const k = key(t, 'body');
      const body = chargeBody(t);
      return [
        ['auth.none (401)', await postCharge(t, body, [['Idempotency-Key', key(t, 'noauth')]])],
        ['auth.unknown-api-key (401)', await postCharge(t, body, [auth('not-a-key'), ['Idempotency-Key', key(t, 'badauth')]])],
        ['body.invalid (400)', await postCharge(t, { ...body, currency: 'USD' }, [auth(), ['Idempotency-Key', k]])],
        ['body.unknown-field (400)', await postCharge(t, { ...body, captured: true }, [auth(), ['Idempotency-Key', k]])],
        ['body.malformed-json (400)', await postCharge(t, '{"amount": 25', [auth(), ['Idempotency-Key', k]])],
        ['body.then-valid-same-key (201, new)', await postCharge(t, body, [auth(), ['Idempotency-Key', k]])],
      ];
    },
  ],
  [
    'POST /charges: the handler fails (simulated card processor)',
    async (t) => {
      const out = [];
      for (const [outcome, label] of [
        ['decline', '402 stored'],
        ['error', '500, key kept'],
        ['unavailable', "handler's 503, key kept"],
        ['network', 'ECONNRESET 500, key kept'],
      ]) {
        const k = key(t, outcome);
        const body = chargeBody(t, { simulate: { outcome } });
        out.push([`fail.${outcome} (${label})`, await postCharge(t, body, [auth(), ['Idempotency-Key', k]])]);
        out.push([`fail.${outcome}.retry`, await postCharge(t, body, [auth(), ['Idempotency-Key', k]])]);
      }
      return out;
    },
  ],
  [
    'Routes without the module',
    async (t) => [
      ['get.charge (200)', await rawRequest(t.url, 'GET', `/charges/${t.state.chargeId}`, [auth()])],
      ['get.charge-absent (404)', await rawRequest(t.url, 'GET', `/charges/ch_${'0'.repeat(24)}`, [auth()])],
      ['get.charges-bad-query (400)', await rawRequest(t.url, 'GET', '/charges?limit=0', [auth()])],
      [
        'post.unknown-route (404)',
        await rawRequest(t.url, 'POST', '/nowhere', [auth(), ['Idempotency-Key', key(t, 'nr')]], '{}'),
      ],
    ],
  ],
  [
    'POST /orders/checkout (phases)',
    async (t) => {
      const k = key(t, 'order');
      const body = { amount: 1200, currency: 'eur', customer: `cus-${t.token}`, email: 'buyer@example.com' };
      const first = await rawRequest(t.url, 'POST', '/orders/checkout', [auth(), ['Idempotency-Key', k]], JSON.stringify(body));
      const replay = await rawRequest(t.url, 'POST', '/orders/checkout', [auth(), ['Idempotency-Key', k]], JSON.stringify(body));
      const bad = await rawRequest(
        t.url,
        'POST',
        '/orders/checkout',
        [auth(), ['Idempotency-Key', key(t, 'order-bad')]],
        JSON.stringify({ ...body, email: 'not-an-email' }),
      );
      return [
        ['order.checkout (201)', first],
        ['order.replay (201, replayed)', replay],
        ['order.bad-body (400)', bad],
      ];
    },
  ],
  [
    'POST /graphql requestRefund',
    async (t) => {
      const k = key(t, 'refund');
      const input = { refundId: `rf-${t.token}`, chargeId: t.state.chargeId, amount: 100 };
      const missing = { refundId: `rf-${t.token}-x`, chargeId: 'ch_missing', amount: 1 };
      return [
        ['gql.refund', await refund(t, input, [auth(), ['Idempotency-Key', k]])],
        ['gql.refund.replay', await refund(t, input, [auth(), ['Idempotency-Key', k]])],
        ['gql.refund.other-body', await refund(t, { ...input, amount: 2 }, [auth(), ['Idempotency-Key', k]])],
        ['gql.no-key', await refund(t, input, [auth()])],
        ['gql.comma-key', await refund(t, input, [auth(), ['Idempotency-Key', 'a,b']])],
        ['gql.no-auth', await refund(t, input, [['Idempotency-Key', key(t, 'gql-noauth')]])],
        ['gql.unknown-charge (stored error)', await refund(t, missing, [auth(), ['Idempotency-Key', key(t, 'gql-missing')]])],
        ['gql.unknown-charge.replay', await refund(t, missing, [auth(), ['Idempotency-Key', key(t, 'gql-missing')]])],
      ];
    },
  ],
];

// ---------------------------------------------------------------------------------------------------------------
// Normalisation (RULES) and comparison.

const ID = /\b(ch|ord|re|py)_[0-9a-f]{20,}\b/g;
const LATENCY = /("responseTime(?:Ms)?":)\d+(?:\.\d+)?/g;
const ISO_TIME = /\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z\b/g;

function normaliser(t) {
  const seen = new Map();
  const counters = new Map();
  const ordinal = (kind, value) => {
    const id = `${kind}:${value}`;
    if (!seen.has(id)) {
      const n = (counters.get(kind) ?? 0) + 1;
      counters.set(kind, n);
      seen.set(id, n);
    }
    return seen.get(id);
  };
  const text = (s) =>
    s
      .split(t.token)
      .join('<run>')
      .replace(ID, (whole, prefix) => `${prefix}_#${ordinal(prefix, whole)}`)
      .replace(ISO_TIME, (whole) => `<time#${ordinal('time', whole)}>`);
  return (response) => {
    // latin1 maps each byte to one char and back, so the bytes survive the string replacements.
    const body = text(response.body.toString('latin1'));
    const timed = body.replace(LATENCY, '$1"<ms>"');
    const length = timed === body ? undefined : Buffer.byteLength(timed, 'latin1');
    return {
      statusLine: text(response.statusLine),
      headers: response.headers.map((line) => {
        const colon = line.indexOf(':');
        const name = line.slice(0, colon);
        const lower = name.toLowerCase();
        if (lower === 'date') return `${name}: <date>`;
        if (lower === 'content-length' && length !== undefined) return `${name}: ${length} (N6)`;
        if (lower === 'etag') {
          const etag = line.slice(colon + 1).replace(/^(\s*(?:W\/)?")(?:([0-9a-f]+)-)?[^"]*"/, (_, open, size) => {
            const shown = size === undefined ? '' : `${length === undefined ? size : `${length.toString(16)} (N6)`}-`;
            return `${open}${shown}<hash>"`;
          });
          return `${name}:${etag}`;
        }
        return text(line);
      }),
      body: Buffer.from(timed, 'latin1'),
    };
  };
}

function lineDiff(a, b) {
  // Longest common subsequence over lines; small inputs.
  const m = a.length;
  const n = b.length;
  const lcs = Array.from({ length: m + 1 }, () => new Array(n + 1).fill(0));
  for (let i = m - 1; i >= 0; i--)
    for (let j = n - 1; j >= 0; j--) lcs[i][j] = a[i] === b[j] ? lcs[i + 1][j + 1] + 1 : Math.max(lcs[i + 1][j], lcs[i][j + 1]);
  const out = [];
  let i = 0;
  let j = 0;
  while (i < m || j < n) {
    if (i < m && j < n && a[i] === b[j]) {
      out.push(`      ${a[i]}`);
      i++;
      j++;
    } else if (j >= n || (i < m && lcs[i + 1][j] >= lcs[i][j + 1])) out.push(`    - ${a[i++]}`);
    else out.push(`    + ${b[j++]}`);
  }
  return out;
}

const printable = (buffer, limit = 4000) => {
  const s = buffer.toString('utf8');
  return JSON.stringify(s.length > limit ? `${s.slice(0, limit)}…(${s.length} chars)` : s);
};

function compare(name, a, b) {
  const differences = [];
  if (a.statusLine !== b.statusLine) differences.push(`  status line: A ${a.statusLine} | B ${b.statusLine}`);
  if (a.headers.join('\n') !== b.headers.join('\n')) {
    differences.push('  headers (- A only, + B only):', ...lineDiff(a.headers, b.headers));
  }
  if (Buffer.compare(a.body, b.body) !== 0) {
    let at = 0;
    while (at < a.body.length && at < b.body.length && a.body[at] === b.body[at]) at++;
    differences.push(
      `  body differs from byte ${at} (A ${a.body.length} bytes, B ${b.body.length} bytes):`,
      `    A ${printable(a.body)}`,
      `    B ${printable(b.body)}`,
    );
  }
  return differences;
}

function show(side, response) {
  console.log(`    [${side}] ${response.statusLine}`);
  for (const line of response.headers) console.log(`    [${side}]   ${line}`);
  console.log(`    [${side}]   body ${printable(response.body, 1500)}`);
}

// ---------------------------------------------------------------------------------------------------------------
// Starting and stopping the sample.

async function startSample({ label, tree, adapter, port, db }) {
  const log = join(tmpdir(), `compare-sample-${label}-${adapter}-${port}.log`);
  const env = { ...process.env, PORT: String(port), HTTP_ADAPTER: adapter, DATABASE_URL: db };
  for (const name of ['RABBITMQ_URL', 'NATS_URL', 'SAMPLE_FAULT_INJECTION']) delete env[name];
  const output = createWriteStream(log);
  const child = spawn(process.execPath, [join(tree, 'sample-app', 'start.mjs')], {
    cwd: tree,
    env,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  child.stdout.pipe(output);
  child.stderr.pipe(output);
  const exited = new Promise((resolveExit) => child.once('exit', (code, signal) => resolveExit({ code, signal })));
  const url = `http://127.0.0.1:${port}`;
  const stop = async () => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    child.kill('SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), 15_000);
    await exited;
    clearTimeout(timer);
  };
  console.log(
    `${label}: ${tree} on ${adapter}, ${url}, ${db.replace(/(\/\/[^:@/]*:)[^@/]*@/, '$1***@')} (pid ${child.pid}, log ${log})`,
  );
  const deadline = Date.now() + START_TIMEOUT_MS;
  let gone;
  exited.then((result) => (gone = result));
  for (;;) {
    if (gone) throw new Error(`${label}: the sample exited (${gone.signal ?? gone.code}) before answering; see ${log}`);
    try {
      if ((await rawRequest(url, 'GET', '/health')).status === 200) return { url, stop };
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) {
      await stop();
      throw new Error(`${label}: no 200 from ${url}/health within ${START_TIMEOUT_MS / 1000} s; see ${log}`);
    }
    await sleep(500);
  }
}

// ---------------------------------------------------------------------------------------------------------------

async function main() {
  const runId = randomBytes(4).toString('hex');
  const sides = ['a', 'b'];
  const fromTrees = Boolean(args['tree-a'] || args['tree-b']);
  if (fromTrees && (args['url-a'] || args['url-b'])) usage('Give either --tree-a/--tree-b or --url-a/--url-b.');
  // Every argument is checked before anything starts, so a usage error leaves no server behind.
  const plans = sides.map((side) => {
    const plan = { side, label: side.toUpperCase(), db: args[`db-${side}`] };
    if (fromTrees) {
      plan.tree = args[`tree-${side}`];
      plan.adapter = args[`adapter-${side}`] ?? args.adapter;
      plan.port = Number(args[`port-${side}`]);
      if (!plan.tree || !plan.db) usage(`--tree-${side} and --db-${side} are required with --tree-a/--tree-b.`);
      if (plan.adapter !== 'express' && plan.adapter !== 'fastify')
        usage('--adapter (or --adapter-a/--adapter-b): express or fastify.');
      if (!Number.isInteger(plan.port) || plan.port <= 0) usage(`--port-${side} is a port number.`);
    } else {
      plan.url = args[`url-${side}`];
      if (!plan.url) usage('Give --tree-a/--tree-b or --url-a/--url-b.');
    }
    return plan;
  });
  /** @type {Target[]} */
  const targets = [];
  const started = [];
  try {
    for (const plan of plans) {
      // Same length on both sides, so Content-Length stays comparable after N4.
      const token = `${runId}${plan.side}`;
      if (fromTrees) {
        const running = await startSample({ ...plan, tree: resolve(plan.tree) });
        started.push(running);
        targets.push({ label: plan.label, url: running.url, token, db: plan.db, state: {} });
      } else {
        console.log(`${plan.label}: ${plan.url}`);
        targets.push({ label: plan.label, url: plan.url, token, db: plan.db, state: {} });
      }
    }

    console.log(`\nRun ${runId}. Normalisations applied to both sides before comparing:`);
    for (const rule of RULES) console.log(`  ${rule}`);
    console.log('');

    const normalise = targets.map((t) => normaliser(t));
    let answers = 0;
    const different = [];
    for (const [title, step] of STEPS) {
      console.log(`# ${title}`);
      // One side, then the other: never both servers at once, and each sees the sequence in the same order.
      const results = [];
      for (const t of targets) results.push(await step(t));
      const [resultsA, resultsB] = results;
      for (let i = 0; i < Math.max(resultsA.length, resultsB.length); i++) {
        const [name, rawA] = resultsA[i];
        const rawB = resultsB[i][1];
        const a = normalise[0](rawA);
        const b = normalise[1](rawB);
        const differences = compare(name, a, b);
        answers++;
        console.log(`${differences.length ? '≠' : '='} ${name}: A ${rawA.statusLine} | B ${rawB.statusLine}`);
        for (const line of differences) console.log(line);
        if (differences.length) different.push(name);
        if (args.raw) {
          show('A raw', rawA);
          show('B raw', rawB);
        }
        if (args.show || args.raw) {
          show('A', a);
          show('B', b);
        }
      }
    }
    console.log(
      different.length
        ? `\n${different.length} of ${answers} answers differ: ${different.join(', ')}`
        : `\nAll ${answers} answers identical after normalisation.`,
    );
    return different.length ? 1 : 0;
  } finally {
    for (const running of started) await running.stop();
  }
}

main().then(
  (code) => process.exit(code),
  (error) => {
    console.error(error instanceof Error ? (error.stack ?? error.message) : String(error));
    process.exit(2);
  },
);
