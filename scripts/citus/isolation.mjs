// request-transaction mode under REPEATABLE READ on Citus: a duplicate waits for the key's lock on the worker,
// then its write meets the row its snapshot misses; the store needs SQLSTATE 40001 to start again.
import { randomUUID } from 'node:crypto';
import { connect, send } from './request-path.mjs';
import { KeyStatements } from '../../.citus-build/store/postgres/statements.js';

const statements = new KeyStatements('"idempotency_keys"', 'idempotency_keys', { preparedStatements: false, partitioned: false });
const r = { tenant: 'tenant-b', key: 'rr-' + randomUUID(), fingerprint: 'fp', ownerToken: randomUUID(), leaseMs: 30000, ttlMs: 86400000 };
const a = await connect('RR owner');
const b = await connect('RR duplicate');
await send(a, 'owner: START TRANSACTION REPEATABLE READ, claim_in_transaction (writes the in-flight row at RR)', [
  { text: 'START TRANSACTION ISOLATION LEVEL REPEATABLE READ' }, statements.claims.claim(r, 'claim_in_transaction', 5000)]);
const waiting = send(b, 'duplicate: START TRANSACTION REPEATABLE READ, claim_in_transaction (waits for the key lock)', [
  { text: 'START TRANSACTION ISOLATION LEVEL REPEATABLE READ' }, statements.claims.claim({ ...r, ownerToken: randomUUID() }, 'claim_in_transaction', 5000), { text: 'ROLLBACK' }]);
await new Promise((resolve) => setTimeout(resolve, 300));
await send(a, 'owner completes and commits', [statements.claims.completion(r, { status: 200, headers: [], body: Buffer.from('x') }, r.ttlMs, true), { text: 'COMMIT' }]);
await waiting;
await send(b, 'the store starts again: a new RR transaction reads the stored response', [
  { text: 'START TRANSACTION ISOLATION LEVEL REPEATABLE READ' }, statements.claims.claim({ ...r, ownerToken: randomUUID() }, 'claim_in_transaction', 5000), { text: 'ROLLBACK' }]);
await a.end(); await b.end();
