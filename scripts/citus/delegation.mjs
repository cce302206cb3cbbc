// When Citus does not delegate a distributed function, and what then happens (an error, or a silent run on
// the coordinator, where the key's lock would be taken on the wrong node).
import { randomUUID } from 'node:crypto';
import { connect, send } from './request-path.mjs';
import { KeyStatements } from '../../.citus-build/store/postgres/statements.js';
import { citusKeyStatements } from '../../.citus-build/store/citus/citus.sql.js';

const statements = new KeyStatements('"idempotency_keys"', 'idempotency_keys', { preparedStatements: false, partitioned: false });
const citus = citusKeyStatements('"idempotency_keys"');
const request = (tenant) => ({ tenant, key: 'del-' + randomUUID(), fingerprint: 'fp', ownerToken: randomUUID(), leaseMs: 30000, ttlMs: 86400000 });
const charge = (tenant) => ({ text: 'INSERT INTO charges (tenant_id, amount) VALUES ($1, 1)', values: [tenant] });
const c = await connect('delegation');
await send(c, 'debug1 shows the planner\'s reason', [{ text: 'SET client_min_messages = debug1' }]);

const r1 = request('tenant-b');
await send(c, 'D1 a write of tenant-a (node 9701), then the request-transaction claim of tenant-b (node 9702)', [
  { text: 'START TRANSACTION' }, charge('tenant-a'), statements.claims.claim(r1, 'claim_in_transaction', 1000), { text: 'ROLLBACK' }]);
const r2 = request('tenant-b');
await send(c, 'D2 a write of tenant-c (9702, another shard), then the claim of tenant-b (9702)', [
  { text: 'START TRANSACTION' }, charge('tenant-c'), statements.claims.claim(r2, 'claim_in_transaction', 1000), { text: 'ROLLBACK' }]);
const r3 = request('tenant-b');
await send(c, 'D3 the claim of tenant-b, then the handler writes tenant-a (9701)', [
  { text: 'START TRANSACTION' }, statements.claims.claim(r3, 'claim_in_transaction', 1000), charge('tenant-a'), { text: 'ROLLBACK' }]);
const r4 = request('tenant-b');
await send(c, 'D4 the claim of tenant-b, then the handler writes tenant-c (same node, other shard)', [
  { text: 'START TRANSACTION' }, statements.claims.claim(r4, 'claim_in_transaction', 1000), charge('tenant-c'), { text: 'ROLLBACK' }]);
// A parameter expression ($1 || '') is folded into a constant before Citus decides; a volatile one is not.
await send(c, 'D5 hold_key_lock with a volatile argument (not a constant): not delegated, the guard raises', [
  { text: 'START TRANSACTION' }, { text: citus.holdKeyLock.replace('($1, $2)', '($1, $2 || gen_random_uuid()::text)'), values: ['tenant-b', 'k'] }, { text: 'ROLLBACK' }]);
const r6 = request('tenant-b');
const claim6 = statements.claims.claim(r6, 'claim', null);
await send(c, 'D6 the claim with a volatile argument: not delegated, not delegated, the guard raises', [
  { text: 'BEGIN' }, { ...claim6, text: claim6.text.replace('($1, $2,', '($1, $2 || left(gen_random_uuid()::text, 0),') }, { text: 'ROLLBACK' }]);
const r7 = request('tenant-b');
await send(c, 'D7 the handler writes tenant-a first (separate mode: the claim committed before), then the completion of tenant-b', [
  { text: 'START TRANSACTION' }, charge('tenant-a'), statements.claims.completion(r7, { status: 200, headers: [], body: null }, 1000, false), { text: 'ROLLBACK' }]);
await c.end();
