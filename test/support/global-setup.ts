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
  if (process.env.DATABASE_URL) return;
  const { startEmbeddedPostgres } = (await import(HELPER)) as typeof import('../../sample-app/embedded-postgres.js');
  const dataDir = await mkdtemp(join(tmpdir(), 'idempotency-test-pg-'));
  const db = await startEmbeddedPostgres({ dataDir, database: 'test', persistent: false, log: (l) => console.error(l) });
  globalThis.__EMBEDDED_DB__ = db;
  process.env.DATABASE_URL = db.url;
  console.log(`\nStarted embedded PostgreSQL for the tests: ${db.url.replace(/:[^:@/]+@/, ':***@')}`);
}
