import { AppProcess } from './app-process.js';
import type { AdapterName, BenchConfig } from './config.js';
import { BackendCpu, connect, resetSchema, serverVersion, truncateAll, WalCounter } from './database.js';
import { measureVariants, type VariantResult } from './http-scenarios.js';
import { APP_APPLICATION_NAME } from './protocol.js';

/**
 * Scenario 13's variants. The embedded server runs with `fsync=off`, where a
 * commit costs no flush and the claim's own commit (the module commits the
 * claim before the business transaction opens) cannot show; on a server with
 * durable commits it can. `floor` against `floorAsyncClaim` is that commit's
 * price: the same protocol with the claim's commit waiting for its flush (the
 * module's: a claim the handler used must survive a crash of the server), and
 * asynchronous (an earlier version's choice).
 */
export const DURABLE_VARIANTS = ['bare', 'module', 'floor', 'floorAsyncClaim', 'requestTransaction'] as const;
export type DurableVariantName = (typeof DURABLE_VARIANTS)[number];

export interface DurableAdapterResults {
  adapter: AdapterName;
  poolMax: number;
  variants: Record<DurableVariantName, VariantResult>;
}

export interface DurableResults {
  /** What makes the commits durable or not, as the server reports it. */
  database: { version: string; fsync: string; synchronousCommit: string; walSyncMethod: string };
  adapters: Partial<Record<AdapterName, DurableAdapterResults>>;
}

/**
 * Scenario 13: new keys against `config.durableDatabaseUrl`, a server with
 * durable commits (the bench drops and recreates its schema there, so give
 * it a database of its own), on each adapter, with the WAL each request
 * wrote and flushed.
 */
export async function runDurableCommits(config: BenchConfig, url: string, log: (line: string) => void): Promise<DurableResults> {
  await resetSchema(url, config.schema);
  const db = await connect(url, config.schema);
  try {
    const setting = async (name: string) => String((await db.query(`SHOW ${name}`)).rows[0][name]);
    const database = {
      version: await serverVersion(db),
      fsync: await setting('fsync'),
      synchronousCommit: await setting('synchronous_commit'),
      walSyncMethod: await setting('wal_sync_method'),
    };
    log(
      `PostgreSQL ${database.version}, fsync ${database.fsync}, synchronous_commit ${database.synchronousCommit}, ` +
        `wal_sync_method ${database.walSyncMethod}, schema "${config.schema}"`,
    );
    if (database.fsync !== 'on' || database.synchronousCommit === 'off') {
      log('  commits on this server are not durable: the claim commit will not show.');
    }
    const adapters: DurableResults['adapters'] = {};
    for (const adapter of config.adapters) {
      await truncateAll(db);
      const app = await AppProcess.start({ adapter, databaseUrl: url, schema: config.schema, poolSize: config.poolSize });
      try {
        const cpu = new BackendCpu(db, APP_APPLICATION_NAME);
        const variants = await measureVariants(app, DURABLE_VARIANTS, config, { cpu, wal: new WalCounter(db) }, log);
        adapters[adapter] = { adapter, poolMax: app.poolMax, variants };
      } finally {
        await app.close();
      }
    }
    return { database, adapters };
  } finally {
    await db.end();
  }
}
