// The outbox's, the ledger's, the board's and the start-up check's statements against CITUS_URL, with texts taken
// from the module's own code where it builds them (OutboxStore, BoardQueries and the ledger's SQL), sent as
// TypeORM sends them (unnamed, parameterised). Prints each answer and the remote commands.
import { randomUUID } from 'node:crypto';
import { connect, send } from './request-path.mjs';
import { OutboxStore } from '../../.citus-build/outbox/outbox.store.js';
import { BoardQueries } from '../../.citus-build/board/board.queries.js';
import { recordEffectSql, findEffectSql } from '../../.citus-build/ledger/effect-ledger.sql.js';

/** Records the SQL a module class sends through a fake TypeORM data source, then sends it for real. */
function capturing() {
  const sent = [];
  const runner = { query: async (text, values) => { sent.push({ text, values }); return { records: [], affected: 0 }; }, release: async () => {} };
  const manager = { query: async (text, values) => { sent.push({ text, values }); return [{ id: '0' }]; }, queryRunner: runner };
  const dataSource = {
    createQueryRunner: () => runner, manager, logger: {}, options: {},
    transaction: async (fn) => fn(manager),
  };
  return { sent, dataSource, manager };
}

const only = process.argv.slice(2);
const want = (name) => only.length === 0 || only.includes(name);

if (want('outbox')) {
  const cap = capturing();
  const outbox = new OutboxStore(cap.dataSource, 'outbox_messages');
  await outbox.enqueue(cap.manager, { tenant: 'tenant-a', topic: 'charge.created', payload: { id: 1 } });
  await outbox.claim(10, 30000, randomUUID(), 5);
  await outbox.renewLocks(['1', '2'], randomUUID(), 30000);
  await outbox.markDelivered('1', randomUUID());
  await outbox.markFailed('1', randomUUID(), 'boom', 1000);
  await outbox.markFailed('1', randomUUID(), 'boom', null);
  await outbox.markExhausted('1', randomUUID(), 'spent');
  await outbox.redrive(undefined, undefined);
  await outbox.redrive(['1'], 'tenant-a');
  await outbox.countDead(100);
  const c = await connect('outbox');
  await send(c, 'enqueue in the business transaction', [{ text: 'START TRANSACTION' },
    { text: 'INSERT INTO charges (tenant_id, amount) VALUES ($1, $2) RETURNING id', values: ['tenant-a', 5] }, cap.sent[0], { text: 'COMMIT' }]);
  const names = ['claim (relay)', 'renewLocks', 'markDelivered', 'markFailed (retry)', 'markFailed (dead)', 'markExhausted', 'redrive (all)', 'redrive (ids, tenant)', 'countDead'];
  for (const [i, name] of names.entries()) await send(c, name, [cap.sent[i + 1]]);
  await c.end();
}

if (want('ledger')) {
  const c = await connect('ledger');
  const key = 'refund:' + randomUUID();
  await send(c, 'once() in the business transaction, then has()', [{ text: 'START TRANSACTION' },
    { text: 'INSERT INTO charges (tenant_id, amount) VALUES ($1, $2) RETURNING id', values: ['tenant-a', 5] },
    { text: recordEffectSql('effect_ledger'), values: ['tenant-a', 'refunds', key, randomUUID()] },
    { text: findEffectSql('effect_ledger'), values: ['tenant-a', 'refunds', key] }, { text: 'COMMIT' }]);
  await send(c, 'once() again (false: recorded)', [{ text: 'START TRANSACTION' },
    { text: recordEffectSql('effect_ledger'), values: ['tenant-a', 'refunds', key, randomUUID()] }, { text: 'COMMIT' }]);
  await c.end();
}

if (want('board')) {
  const cap = capturing();
  const board = new BoardQueries(cap.dataSource, 'idempotency_keys', 'outbox_messages');
  await board.keyCounts(null, 20).catch(() => {});
  await board.keyCounts('tenant-a', 20).catch(() => {});
  await board.stuckKeys(null, 20).catch(() => {});
  await board.stuckKeys('tenant-a', 20).catch(() => {});
  await board.lookup('tenant-a', 'k', true).catch(() => {});
  await board.outboxCounts(null).catch(() => {});
  await board.deadLetters(null, 20).catch(() => {});
  const c = await connect('board');
  const names = ['keyCounts (all tenants)', 'keyCounts (one tenant)', 'stuckKeys (all)', 'stuckKeys (one tenant)', 'lookup', 'outboxCounts (all)', 'deadLetters (all)'];
  // Each read is SET LOCAL statement_timeout, then the query, in one transaction.
  for (let i = 0; i < cap.sent.length; i += 2) await send(c, names[i / 2], [{ text: 'BEGIN' }, cap.sent[i], cap.sent[i + 1], { text: 'COMMIT' }]);
  await c.end();
}

// The relay on Citus (a proposal): find the tenants with due messages (a multi-shard read without locks), then
// claim per tenant with the store's own statement plus `tenant_id = $5` (a router query, where Citus allows FOR
// UPDATE SKIP LOCKED), and settle with the tenant in the WHERE clause (router, no two-phase commit).
if (only.includes('outbox-citus')) {
  const cap = capturing();
  const outbox = new OutboxStore(cap.dataSource, 'outbox_messages');
  await outbox.claim(10, 30000, randomUUID(), 5);
  const claimSql = cap.sent[0].text
    .replace('ORDER BY available_at, id', 'AND tenant_id = $5\n          ORDER BY available_at, id')
    .replace('WHERE m.id = due.id', 'WHERE m.id = due.id AND m.tenant_id = $5');
  const c = await connect('outbox on Citus');
  await send(c, 'enqueue three messages per tenant', [{ text: `INSERT INTO outbox_messages (tenant_id, topic, payload)
    SELECT 'tenant-' || (ARRAY['a','b','c'])[1 + i % 3], 'charge.created', '{}' FROM generate_series(1, 9) i` }]);
  const [due] = await send(c, 'tenants with due messages (no lock)', [{ text: `/* nest-idempotency:outbox-due-tenants */
    SELECT DISTINCT tenant_id FROM outbox_messages
     WHERE status = 'pending' AND available_at <= now() AND (locked_until IS NULL OR locked_until <= now()) LIMIT $1`, values: [100] }]);
  const token = randomUUID();
  const d = await connect('a second relay');
  const [, held] = await send(c, 'relay 1 claims tenant-b in an open transaction (to show SKIP LOCKED)', [{ text: 'BEGIN' }, { text: claimSql, values: [2, token, 30000, 5, 'tenant-b'] }]);
  await send(d, 'relay 2 claims tenant-b meanwhile: skips the locked rows', [{ text: claimSql, values: [10, randomUUID(), 30000, 5, 'tenant-b'] }]);
  await send(c, 'relay 1 commits', [{ text: 'COMMIT' }]);
  for (const { tenant_id: tenant } of due.rows ?? []) {
    await send(c, `claim of ${tenant}`, [{ text: claimSql, values: [10, token, 30000, 5, tenant] }]);
  }
  await send(c, 'markDelivered with the tenant (router)', [{ text: `UPDATE outbox_messages SET status = 'delivered', delivered_at = now(), locked_until = NULL, last_error = NULL
      WHERE id = $1 AND lock_token = $2 AND status = 'pending' AND tenant_id = $3`, values: [held.rows?.[0]?.id ?? '0', token, 'tenant-b'] }]);
  await c.end(); await d.end();
}
