// The module's migration as TypeORM runs it by default (every pending migration in one transaction, after
// runMigrationsWithLock's advisory lock), on the coordinator, for a new key table; then the distribution
// statements in the same transaction, and one by one after it.
import pg from 'pg';
import { createTableStatements } from '../../.citus-build/store/sql.js';
import { distributeIdempotencyTablesStatements } from '../../.citus-build/store/citus/citus.sql.js';

const name = process.argv[2] ?? 'mig_keys';
const client = new pg.Client(process.env.CITUS_URL ?? 'postgres://postgres@127.0.0.1:9700/postgres');
await client.connect();
const run = async (label, text, values) => {
  try {
    const r = await client.query(text, values);
    console.log(`ok    ${label}${r.rows?.length ? ` -> ${JSON.stringify(r.rows[0]).slice(0, 120)}` : ''}`);
    return true;
  } catch (e) {
    console.log(`ERROR ${label} -> ${e.code} ${e.message}`);
    return false;
  }
};
await run(`DROP TABLE IF EXISTS ${name} (clean start)`, `DROP TABLE IF EXISTS ${name} CASCADE`);
const distribute = distributeIdempotencyTablesStatements({ tableName: name, colocateWith: 'charges' });
console.log('-- A: migration and distribution in one transaction');
await run('BEGIN', 'BEGIN');
await run('the migration lock', 'SELECT pg_advisory_xact_lock(hashtextextended($1, 0))', [`nest-idempotency:migrate:${name}`]);
let ok = true;
for (const s of createTableStatements(name)) ok = (await run(s.split('\n')[0].slice(0, 90), s)) && ok;
for (const s of distribute) if (ok) ok = await run(s.split('\n')[0].slice(0, 90), s);
await run('COMMIT', 'COMMIT');
console.log('-- B: the migration in one transaction, then the distribution one statement at a time');
await run(`DROP TABLE IF EXISTS ${name}`, `DROP TABLE IF EXISTS ${name} CASCADE`);
await run('BEGIN', 'BEGIN');
await run('the migration lock', 'SELECT pg_advisory_xact_lock(hashtextextended($1, 0))', [`nest-idempotency:migrate:${name}`]);
for (const s of createTableStatements(name)) await run(s.split('\n')[0].slice(0, 90), s);
await run('COMMIT', 'COMMIT');
for (const s of distribute) await run(s.split('\n')[0].slice(0, 90), s);
console.log('-- C: the migration run again on the distributed table (as runMigrationsWithLock would, in a transaction)');
await run('BEGIN', 'BEGIN');
for (const s of createTableStatements(name)) await run(s.split('\n')[0].slice(0, 90), s);
await run('COMMIT', 'COMMIT');
await client.end();
