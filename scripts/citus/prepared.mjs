// preparedStatements: true: the claim as a named prepared statement, executed past PostgreSQL's five custom
// plans (a generic plan from then on): is it still delegated to the tenant's worker every time?
import { randomUUID } from 'node:crypto';
import { connect, send } from './request-path.mjs';
import { KeyStatements, BEGIN_READ_COMMITTED } from '../../.citus-build/store/postgres/statements.js';

const statements = new KeyStatements('"idempotency_keys"', 'idempotency_keys', { preparedStatements: true, partitioned: false });
const c = await connect('prepared');
for (let i = 1; i <= 8; i++) {
  const tenant = i % 2 ? 'tenant-a' : 'tenant-b';
  const r = { tenant, key: 'prep-' + randomUUID(), fingerprint: 'fp', ownerToken: randomUUID(), leaseMs: 30000, ttlMs: 86400000 };
  await send(c, `execution ${i} (${tenant}) of ${statements.claims.claim(r, 'claim', null).name}`, [{ text: BEGIN_READ_COMMITTED }, statements.claims.claim(r, 'claim', null), { text: 'COMMIT' }]);
}
await c.end();
