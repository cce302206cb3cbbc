import { describe, it } from '@jest/globals';
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { DataSource, type DataSourceOptions } from 'typeorm';
import { NOT_RUN_PREFIX } from './brokers.js';
import { displayUrl } from './broker-probe.js';

/**
 * The Citus cluster of the Citus suites (test/citus.e2e.spec.ts): its coordinator, with the citus extension and
 * its workers added. `../shared/citus/cluster.sh start` starts one on this kind of machine (and `.ci/run` does);
 * CITUS_URL names any other.
 */
export const CITUS_URL = process.env.CITUS_URL ?? 'postgres://postgres@127.0.0.1:9700/postgres';

/** CI sets it (`.ci/run` installs Citus and starts the cluster): then a missing cluster fails the run. */
function citusRequired(): boolean {
  const value = process.env.REQUIRE_CITUS?.trim().toLowerCase();
  return value !== undefined && value !== '' && value !== '0' && value !== 'false';
}

/** Why the cluster cannot be used, or undefined when it answers with Citus and at least one worker. */
async function citusMissing(): Promise<string | undefined> {
  const client = new pg.Client({ connectionString: CITUS_URL, connectionTimeoutMillis: 2_000 });
  try {
    await client.connect();
    const { rows } = await client.query<{ workers: number | null }>(
      `SELECT (SELECT count(*)::int FROM pg_dist_node WHERE noderole = 'primary' AND groupid <> 0) AS workers
        WHERE EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')`,
    );
    if (rows.length === 0) return 'it answered without the citus extension';
    if (!rows[0].workers) return 'it has no worker';
    return undefined;
  } catch {
    return 'it did not answer';
  } finally {
    await client.end().catch(() => undefined);
  }
}

/**
 * `describe(name, body)` for a suite that needs a Citus cluster. Where none answers at CITUS_URL, the suite is
 * one passing test titled `not run: ...`, which test/support/not-run-reporter.js counts as skipped and names at
 * the end of the run, as for a missing broker; with REQUIRE_CITUS set, one failing test. Awaited at the top of
 * the spec file (native ESM), since the probe is asynchronous.
 */
export async function describeWithCitus(name: string, body: () => void): Promise<void> {
  const missing = await citusMissing();
  if (missing === undefined) {
    describe(name, body);
    return;
  }
  const why = `needs Citus, which did not answer at ${displayUrl(CITUS_URL)} (${missing}; CITUS_URL; start one: ../shared/citus/cluster.sh start)`;
  describe(name, () => {
    it(citusRequired() ? why : `${NOT_RUN_PREFIX}${why}`, async () => {
      if (citusRequired()) throw new Error(`REQUIRE_CITUS is set: ${why}`);
      if ((await citusMissing()) === undefined)
        throw new Error('Citus answers now, but did not when the suite was collected: run it again.');
    });
  });
}

/** A schema of its own on the cluster's coordinator, (re)created empty (the DROP and CREATE reach the workers). */
export async function freshCitusSchema(name: string): Promise<string> {
  const schema = `t_${name.replace(/[^a-z0-9_]/gi, '_').toLowerCase()}`;
  const client = await citusClient();
  try {
    await client.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await client.query(`CREATE SCHEMA "${schema}"`);
  } finally {
    await client.end();
  }
  return schema;
}

/** A plain client on the coordinator, with `schema` first on its search_path. */
export async function citusClient(schema?: string): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: CITUS_URL, ...(schema ? { options: `-c search_path=${schema}` } : {}) });
  await client.connect();
  return client;
}

/** A data source on the coordinator, as an app on Citus would open it. */
export async function citusDataSource(schema: string, poolSize = 10): Promise<DataSource> {
  const dataSource = new DataSource({
    type: 'postgres',
    url: CITUS_URL,
    schema,
    extra: { options: `-c search_path=${schema}`, max: poolSize, connectionTimeoutMillis: 5_000 },
    logging: false,
  } as DataSourceOptions);
  await dataSource.initialize();
  return dataSource;
}

/** The directory of `cluster.sh`'s cluster (CITUS_CLUSTER_DIR, default its own), or undefined where there is none. */
export function citusClusterDir(): string | undefined {
  const cluster = process.env.CITUS_CLUSTER_DIR ?? join(process.env.TMPDIR ?? tmpdir(), 'citus-cluster');
  return existsSync(join(cluster, 'w1', 'postgresql.conf')) ? cluster : undefined;
}

/**
 * The data directory of the cluster's worker on `port`, where the test may stop and start it: CITUS_CLUSTER_DIR (a
 * directory of `cluster.sh`, default its own, `${TMPDIR:-/tmp}/citus-cluster`), subdirectories `w1` and `w2`.
 * Undefined where no such directory serves that port (a cluster this machine does not run).
 */
export function workerDataDir(port: number): string | undefined {
  const cluster = citusClusterDir();
  if (cluster === undefined) return undefined;
  for (const name of ['w1', 'w2']) {
    const conf = join(cluster, name, 'postgresql.conf');
    if (existsSync(conf) && new RegExp(`^port = ${port}\\b`, 'm').test(readFileSync(conf, 'utf8'))) return join(cluster, name);
  }
  return undefined;
}

/** Stops (as a crash: `-m immediate`) or starts the worker whose data directory is `dir`, as the postgres user. */
export function controlWorker(dir: string, action: 'crash' | 'start'): void {
  const pgCtl = '/usr/lib/postgresql/15/bin/pg_ctl';
  const args = action === 'crash' ? ['-D', dir, '-m', 'immediate', 'stop'] : ['-D', dir, '-l', `${dir}.log`, '-w', 'start'];
  const command = [pgCtl, ...args].map((arg) => `'${arg}'`).join(' ');
  if (process.getuid?.() === 0) execFileSync('su', ['postgres', '-c', command], { stdio: 'pipe' });
  else execFileSync(pgCtl, args, { stdio: 'pipe' });
}
