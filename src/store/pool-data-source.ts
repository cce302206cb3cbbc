import type { SourceDataSource, SourceManager, SourceQueryRunner, StatementLogger } from './connection.js';

/*
 * node-postgres's pool, client and result as far as the module uses them, typed here rather than imported from
 * `pg`: the package's declaration files are read by every app that imports it, and an app on TypeORM need not have
 * `@types/pg` (they are checked with `skipLibCheck` off). `pg`'s own `Pool` is a `PgPool`.
 */

/** A statement's answer, as node-postgres gives it. */
export interface PgQueryResult {
  rows: unknown[];
  rowCount: number | null;
  command: string;
}

/** A client the pool lends: its statements, and how it is given back. */
export interface PgPoolClient {
  query(text: string, values?: unknown[]): Promise<PgQueryResult>;
  /** With an error (or `true`), the pool drops the client instead of lending it again. */
  release(error?: Error | boolean): void;
  on(event: 'error', listener: (error: Error) => void): unknown;
  removeListener(event: 'error', listener: (error: Error) => void): unknown;
  processID?: number;
}

/** The app's `pg.Pool`, as the `pool` option takes it. */
export interface PgPool {
  connect(): Promise<PgPoolClient>;
  query(text: string, values?: unknown[]): Promise<PgQueryResult>;
  end(): Promise<void>;
  /** The options it was made with (connection string, credentials, SSL, ...): a second pool is opened with them. */
  readonly options: object;
}

type PoolClient = PgPoolClient;

/**
 * The module's connection source on a plain `pg.Pool` (the `pool` option):
 * what the store and the rest of the module use of a data source, and
 * nothing of an ORM. Statements go to the pool's clients as they are;
 * answers have the shapes TypeORM's postgres driver gives, since the module's
 * code reads them so on both paths.
 */
export class PoolDataSource implements SourceDataSource {
  readonly isInitialized = true;
  readonly options: SourceDataSource['options'] = {};
  /** The pool under the name TypeORM's driver has for it (`master`), and how a connection is taken from it. */
  readonly driver: { master: PgPool; obtainMasterConnection(): Promise<[PoolClient, (error?: unknown) => void]> };
  readonly manager: SourceManager;
  /** Logs nothing: there is no ORM logger to follow, and the module's statements carry keys and bodies. */
  logger: StatementLogger = silentLogger;

  constructor(
    readonly pool: PgPool,
    /** Whether `destroy()` ends the pool (the claim pool the module opened), or leaves it to the app (the app's). */
    private readonly ownsPool = false,
  ) {
    this.driver = {
      master: pool,
      obtainMasterConnection: async () => {
        const client = (await pool.connect()) as PoolClient;
        return [
          client,
          (error?: unknown) => client.release(error instanceof Error ? error : error === undefined ? undefined : true),
        ];
      },
    };
    this.manager = { connection: this, query: (sql, parameters) => this.query(sql, parameters) };
  }

  createQueryRunner(): PoolQueryRunner {
    return new PoolQueryRunner(this);
  }

  /** One statement on a connection taken for it. */
  async query(sql: string, parameters?: unknown[]): Promise<unknown> {
    return typeormShaped(await this.pool.query(sql, parameters), false);
  }

  /** `work` in a transaction of its own connection: committed when it resolves, rolled back when it throws. */
  async transaction<T>(work: (manager: SourceManager) => Promise<T>): Promise<T> {
    const runner = this.createQueryRunner();
    try {
      await runner.startTransaction();
      const result = await work(runner.manager);
      await runner.commitTransaction();
      return result;
    } catch (error) {
      if (runner.isTransactionActive) await runner.rollbackTransaction().catch(() => undefined);
      throw error;
    } finally {
      await runner.release();
    }
  }

  async destroy(): Promise<void> {
    if (this.ownsPool) await this.pool.end();
  }

  /**
   * A second pool on the same database (the pool's own connection options:
   * URL, credentials, SSL, `options` such as `search_path`), of `size`
   * connections, which `destroy()` ends.
   */
  openSibling(size: number): PoolDataSource {
    const Pool = this.pool.constructor as new (options: object) => PgPool;
    // allowExitOnIdle: its idle connections never keep a process alive (an app whose start-up failed, say).
    return new PoolDataSource(new Pool({ ...this.pool.options, max: size, allowExitOnIdle: true }), true);
  }
}

/**
 * One connection of a `PoolDataSource`, as a TypeORM query runner is one:
 * taken on the first statement, its transaction started and ended by
 * statements sent through `query` (which the module's transaction hook
 * replaces for a moment, see typeorm-transaction-hook.ts), given back once.
 */
export class PoolQueryRunner implements SourceQueryRunner {
  isReleased = false;
  isTransactionActive = false;
  readonly manager: SourceManager;
  /** The pg client while held; what the integrations and an abort (its `processID`) read. */
  databaseConnection?: PoolClient;
  private connecting?: Promise<[PoolClient, (error?: unknown) => void]>;
  private giveBack?: (error?: unknown) => void;

  constructor(readonly connection: PoolDataSource) {
    this.manager = { connection, queryRunner: this, query: (sql, parameters) => this.query(sql, parameters) };
  }

  async connect(): Promise<PoolClient> {
    if (this.databaseConnection) return this.databaseConnection;
    if (this.isReleased) throw new Error('This connection has already been given back to the pool.');
    this.connecting ??= this.connection.driver.obtainMasterConnection();
    const [client, release] = await this.connecting;
    // A held client that loses its connection emits 'error', which with no listener would end the process; the
    // statement waiting on it fails anyway, and the client is dropped rather than lent again (TypeORM does the same).
    const dropped = (error: unknown) => void this.releasePostgresConnection(error);
    client.on('error', dropped);
    this.databaseConnection = client;
    this.giveBack = (error) => {
      client.removeListener('error', dropped);
      release(error);
    };
    return client;
  }

  /** Gives the connection back to the pool; with an error, the pool drops it instead (as TypeORM's runner does). */
  async releasePostgresConnection(error?: unknown): Promise<void> {
    if (this.isReleased) return;
    this.isReleased = true;
    const giveBack = this.giveBack;
    this.giveBack = undefined;
    giveBack?.(error);
  }

  release(): Promise<void> {
    return this.releasePostgresConnection();
  }

  async startTransaction(isolationLevel?: string): Promise<void> {
    this.isTransactionActive = true;
    await this.query('START TRANSACTION');
    if (isolationLevel) await this.query(`SET TRANSACTION ISOLATION LEVEL ${isolationLevel}`);
  }

  async commitTransaction(): Promise<void> {
    if (!this.isTransactionActive) throw new Error('No transaction is open on this connection.');
    await this.query('COMMIT');
    this.isTransactionActive = false;
  }

  async rollbackTransaction(): Promise<void> {
    if (!this.isTransactionActive) throw new Error('No transaction is open on this connection.');
    await this.query('ROLLBACK');
    this.isTransactionActive = false;
  }

  async query(sql: string, parameters?: unknown[], structured = false): Promise<unknown> {
    if (this.isReleased) throw new Error('This connection has already been given back to the pool.');
    const client = await this.connect();
    return typeormShaped(await client.query(sql, parameters), structured);
  }
}

/** An answer in the shape TypeORM's postgres driver gives it, which the module's statements are read in. */
function typeormShaped(raw: PgQueryResult, structured: boolean): unknown {
  const rows = raw.rows ?? [];
  if (structured) return { records: rows, affected: raw.rowCount ?? undefined, raw: rows };
  return raw.command === 'UPDATE' || raw.command === 'DELETE' ? [rows, raw.rowCount] : rows;
}

const silent = () => undefined;
const silentLogger: StatementLogger = {
  logQuery: silent,
  logQueryError: silent,
  logQuerySlow: silent,
  logSchemaBuild: silent,
  logMigration: silent,
  log: silent,
};
