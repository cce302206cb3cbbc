// Prints the module's DDL exactly as its migrations send it (one statement per block, ended by a line ";;").
// Usage: node scripts/citus/ddl.mjs keys|outbox|ledger|partitioned [tableName]
import { createTableStatements, createOutboxStatements } from '../../.citus-build/store/sql.js';
import { createEffectLedgerStatements } from '../../.citus-build/ledger/effect-ledger.sql.js';
import { createPartitionedTableStatements, DEFAULT_PARTITION_LAYOUT } from '../../.citus-build/store/partitioned/partitioned-key-table.sql.js';

const [what, name] = process.argv.slice(2);
const statements = {
  keys: () => createTableStatements(name ?? 'idempotency_keys'),
  outbox: () => createOutboxStatements(name ?? 'outbox_messages'),
  ledger: () => createEffectLedgerStatements(name ?? 'effect_ledger'),
  partitioned: () => createPartitionedTableStatements(name ?? 'idempotency_keys', { ...DEFAULT_PARTITION_LAYOUT, partman: false }),
}[what]();
for (const s of statements) process.stdout.write(`${s}\n;;\n`);
