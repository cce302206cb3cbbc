/**
 * What the module uses of a database connection source: the members its
 * store, schema check, sweeper, outbox, ledger and integrations call. TypeORM's
 * `DataSource`, `QueryRunner` and `EntityManager` have every one of them, so
 * on the TypeORM path the module runs on TypeORM's objects themselves (same
 * code, same statements); `PoolDataSource` (pool-data-source.ts) is the one
 * implementation over a plain `pg.Pool`, for apps without TypeORM.
 */

/** Where the module logs its statements (TypeORM's `Logger` is one; the redacting wrapper guards it). */
export interface StatementLogger {
  logQuery(query: string, parameters?: any[], runner?: any): any;
  logQueryError(error: string | Error, query: string, parameters?: any[], runner?: any): any;
  logQuerySlow(time: number, query: string, parameters?: any[], runner?: any): any;
  logSchemaBuild(message: string, runner?: any): any;
  logMigration(message: string, runner?: any): any;
  log(level: 'log' | 'info' | 'warn', message: any, runner?: any): any;
}

/** A connection of a source's pool, held for one transaction or a few statements. */
export interface SourceQueryRunner {
  readonly connection: SourceDataSource;
  readonly manager: SourceManager;
  readonly isReleased: boolean;
  readonly isTransactionActive: boolean;
  /** The pg client, taken from the pool on the first call. */
  connect(): Promise<any>;
  release(): Promise<void>;
  startTransaction(isolationLevel?: any): Promise<void>;
  commitTransaction(): Promise<void>;
  rollbackTransaction(): Promise<void>;
  /** As TypeORM answers: rows, `[rows, count]` for UPDATE and DELETE, or `{ records, affected }` when `structured`. */
  query(sql: string, parameters?: any[], structured?: boolean): Promise<any>;
}

/** What the work's transaction (or the plain source outside one) is handed as: TypeORM's `EntityManager` has these. */
export interface SourceManager {
  readonly connection: SourceDataSource;
  readonly queryRunner?: SourceQueryRunner;
  query(sql: string, parameters?: any[]): Promise<any>;
}

/** A pool of connections to the database the key table lives in. */
export interface SourceDataSource {
  readonly isInitialized: boolean;
  readonly options: {
    readonly isolationLevel?: string;
    readonly synchronize?: boolean;
    readonly schema?: string;
    readonly migrationsTableName?: string;
  };
  readonly driver: object;
  readonly manager: SourceManager;
  logger: StatementLogger;
  createQueryRunner(): SourceQueryRunner;
  query(sql: string, parameters?: any[]): Promise<any>;
  transaction<T>(work: (manager: SourceManager) => Promise<T>): Promise<T>;
  destroy(): Promise<void>;
}
