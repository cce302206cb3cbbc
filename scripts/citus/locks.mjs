// Where the key's advisory lock is taken on Citus, and whether the two claim modes still exclude each other.
// Needs the Citus layout (node scripts/citus/distribute.mjs | node scripts/citus/steps.mjs).
import { randomUUID } from 'node:crypto';
import { connect, send } from './request-path.mjs';
import { KeyStatements, BEGIN_READ_COMMITTED, WORK_SAVEPOINT } from '../../.citus-build/store/postgres/statements.js';
import { citusKeyStatements } from '../../.citus-build/store/citus/citus.sql.js';

const statements = new KeyStatements('"idempotency_keys"', 'idempotency_keys', { preparedStatements: false, partitioned: false });
const plainHold = statements.sql.holdKeyLock;
const citusHold = citusKeyStatements('"idempotency_keys"').holdKeyLock;
const request = (tenant, extra = {}) => ({ tenant, key: 'lock-' + randomUUID(), fingerprint: 'fp', ownerToken: randomUUID(), leaseMs: 30000, ttlMs: 86400000, ...extra });
const claimAlone = (r) => [{ text: BEGIN_READ_COMMITTED }, statements.claims.claim(r, 'claim', null), { text: 'COMMIT' }];
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const only = process.argv.slice(2);
const want = (name) => only.length === 0 || only.includes(name);

// A. The store's holdKeyLock as it is (pg_try_advisory_xact_lock sent to the coordinator) against the claim's
//    lock (taken inside the delegated claim function, on the worker): an attempt holding the key's lock
//    (REPEATABLE READ work, no lease renewals) is taken over by a claim on another connection.
for (const [label, hold] of [['plain holdKeyLock (coordinator)', plainHold], ['delegated hold_key_lock (worker)', citusHold]]) {
  if (!want('A')) break;
  const a = await connect(`A owner, ${label}`);
  const b = await connect('A duplicate');
  const r = request('tenant-b', { leaseMs: 50 });
  await send(a, 'claim (lease 50 ms), START TRANSACTION, hold the key lock', [...claimAlone(r), { text: 'START TRANSACTION ISOLATION LEVEL REPEATABLE READ' }, { text: hold, values: [r.tenant, r.key] }]);
  await sleep(100);
  await send(b, 'a retry after the lease: must answer in_flight while the owner holds the lock', claimAlone({ ...r, ownerToken: randomUUID() }));
  await send(a, 'owner ends', [{ text: 'ROLLBACK' }]);
  await a.end(); await b.end();
}

// B. request-transaction claim (lock on the worker, no row) against a separate claim and another
//    request-transaction claim of the same key, from other connections.
if (want('B')) {
  const a = await connect('B request-transaction owner');
  const b = await connect('B separate duplicate');
  const c = await connect('B request-transaction duplicate');
  const r = request('tenant-b');
  await send(a, 'START TRANSACTION, claim_in_transaction, SAVEPOINT', [{ text: 'START TRANSACTION' }, statements.claims.claim(r, 'claim_in_transaction', 5000), { text: `SAVEPOINT ${WORK_SAVEPOINT}` }]);
  await send(b, 'separate claim of the same key: in_flight (the worker holds the key lock)', claimAlone({ ...r, ownerToken: randomUUID() }));
  const started = Date.now();
  await send(c, 'request-transaction claim, wait 300 ms: in_flight after the wait', [{ text: 'START TRANSACTION' }, statements.claims.claim({ ...r, ownerToken: randomUUID() }, 'claim_in_transaction', 300), { text: 'ROLLBACK' }]);
  console.log(`      waited ${Date.now() - started} ms`);
  const locks = await connect('B pg_locks');
  await send(locks, 'advisory locks per node while the owner holds the key', [{ text: `SELECT (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory') AS coordinator,
      (SELECT array_agg(nodeport || ':' || result ORDER BY nodeport) FROM run_command_on_workers($$SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'$$)) AS workers` }]);
  await send(a, 'owner completes and commits', [statements.claims.completion(r, { status: 200, headers: [], body: Buffer.from('ok') }, r.ttlMs, true), { text: 'COMMIT' }]);
  await send(b, 'separate claim again: the stored response', claimAlone({ ...r, ownerToken: randomUUID() }));
  for (const x of [a, b, c, locks]) await x.end();
}

// C. Query from any node: an app connected to worker 9701 claims a key of tenant-b (shard on 9702) while a
//    request-transaction attempt that came through the coordinator holds it.
if (want('C')) {
  const a = await connect('C owner via the coordinator');
  const w = await connect('C duplicate via worker 9701', 'postgres://postgres@127.0.0.1:9701/postgres');
  const r = request('tenant-b');
  await send(a, 'START TRANSACTION, claim_in_transaction', [{ text: 'START TRANSACTION' }, statements.claims.claim(r, 'claim_in_transaction', 5000)]);
  await send(w, 'separate claim through worker 9701: delegated to 9702, in_flight', claimAlone({ ...r, ownerToken: randomUUID() }));
  await send(a, 'owner rolls back', [{ text: 'ROLLBACK' }]);
  await send(w, 'separate claim through worker 9701 again: claimed', claimAlone({ ...r, ownerToken: randomUUID() }));
  await a.end(); await w.end();
}
