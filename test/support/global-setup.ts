import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { EmbeddedDatabase } from '../../sample-app/embedded-postgres.js';

// Jest loads global setup through require() without its module mapper, so
// the helpers are named without the `.js` that ESM source needs.
const HELPER = '../../sample-app/embedded-postgres';
const BROKER_PROBE = './broker-probe';
const PRISMA_GENERATE = './prisma-generate';

declare global {
  var __EMBEDDED_DB__: EmbeddedDatabase | undefined;
}

/**
 * Probes the message brokers once, for the suites that need one; generates
 * the tests' Prisma client (see prisma-generate.ts); then uses
 * DATABASE_URL when set (CI, a developer's server), or starts a real embedded
 * PostgreSQL for this run. Workers inherit both findings through the
 * environment.
 */
export default async function globalSetup(_globalConfig?: unknown, projectConfig?: { rootDir: string }): Promise<void> {
  await probeBrokers();
  // The Prisma client of test/prisma-pool.e2e.spec.ts, generated before the workers start (the reliability
  // setup, which runs no Prisma spec, calls this without Jest's configs).
  if (projectConfig) {
    const prisma = (await import(PRISMA_GENERATE)) as typeof import('./prisma-generate.js');
    prisma.generatePrismaClient(projectConfig.rootDir);
  }
  if (process.env.DATABASE_URL) return installPartman(process.env.DATABASE_URL);
  const { startEmbeddedPostgres } = (await import(HELPER)) as typeof import('../../sample-app/embedded-postgres.js');
  const dataDir = await mkdtemp(join(tmpdir(), 'idempotency-test-pg-'));
  const db = await startEmbeddedPostgres({ dataDir, database: 'test', persistent: false, log: (l) => console.error(l) });
  globalThis.__EMBEDDED_DB__ = db;
  process.env.DATABASE_URL = db.url;
  console.log(`\nStarted embedded PostgreSQL for the tests: ${db.url.replace(/:[^:@/]+@/, ':***@')}`);
}

/**
 * A broker that does not answer means its suites are not run (and named at
 * the end of the run), unless REQUIRE_BROKERS is set, as in CI: then the
 * run fails here, before any test, rather than pass without them.
 */
async function probeBrokers(): Promise<void> {
  const probe = (await import(BROKER_PROBE)) as typeof import('./broker-probe.js');
  const names = Object.keys(probe.BROKERS) as Array<keyof typeof probe.BROKERS>;
  const reachable = Object.fromEntries(await Promise.all(names.map(async (name) => [name, await probe.probeBroker(name)])));
  process.env[probe.REACHABLE_BROKERS_VARIABLE] = JSON.stringify(reachable);
  const missing = names.filter((name) => !reachable[name]).map((name) => probe.BROKERS[name]);
  if (missing.length === 0) return;
  const list = missing.map((b) => `${b.title} at ${probe.displayUrl(b.url)} (${b.variable}; start one: ${b.start})`);
  if (probe.brokersRequired()) {
    throw new Error(
      `REQUIRE_BROKERS is set, and these brokers did not answer:\n  ${list.join('\n  ')}\n` +
        'Start them, or unset REQUIRE_BROKERS to run without the suites that need them.',
    );
  }
  console.log(`\nNo answer from ${list.join('; ')}: the suites that need it will not run (listed at the end).`);
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
