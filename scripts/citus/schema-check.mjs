// The start-up check's statements (src/store/schema-check.ts, sent as it sends them) on the coordinator, then the
// prototype's check of the Citus layout (citusLayoutProblems) on the full layout and on half-distributed ones.
import pg from 'pg';
import { keyStoreFunctionNames } from '../../.citus-build/store/key-function-names.js';
import { KEY_FUNCTIONS_VERSION } from '../../.citus-build/store/key-function-parts.sql.js';
import { citusLayoutProblems } from '../../.citus-build/store/citus/citus-layout-check.js';
import { keyStoreFunctions as functionsOf } from '../../.citus-build/store/key-store.sql.js';

const client = new pg.Client(process.env.CITUS_URL ?? 'postgres://postgres@127.0.0.1:9700/postgres');
await client.connect();
const query = async (text, values) => (await client.query(text, values)).rows;
const show = (title, value) => console.log(`-- ${title}\n   ${JSON.stringify(value)}`);

// As schema-check.ts sends them (INSPECT_SQL, layoutProblems, missingFunctions, staleClaimFunctions).
show('INSPECT_SQL (table found, columns)', (await query(`SELECT to_regclass($1) IS NOT NULL AS found,
  array_to_string(current_schemas(false), ', ') AS searched,
  ARRAY(SELECT attname::text FROM pg_attribute WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped) AS columns`, ['"idempotency_keys"']))[0]);
show('layoutProblems (relkind)', await query(`SELECT relkind = 'p' AS partitioned FROM pg_class WHERE oid = to_regclass($1)`, ['"idempotency_keys"']));
show('missingFunctions', await query('SELECT ARRAY(SELECT n FROM unnest($1::text[]) n WHERE to_regproc(n) IS NULL) AS missing', [keyStoreFunctionNames('idempotency_keys')]));
const [claim, , , claimInTransaction] = keyStoreFunctionNames('idempotency_keys');
show('staleClaimFunctions', await query('SELECT ARRAY(SELECT n FROM unnest($1::text[]) n JOIN pg_proc p ON p.oid = to_regproc(n) WHERE position($2 IN p.prosrc) = 0) AS stale', [[claim, claimInTransaction], KEY_FUNCTIONS_VERSION]));

const layout = { tableName: 'idempotency_keys', outboxTableName: 'outbox_messages', ledgerTableName: 'effect_ledger', colocateWith: 'charges' };
show('citusLayoutProblems, the layout as distributeIdempotencyTablesStatements leaves it', await citusLayoutProblems(query, layout));
const half = {
  'the outbox undistributed (undistribute_table)': ["SELECT undistribute_table('outbox_messages')"],
  'the claim function back to the single-server text (the plain migration run again)': [functionsOf('idempotency_keys')[0]],
  'a function not delegated (create_distributed_function without a distribution argument)': [
    "SELECT create_distributed_function('idempotency_keys_release(text, text, uuid)')"],
  'the ledger distributed by another column': ["SELECT undistribute_table('effect_ledger')", "SELECT create_distributed_table('effect_ledger', 'scope')"],
};
for (const [title, statements] of Object.entries(half)) {
  await client.query('BEGIN');
  for (const s of statements) await client.query(s);
  show(`citusLayoutProblems, ${title}`, await citusLayoutProblems(query, layout));
  await client.query('ROLLBACK');
}
await client.end();
