import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { EmbeddedDatabase } from '../../sample-app/embedded-postgres.js';

// Jest loads global setup through require() without its module mapper, so
// the helpers are named without the `.js` that ESM source needs.
const HELPER = '../../sample-app/embedded-postgres';
const BROKER_PROBE = './broker-probe';

declare global {
  var __EMBEDDED_DB__: EmbeddedDatabase | undefined;
}

/**
 * Probes the message brokers once, for the suites that need one; then uses
 * DATABASE_URL when set (CI, a developer's server), or starts a real embedded
 * PostgreSQL for this run. Workers inherit both findings through the
 * environment.
 */
export default async function globalSetup(): Promise<void> {
  await probeBrokers();
  if (process.env.DATABASE_URL) return;
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
