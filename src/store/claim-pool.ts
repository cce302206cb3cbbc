import { Inject, Injectable, type OnApplicationShutdown } from '@nestjs/common';
import type { DataSource, DataSourceOptions } from 'typeorm';
import { IDEMPOTENCY_CLAIM_DATA_SOURCE } from '../idempotency.constants.js';
import type { SourceDataSource } from './connection.js';
import { PoolDataSource } from './pool-data-source.js';
import { installRedactingLogger } from './redacting-logger.js';

/**
 * A second connection source on the same database with a small pool of its own,
 * for the module's short statements: claims, replays, 409 and 422 answers,
 * releases and lease renewals. They then never queue for a connection behind
 * business transactions (slow handlers holding the main pool), and a storm's
 * duplicates never queue in front of the owner's own transaction.
 *
 * On TypeORM it is a second data source, with the main one's connection
 * options (URL, credentials, `extra` such as `search_path`, SSL, replication)
 * and none of its entities, migrations or schema sync; on a plain pg pool (the
 * `pool` option), a second `pg.Pool` with that pool's connection options.
 *
 * @returns undefined when `size` is 0 (share the main pool), or when the main
 *   data source is not initialised yet (`manualInitialization`)
 */
export async function openClaimPool(main: SourceDataSource, size: number): Promise<SourceDataSource | undefined> {
  if (size === 0 || !main.isInitialized) return undefined;
  if (main instanceof PoolDataSource) return main.openSibling(size);
  return openTypeOrmClaimPool(main as DataSource, size);
}

async function openTypeOrmClaimPool(main: DataSource, size: number): Promise<DataSource> {
  // Loaded here, not at the top: an app on a plain pg pool has no typeorm.
  const { DataSource } = await import('typeorm');
  const options = main.options as DataSourceOptions & { extra?: Record<string, unknown>; poolSize?: number };
  const pool = new DataSource({
    ...options,
    poolSize: size,
    // allowExitOnIdle: its idle connections never keep a process alive (an app whose start-up failed, say).
    extra: { ...(options.extra ?? {}), max: size, allowExitOnIdle: true },
    entities: [],
    subscribers: [],
    migrations: [],
    synchronize: false,
    migrationsRun: false,
    dropSchema: false,
  } as DataSourceOptions);
  await pool.initialize();
  installRedactingLogger(pool);
  return pool;
}

/** Closes the claim pool with the app, after everything that uses it has stopped. */
@Injectable()
export class ClaimPoolLifecycle implements OnApplicationShutdown {
  constructor(@Inject(IDEMPOTENCY_CLAIM_DATA_SOURCE) private readonly pool: SourceDataSource | undefined) {}

  async onApplicationShutdown(): Promise<void> {
    if (this.pool?.isInitialized) await this.pool.destroy();
  }
}
