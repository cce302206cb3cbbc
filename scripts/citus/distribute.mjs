// Prints what a user would run on the coordinator (distributeIdempotencyTablesStatements), blocks ended by ";;".
// Usage: node scripts/citus/distribute.mjs [colocateWith] [--outbox] [--ledger]
import { distributeIdempotencyTablesStatements } from '../../.citus-build/store/citus/citus.sql.js';

const args = process.argv.slice(2);
const colocateWith = args.find((a) => !a.startsWith('--')) ?? 'charges';
for (const s of distributeIdempotencyTablesStatements({
  colocateWith,
  outboxTableName: args.includes('--outbox') ? 'outbox_messages' : undefined,
  ledgerTableName: args.includes('--ledger') ? 'effect_ledger' : undefined,
})) process.stdout.write(`${s}\n;;\n`);
