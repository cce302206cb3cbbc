// The partitioned table's retirement relies on an ACCESS EXCLUSIVE lock on the key table keeping out every
// claim, completion and renewal between its check and its DROP. On Citus those run on the workers (delegated):
// does the coordinator's LOCK TABLE reach them?
import { randomUUID } from 'node:crypto';
import { connect, send } from './request-path.mjs';

const a = await connect('retirement');
const b = await connect('a delegated claim meanwhile');
await send(a, 'BEGIN; LOCK TABLE pkeys IN ACCESS EXCLUSIVE MODE (on the coordinator)', [{ text: 'BEGIN' }, { text: 'LOCK TABLE pkeys IN ACCESS EXCLUSIVE MODE' }]);
const started = Date.now();
const claim = send(b, 'claim of tenant-b (delegated to 9702), lock_timeout 1s', [{ text: 'BEGIN' }, { text: "SET LOCAL citus.propagate_set_commands = 'local'" }, { text: "SET LOCAL lock_timeout = '1s'" },
  { text: 'SELECT state FROM pkeys_claim($1, $2, $3, $4::uuid, $5, $6, $7)', values: ['tenant-b', 'lock-' + Date.now(), 'fp', randomUUID(), 30000, 86400000, null] }, { text: 'ROLLBACK' }]);
await new Promise((resolve) => setTimeout(resolve, 1500));
await send(a, 'COMMIT', [{ text: 'COMMIT' }]);
await claim;
console.log(`      the claim answered after ${Date.now() - started} ms`);
await a.end(); await b.end();
