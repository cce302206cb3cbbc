import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { EmbeddedDatabase } from '../../sample-app/embedded-postgres.js';

// Jest loads global setup through require() without its module mapper, so
// the helper is named without the `.js` that ESM source needs.
const HELPER = '../../sample-app/embedded-postgres';

declare global {
  var __EMBEDDED_DB__: EmbeddedDatabase | undefined;
}

/**
 * Uses DATABASE_URL when set (CI, a developer's server); otherwise starts a
 * real embedded PostgreSQL for this run. Workers inherit the URL through the
 * environment.
 */
export default async function globalSetup(): Promise<void> {
  if (process.env.DATABASE_URL) return installPartman(process.env.DATABASE_URL);
  const { startEmbeddedPostgres } = (await import(HELPER)) as typeof import('../../sample-app/embedded-postgres.js');
  const dataDir = await mkdtemp(join(tmpdir(), 'idempotency-test-pg-'));
  const db = await startEmbeddedPostgres({ dataDir, database: 'test', persistent: false, log: (l) => console.error(l) });
  globalThis.__EMBEDDED_DB__ = db;
  process.env.DATABASE_URL = db.url;
  console.log(`\nStarted embedded PostgreSQL for the tests: ${db.url.replace(/:[^:@/]+@/, ':***@')}`);
}

/**
 * Where the server has pg_partman (Debian's postgresql-15-partman, which .ci/run
 * installs), the partitioned key table's specs use it: the extension is created
 * here, once, before the workers start. The embedded server has none, and the
 * module then makes the partitions itself.
 */
async function installPartman(url: string): Promise<void> {
  const { default: pg } = await import('pg');
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const { rows } = await client.query(`SELECT 1 FROM pg_available_extensions WHERE name = 'pg_partman'`);
    if (rows.length > 0) {
      await client.query('CREATE SCHEMA IF NOT EXISTS partman');
      await client.query('CREATE EXTENSION IF NOT EXISTS pg_partman SCHEMA partman');
    }
  } finally {
    await client.end();
  }
}
