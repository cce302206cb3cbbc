// maxHold ends a hung request-transaction attempt with pg_terminate_backend on its server process: on Citus that
// is the coordinator's backend, while the key's lock is held by the worker's backend of the same distributed
// transaction. How long does the worker's lock outlive the terminated coordinator backend?
import { randomUUID } from 'node:crypto';
import { connect, send } from './request-path.mjs';
import { KeyStatements } from '../../.citus-build/store/postgres/statements.js';

const statements = new KeyStatements('"idempotency_keys"', 'idempotency_keys', { preparedStatements: false, partitioned: false });
for (const [label, hang] of [['idle in transaction', null], ['inside SELECT pg_sleep(5) on the coordinator', 'SELECT pg_sleep(5)']]) {
  const a = await connect(`hung: ${label}`);
  const b = await connect('observer');
  const r = { tenant: 'tenant-b', key: 'term-' + randomUUID(), fingerprint: 'fp', ownerToken: randomUUID(), leaseMs: 30000, ttlMs: 86400000 };
  await send(a, 'START TRANSACTION, claim_in_transaction', [{ text: 'START TRANSACTION' }, statements.claims.claim(r, 'claim_in_transaction', 5000)]);
  const pid = a.processID;
  if (hang) a.query(hang).catch((e) => console.log(`      hung statement ended: ${e.code ?? ''} ${e.message}`));
  a.on('error', () => {});
  await new Promise((resolve) => setTimeout(resolve, 200));
  await send(b, `pg_terminate_backend(${pid}) on the coordinator`, [{ text: 'SELECT pg_terminate_backend($1::integer) AS terminated', values: [pid] }]);
  const started = Date.now();
  for (;;) {
    const [res] = await (b.quiet ? b.quiet : send)(b, 'advisory locks on 9702', [{ text: `SELECT result FROM run_command_on_workers($$SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'$$) WHERE nodeport = 9702` }]);
    if (res.rows[0].result === '0' || Date.now() - started > 8000) { console.log(`      the worker's key lock went after ${Date.now() - started} ms`); break; }
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
  await b.end();
}
