// The key table in a schema of its own, named unqualified (tableName 'idempotency_keys', search_path set by the
// connection's options, as the test suites and schema-per-app setups do): which table does a delegated
// function's unqualified name reach on the worker?
import pg from 'pg';
import { randomUUID } from 'node:crypto';
import { createTableStatements } from '../../.citus-build/store/sql.js';
import { distributeIdempotencyTablesStatements } from '../../.citus-build/store/citus/citus.sql.js';
import { KeyStatements, BEGIN_READ_COMMITTED } from '../../.citus-build/store/postgres/statements.js';
import { pipelined } from '../../.citus-build/store/postgres/pipelined.js';

const base = process.env.CITUS_URL ?? 'postgres://postgres@127.0.0.1:9700/postgres';
const schema = 'sp_probe';
const admin = new pg.Client(base);
await admin.connect();
await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
await admin.query(`CREATE SCHEMA ${schema}`);
const client = new pg.Client({ connectionString: base, options: `-c search_path=${schema}` });
await client.connect();
await client.query(`CREATE TABLE charges (tenant_id text NOT NULL, id bigserial, amount integer, PRIMARY KEY (tenant_id, id))`);
await client.query(`SELECT create_distributed_table('charges', 'tenant_id')`);
for (const s of createTableStatements('idempotency_keys')) await client.query(s);
for (const s of distributeIdempotencyTablesStatements({ colocateWith: 'charges' })) await client.query(s);
const statements = new KeyStatements('"idempotency_keys"', 'idempotency_keys', { preparedStatements: false, partitioned: false });
const r = { tenant: 'tenant-b', key: 'sp-' + randomUUID(), fingerprint: 'fp', ownerToken: randomUUID(), leaseMs: 30000, ttlMs: 86400000 };
const results = await pipelined(client, [{ text: BEGIN_READ_COMMITTED }, statements.claims.claim(r, 'claim', null), { text: 'COMMIT' }]);
console.log('claim through a connection with search_path', schema, '->', results[1].ok ? results[1].rows[0].state : `${results[1].error.code} ${results[1].error.message}`);
const where = await admin.query(`SELECT (SELECT count(*) FROM ${schema}.idempotency_keys WHERE key = $1) AS in_schema,
  (SELECT count(*) FROM public.idempotency_keys WHERE key = $1) AS in_public`, [r.key]);
console.log('the claimed row is in', JSON.stringify(where.rows[0]));
await client.end();
await admin.end();
