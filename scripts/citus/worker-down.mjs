// A worker stopped (immediate: as a crash) mid-request and before one: what the coordinator answers, with which
// SQLSTATE, and whether the module's isUnavailableError (503) recognises it. Restarts the worker at the end.
import { execSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { connect, send } from './request-path.mjs';
import { KeyStatements, BEGIN_READ_COMMITTED } from '../../.citus-build/store/postgres/statements.js';

const dir = process.env.CITUS_DIR ?? '/tmp/citus-cluster';
const pgctl = (args) => execSync(`su postgres -c "/usr/lib/postgresql/15/bin/pg_ctl -D ${dir}/w2 ${args}"`, { stdio: 'pipe' }).toString().trim();
// The module's rule (src/store/postgres/unavailable.ts), inlined: SQLSTATE classes 08, 57P0x, 53xxx and the driver's errnos.
const unavailable = (code) => ['57P01', '57P02', '57P03', '53300', '53100', '08000', '08001', '08003', '08004', '08006', '08007'].includes(code);
const statements = new KeyStatements('"idempotency_keys"', 'idempotency_keys', { preparedStatements: false, partitioned: false });
const request = (tenant) => ({ tenant, key: 'down-' + randomUUID(), fingerprint: 'fp', ownerToken: randomUUID(), leaseMs: 30000, ttlMs: 86400000 });
const report = (results) => results.filter((r) => !r.ok).forEach((r) => console.log(`      -> SQLSTATE ${r.error.code}: the module's isUnavailableError would say ${unavailable(r.error.code)} (${unavailable(r.error.code) ? '503' : '500'})`));

const a = await connect('mid-request');
const r = request('tenant-b');
await send(a, 'tenant-b (9702): request-transaction claim and the handler\'s insert', [
  { text: 'START TRANSACTION' }, statements.claims.claim(r, 'claim_in_transaction', 5000), { text: 'INSERT INTO charges (tenant_id, amount) VALUES ($1, 1)', values: [r.tenant] }]);
console.log(`   (worker 9702 stopped: ${pgctl('-m immediate stop')})`);
report(await send(a, 'completion and COMMIT while 9702 is down', [statements.claims.completion(r, { status: 200, headers: [], body: null }, r.ttlMs, true), { text: 'COMMIT' }]));
const b = await connect('while down');
report(await send(b, 'a claim of tenant-b (9702 down)', [{ text: BEGIN_READ_COMMITTED }, statements.claims.claim(request('tenant-b'), 'claim', null), { text: 'COMMIT' }]));
report(await send(b, 'a claim of tenant-a (9701 up)', [{ text: BEGIN_READ_COMMITTED }, statements.claims.claim(request('tenant-a'), 'claim', null), { text: 'COMMIT' }]));
console.log(`   (worker 9702 started: ${pgctl(`-l ${dir}/w2.log -w start`).split('\n').pop()})`);
report(await send(b, 'the same connection, a claim of tenant-b after the restart', [{ text: BEGIN_READ_COMMITTED }, statements.claims.claim(request('tenant-b'), 'claim', null), { text: 'COMMIT' }]));
report(await send(b, 'the key of the request that was mid-flight', [{ text: 'SELECT count(*) AS rows FROM idempotency_keys WHERE tenant_id = $1 AND key = $2', values: [r.tenant, r.key] }]));
await a.end().catch(() => {}); await b.end();
