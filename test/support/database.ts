import pg from 'pg';
import { DataSource, type DataSourceOptions, type LoggerOptions, type Logger as TypeOrmLogger } from 'typeorm';
import { createOutboxStatements, createTableStatements } from '../../src/store/sql.js';
import {
  createPartitionedTableStatements,
  DEFAULT_PARTITION_LAYOUT,
} from '../../src/store/partitioned/partitioned-key-table.sql.js';
import { keyTableKind } from './key-table.js';
import { distributeIdempotencyTablesStatements } from '../../src/store/citus/citus.sql.js';

/**
 * With CITUS_TEST=1 and DATABASE_URL naming a Citus coordinator, `createTables` distributes what it creates: the
 * test's effect table by its tenant (its primary key then has to contain it), and the module's tables with
 * `distributeIdempotencyTablesStatements`, co-located with it. It runs the shared specs on a cluster by hand
 * (docs/citus-findings.md, "Running the existing specs on the cluster"); test/citus.e2e.spec.ts is the Citus suite
 * `npm test` runs.
 */
const citusTest = process.env.CITUS_TEST === '1';

export function databaseUrl(): string {
  const url = process.env.DATABASE_URL;
  if (!url) throw new Error('DATABASE_URL is not set: run the tests through jest, whose global setup provides one.');
  return url;
}

/**
 * Gives a spec file a schema of its own, so spec files can run in parallel
 * against one database. Returns its name after (re)creating it empty.
 */
export async function freshSchema(name: string): Promise<string> {
  const suffix = keyTableKind() === 'partitioned' ? '_partitioned' : '';
  const schema = `t_${name.replace(/[^a-z0-9_]/gi, '_').toLowerCase()}${suffix}`;
  const client = new pg.Client({ connectionString: databaseUrl() });
  await client.connect();
  try {
    await forgetPartman(client, schema);
    await client.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await client.query(`CREATE SCHEMA "${schema}"`);
  } finally {
    await client.end();
  }
  return schema;
}

/** Drops pg_partman's records of the schema's tables, where pg_partman is installed. */
async function forgetPartman(client: pg.Client, schema: string): Promise<void> {
  const { rows } = await client.query<{ partman: string | null }>(
    `SELECT extnamespace::regnamespace::text AS partman FROM pg_extension WHERE extname = 'pg_partman'`,
  );
  if (rows[0]?.partman) {
    await client.query(`DELETE FROM ${rows[0].partman}.part_config WHERE split_part(parent_table, '.', 1) = $1`, [schema]);
  }
}

/** Counts the SQL statements a data source sends (the round trips of a path). */
export class QueryCounter implements TypeOrmLogger {
  queries: string[] = [];
  /**
   * The same statements grouped by round trip: a pipeline's statements are all logged in one turn of the event loop,
   * before it is sent, while the next round trip starts only after an answer came back over the socket (a later
   * turn). Meaningful while one request at a time runs.
   */
  roundTrips: string[][] = [];
  private turnOpen = false;
  logQuery(query: string): void {
    const text = query.replace(/\s+/g, ' ').trim();
    this.queries.push(text);
    if (!this.turnOpen) {
      this.turnOpen = true;
      this.roundTrips.push([]);
      setImmediate(() => (this.turnOpen = false));
    }
    this.roundTrips[this.roundTrips.length - 1].push(text);
  }
  logQueryError(): void {}
  logQuerySlow(): void {}
  logSchemaBuild(): void {}
  logMigration(): void {}
  log(): void {}
  reset(): void {
    this.queries = [];
    this.roundTrips = [];
  }
}

export function dataSourceOptions(
  schema: string,
  extra: Partial<{ url: string; logger: TypeOrmLogger; poolSize: number; logging: LoggerOptions }> = {},
): DataSourceOptions {
  return {
    type: 'postgres',
    url: extra.url ?? databaseUrl(),
    schema,
    // Plain SQL (the key table) resolves through search_path like entities do through `schema`.
    extra: { options: `-c search_path=${schema}`, max: extra.poolSize ?? 20, connectionTimeoutMillis: 5_000 },
    logging: extra.logging ?? (extra.logger ? ['query'] : false),
    logger: extra.logger,
  } as DataSourceOptions;
}

/** The DDL of the key table in use (see key-table.ts): the plain table's, or the partitioned one's with daily partitions. */
export function keyTableStatements(tableName = 'idempotency_keys'): string[] {
  return keyTableKind() === 'partitioned'
    ? createPartitionedTableStatements(tableName, DEFAULT_PARTITION_LAYOUT)
    : createTableStatements(tableName);
}

/** Creates the key table (plain or partitioned, see key-table.ts) and the test's effect table in `schema`. */
export async function createTables(schema: string, tableName = 'idempotency_keys'): Promise<void> {
  const client = new pg.Client({ connectionString: databaseUrl(), options: `-c search_path=${schema}` });
  await client.connect();
  try {
    for (const statement of keyTableStatements(tableName)) await client.query(statement);
    if (citusTest) {
      await client.query(`CREATE TABLE IF NOT EXISTS effects (
        id bigserial, tenant text NOT NULL, label text NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (tenant, id))`);
      await client.query(`SELECT create_distributed_table('effects', 'tenant')
        WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'effects'::regclass)`);
      for (const statement of distributeIdempotencyTablesStatements({ tableName, colocateWith: 'effects' }))
        await client.query(statement);
      return;
    }
    await client.query(`CREATE TABLE IF NOT EXISTS effects (
      id bigserial PRIMARY KEY, tenant text NOT NULL, label text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`);
  } finally {
    await client.end();
  }
}

/** A plain client on the test schema, for arranging and inspecting rows directly. */
export async function sqlClient(schema: string): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: databaseUrl(), options: `-c search_path=${schema}` });
  await client.connect();
  return client;
}

export async function openDataSource(options: DataSourceOptions): Promise<DataSource> {
  const dataSource = new DataSource(options);
  await dataSource.initialize();
  return dataSource;
}

/** Creates the outbox table in `schema`. */
export async function createOutboxTable(schema: string, tableName = 'outbox_messages'): Promise<void> {
  const client = await sqlClient(schema);
  try {
    for (const statement of createOutboxStatements(tableName)) await client.query(statement);
  } finally {
    await client.end();
  }
}

/**
 * The data sources of apps that may fail to start, for `dataSourceFactory`.
 * A bootstrap that fails leaves no app to close; and Nest rejects as soon as
 * one provider fails, while the others already under way, a data source
 * still connecting among them, go on and finish later. So what is tracked is
 * each opening, not each opened data source: `closeAll()` waits for those
 * still under way and destroys whatever they opened, and one that starts
 * after it is destroyed as soon as it is open.
 */
export class DataSourceTracker {
  private readonly openings: Array<Promise<DataSource>> = [];
  private closed = false;

  /** How many data sources were asked for. */
  get count(): number {
    return this.openings.length;
  }

  /** A `dataSourceFactory` that opens through `open` (default: a plain `initialize()`) and tracks it. */
  factory(
    open: (options?: DataSourceOptions) => Promise<DataSource> = (options) => new DataSource(options!).initialize(),
  ): (options?: DataSourceOptions) => Promise<DataSource> {
    return (options) => {
      const opening = open(options).then(async (dataSource) => {
        if (this.closed) {
          await dataSource.destroy();
          throw new Error('DataSourceTracker: opened after closeAll(); destroyed');
        }
        return dataSource;
      });
      this.openings.push(opening);
      return opening;
    };
  }

  async closeAll(): Promise<void> {
    this.closed = true;
    const settled = await Promise.allSettled(this.openings);
    await Promise.all(
      settled.map((result) => (result.status === 'fulfilled' && result.value.isInitialized ? result.value.destroy() : undefined)),
    );
  }
}

/**
 * A COMMIT the database refuses: effect rows whose label is listed in `refused_labels` fail a deferred constraint
 * trigger at COMMIT (SQLSTATE 23514), until taken off the list. `tenant` limits it to that tenant's effect rows.
 */
export async function installCommitJudge(db: pg.Client, tenant?: string): Promise<void> {
  await db.query('CREATE TABLE refused_labels (label text PRIMARY KEY)');
  const onlyTenant = tenant === undefined ? '' : `NEW.tenant = ${db.escapeLiteral(tenant)} AND `;
  await db.query(`CREATE FUNCTION judge_effect() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF ${onlyTenant}EXISTS (SELECT 1 FROM refused_labels WHERE label = NEW.label) THEN
        RAISE EXCEPTION 'effect refused at commit' USING ERRCODE = '23514';
      END IF;
      RETURN NULL;
    END $$`);
  await db.query(`CREATE CONSTRAINT TRIGGER judge_effect AFTER INSERT ON effects
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION judge_effect()`);
}
