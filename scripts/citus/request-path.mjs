// Sends the store's request-path statements to CITUS_URL as the store sends them (pipelined, parameterised,
// texts from the module's own builders) and prints what each answered and which nodes the coordinator sent
// what to (citus.log_remote_commands). Usage: node scripts/citus/request-path.mjs [scenario ...]
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { KeyStatements, BEGIN_READ_COMMITTED, WORK_SAVEPOINT } from '../../.citus-build/store/postgres/statements.js';
import { pipelined } from '../../.citus-build/store/postgres/pipelined.js';

const url = process.env.CITUS_URL ?? 'postgres://postgres@127.0.0.1:9700/postgres';
const table = process.env.KEY_TABLE ?? 'idempotency_keys';
const statements = new KeyStatements(`"${table}"`, table, { preparedStatements: false, partitioned: process.env.PARTITIONED === '1' });
import { citusKeyStatements } from '../../.citus-build/store/citus/citus.sql.js';
const citus = process.env.CITUS_STATEMENTS === '1';
const sql = citus ? { ...statements.sql, ...citusKeyStatements(`"${table}"`) } : statements.sql;
if (citus) console.log('(the Citus statements: key writes through delegated functions)');

export async function connect(name, at = url) {
  const client = new pg.Client(at);
  client.notices = [];
  client.on('notice', (n) => {
    if (n.message.startsWith('issuing ')) {
      const node = /127\.0\.0\.1:(\d+)/.exec(n.detail ?? '')?.[1] ?? '?';
      client.notices.push(`${node}: ${n.message.slice(8).replace(/\s+/g, ' ')}`);
    } else client.notices.push(`NOTICE ${n.message}`);
  });
  await client.connect();
  await client.query('SET citus.log_remote_commands = on');
  client.label = name;
  return client;
}

/** The coordinator's remote commands, condensed: shard statements counted per node, BEGIN/COMMIT lines left out. */
function printRemote(notices) {
  const work = notices.filter((n) => !/^\d+: (BEGIN TRANSACTION|COMMIT|PREPARE TRANSACTION|COMMIT PREPARED)/.test(n));
  const shards = new Set(work.map((n) => /_(1\d{5})\b/.exec(n)?.[1]).filter(Boolean));
  const nodes = new Set(notices.map((n) => n.split(':')[0]).filter((n) => /^\d+$/.test(n)));
  const cut = (n) => n.slice(0, 150);
  if (shards.size > 2) console.log(`      remote: MULTI-SHARD, ${work.length} commands on ${shards.size} shards, nodes ${[...nodes].join(', ')}; first: ${cut(work[0])}`);
  else for (const n of work) console.log(`      remote ${cut(n)}`);
  const twoPc = notices.filter((n) => /PREPARE TRANSACTION/.test(n)).length;
  if (twoPc) console.log(`      remote: two-phase commit on ${twoPc} nodes`);
  if (notices.length === 0) console.log('      remote: (none: ran on the coordinator alone)');
}

/** One exchange, pipelined as the store sends it; prints each statement's answer and the remote commands. */
export async function send(client, title, list) {
  client.notices = [];
  const results = await pipelined(client, list);
  console.log(`-- [${client.label}] ${title}`);
  results.forEach((r, i) => {
    const head = list[i].text.replace(/\/\*[^*]*\*\//, '').replace(/\s+/g, ' ').trim().slice(0, 70);
    console.log(r.ok
      ? `   ok    ${head}${r.rows.length ? ` -> ${JSON.stringify(r.rows[0]).slice(0, 160)}` : r.rowCount != null ? ` (${r.rowCount} rows)` : ''}`
      : `   ERROR ${head} -> ${r.error.code} ${r.error.message}`);
  });
  printRemote(client.notices);
  return results;
}

const request = (tenant, key, extra = {}) => ({
  tenant, key, fingerprint: 'fp-' + key, ownerToken: randomUUID(), leaseMs: 30000, ttlMs: 86400000, ...extra,
});
const response = { status: 201, headers: [['content-type', 'application/json']], body: Buffer.from('{"ok":true}') };
const insertCharge = (tenant) => ({ text: 'INSERT INTO charges (tenant_id, amount) VALUES ($1, $2) RETURNING id', values: [tenant, 100] });

const scenarios = {
  // claim mode separate, a new key, then its replay, a 409, a 422 (claim-and-begin.ts, attempt.ts)
  async separate() {
    const c = await connect('separate');
    const r = request('tenant-a', 'sep-' + randomUUID());
    await send(c, 'claim and BEGIN (one round trip)', [
      { text: BEGIN_READ_COMMITTED }, statements.claims.claim(r, 'claim', null), { text: 'COMMIT' }, { text: 'START TRANSACTION' },
    ]);
    await send(c, 'the handler writes', [insertCharge(r.tenant)]);
    await send(c, 'completion and COMMIT (one round trip)', [statements.claims.completion(r, response, r.ttlMs, false), { text: 'COMMIT' }]);
    await send(c, 'replay', [
      { text: BEGIN_READ_COMMITTED }, statements.claims.claim({ ...r, ownerToken: randomUUID() }, 'claim', null), { text: 'COMMIT' }, { text: 'START TRANSACTION' },
    ]);
    await send(c, '(rollback of the empty transaction)', [{ text: 'ROLLBACK' }]);
    await send(c, 'mismatch', [
      { text: BEGIN_READ_COMMITTED }, statements.claims.claim({ ...r, fingerprint: 'other', ownerToken: randomUUID() }, 'claim', null), { text: 'COMMIT' },
    ]);
    const r2 = request('tenant-a', 'sep-' + randomUUID());
    await send(c, 'claim of another key (claim pool: claimAlone)', [{ text: BEGIN_READ_COMMITTED }, statements.claims.claim(r2, 'claim', null), { text: 'COMMIT' }]);
    await send(c, 'duplicate while in flight (409)', [{ text: BEGIN_READ_COMMITTED }, statements.claims.claim({ ...r2, ownerToken: randomUUID() }, 'claim', null), { text: 'COMMIT' }]);
    await c.end();
  },
  // claim mode request-transaction (claim-and-begin.ts): START TRANSACTION, claim_in_transaction, SAVEPOINT
  async requestTransaction() {
    const c = await connect('request-transaction');
    const r = request('tenant-b', 'rt-' + randomUUID());
    await send(c, 'START TRANSACTION, claim, SAVEPOINT', [
      { text: 'START TRANSACTION' }, statements.claims.claim(r, 'claim_in_transaction', 5000), { text: `SAVEPOINT ${WORK_SAVEPOINT}` },
    ]);
    await send(c, 'the handler writes', [insertCharge(r.tenant)]);
    await send(c, 'ROLLBACK TO SAVEPOINT (a failure that keeps the claim)', [{ text: `ROLLBACK TO SAVEPOINT ${WORK_SAVEPOINT}` }]);
    await send(c, 'the handler writes again', [insertCharge(r.tenant)]);
    await send(c, 'completion and COMMIT', [statements.claims.completion(r, response, r.ttlMs, true), { text: 'COMMIT' }]);
    await send(c, 'replay', [{ text: 'START TRANSACTION' }, statements.claims.claim({ ...r, ownerToken: randomUUID() }, 'claim_in_transaction', 5000), { text: `SAVEPOINT ${WORK_SAVEPOINT}` }]);
    await send(c, '(rollback)', [{ text: 'ROLLBACK' }]);
    const t = request('tenant-b', 'rt-' + randomUUID(), { leaseMs: 1 });
    await send(c, 'a separate claim whose lease lapses', [{ text: BEGIN_READ_COMMITTED }, statements.claims.claim(t, 'claim', null), { text: 'COMMIT' }]);
    await new Promise((resolve) => setTimeout(resolve, 20));
    const t2 = { ...t, ownerToken: randomUUID(), leaseMs: 30000 };
    await send(c, 'request-transaction takeover (claim_in_transaction calls claim on the worker)', [
      { text: 'START TRANSACTION' }, statements.claims.claim(t2, 'claim_in_transaction', 5000), { text: `SAVEPOINT ${WORK_SAVEPOINT}` }]);
    await send(c, 'its completion (complete_in_transaction completes its own in-flight row) and COMMIT', [
      insertCharge(t2.tenant), statements.claims.completion(t2, response, t2.ttlMs, true), { text: 'COMMIT' }]);
    await send(c, 'the key', [{ text: 'SELECT status, attempt, owner_token = $3::uuid AS mine FROM idempotency_keys WHERE tenant_id = $1 AND key = $2', values: [t2.tenant, t2.key, t2.ownerToken] }]);
    await c.end();
  },
  // the key's other statements (postgres-idempotency.store.ts): renewals, phases, releases, the board's release
  async keyWrites() {
    const c = await connect('key writes');
    const r = request('tenant-c', 'kw-' + randomUUID());
    await send(c, 'claim', [{ text: BEGIN_READ_COMMITTED }, statements.claims.claim(r, 'claim', null), { text: 'COMMIT' }]);
    const w = (text, values) => [{ text: BEGIN_READ_COMMITTED }, { text, values }, { text: 'COMMIT' }];
    await send(c, 'renewLease', w(sql.renewLease, [r.tenant, r.key, r.ownerToken, 30000]));
    await send(c, 'recordPhase (outside a transaction)', w(sql.recordPhase, [r.tenant, r.key, r.ownerToken, 'p1', '{}', 30000]));
    await send(c, 'complete (outside a transaction)', w(sql.complete, [r.tenant, r.key, r.ownerToken, 200, '[]', Buffer.from('x'), 1000]));
    await send(c, 'release', w(sql.release, [r.tenant, r.key, r.ownerToken]));
    await send(c, 'forget', w(sql.forget, [r.tenant, r.key, r.ownerToken]));
    await send(c, 'endLease (board)', w(sql.endLease, [r.tenant, r.ownerToken]));
    await send(c, 'holdKeyLock (REPEATABLE READ work)', [{ text: 'START TRANSACTION' }, { text: sql.holdKeyLock, values: [r.tenant, r.key] }, { text: 'ROLLBACK' }]);
    const r3 = request('tenant-c', 'kw-' + randomUUID());
    await send(c, 'claim, then a takeover after the lease (attempt 2)', [{ text: BEGIN_READ_COMMITTED }, statements.claims.claim({ ...r3, leaseMs: 1 }, 'claim', null), { text: 'COMMIT' }]);
    await new Promise((resolve) => setTimeout(resolve, 20));
    const r3b = { ...r3, ownerToken: randomUUID() };
    await send(c, 'takeover', [{ text: BEGIN_READ_COMMITTED }, statements.claims.claim(r3b, 'claim', null), { text: 'COMMIT' }]);
    await send(c, 'recordPhase of the takeover', w(sql.recordPhase, [r3b.tenant, r3b.key, r3b.ownerToken, 'p1', '{"p1":1}', 30000]));
    await send(c, 'the first owner completes: fenced (NI409)', [{ text: 'START TRANSACTION' }, statements.claims.completion(r3, response, r3.ttlMs, false), { text: 'COMMIT' }]);
    await send(c, 'release of the takeover (history kept: lease ended, new token)', w(sql.release, [r3b.tenant, r3b.key, r3b.ownerToken]));
    await send(c, 'the key after the release', [{ text: 'SELECT attempt, recovery_point, lease_expires_at <= now() AS lease_ended, owner_token = $3::uuid AS same_token FROM idempotency_keys WHERE tenant_id = $1 AND key = $2', values: [r3b.tenant, r3b.key, r3b.ownerToken] }]);
    await c.end();
  },
  // sweep.ts: the lock (literals, on its own connection), then batches on another
  async sweep() {
    const c = await connect('sweep lock');
    const lit = (v) => c.escapeLiteral(v);
    await send(c, 'sweep lock', [{ text: 'START TRANSACTION' },
      { text: `SELECT pg_try_advisory_xact_lock(hashtextextended(${lit('nest-idempotency:sweep:')} || coalesce(to_regclass(${lit(`"${table}"`)})::oid::text, ${lit(`"${table}"`)}), 0)) AS locked` }]);
    const d = await connect('sweep batches');
    await send(d, 'sweepBatch', [{ text: BEGIN_READ_COMMITTED }, { text: sql.sweepBatch, values: [1000, '-infinity'] }, { text: 'COMMIT' }]);
    // The same statement without FOR UPDATE SKIP LOCKED (a proposal for Citus): Citus plans the doomed CTE
    // (ORDER BY, LIMIT) first, on its own, then the DELETE against its result on every shard.
    const sweepCitus = sql.sweepBatch.replace(/\n\s*FOR UPDATE SKIP LOCKED/, '');
    await send(d, 'sweepBatch without SKIP LOCKED', [{ text: BEGIN_READ_COMMITTED }, { text: sweepCitus, values: [1000, '-infinity'] }, { text: 'COMMIT' }]);
    // A key row locked by a takeover in an open request transaction: the batch waits for it, unless a lock_timeout
    // reaches the workers (SET LOCAL is sent to them only with citus.propagate_set_commands = 'local').
    const holder = await connect('sweep: a takeover holds an expired row');
    const t = request('tenant-b', 'sw-' + randomUUID(), { leaseMs: 1, ttlMs: 1 });
    await send(holder, 'claim (lease and TTL 1 ms)', [{ text: BEGIN_READ_COMMITTED }, statements.claims.claim(t, 'claim', null), { text: 'COMMIT' }]);
    await new Promise((resolve) => setTimeout(resolve, 20));
    await send(holder, 'a transaction locks the expired row (as a takeover in request-transaction mode would)', [{ text: 'BEGIN' },
      { text: 'SELECT 1 FROM idempotency_keys WHERE tenant_id = $1 AND key = $2 FOR UPDATE', values: [t.tenant, t.key] }]);
    const started = Date.now();
    await send(d, 'sweepBatch without SKIP LOCKED, lock_timeout 200ms propagated', [{ text: BEGIN_READ_COMMITTED },
      { text: "SET LOCAL citus.propagate_set_commands = 'local'" }, { text: "SET LOCAL lock_timeout = '200ms'" },
      { text: sweepCitus, values: [100000, '-infinity'] }, { text: 'COMMIT' }]);
    console.log(`      took ${Date.now() - started} ms`);
    await send(holder, 'the lock holder ends', [{ text: 'ROLLBACK' }]);
    await holder.end();
    await send(d, 'countExpired (health)', [{ text: sql.countExpired, values: [1000] }]);
    await send(c, 'end of the sweep', [{ text: 'ROLLBACK' }]);
    await c.end(); await d.end();
  },
};

if (import.meta.url === `file://${process.argv[1]}`)
  for (const name of process.argv.slice(2).length ? process.argv.slice(2) : Object.keys(scenarios)) await scenarios[name]();
