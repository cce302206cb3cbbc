import pg from 'pg';
import type { SourceDataSource } from '../../store/connection.js';
import { idempotencyContext } from '../../transaction/idempotency-context.js';
import { ExecutionConnection, type PgConnection } from './execution-connection.js';
import { idempotentPoolMessages as messages } from './messages.js';

type Callback = (error: Error | null, ...results: any[]) => void;

/** Which database a connection reaches: its name, and its server told apart by when it started. */
const IDENTITY = 'SELECT current_database() AS name, pg_postmaster_start_time()::text AS started';
interface DatabaseIdentity {
  name: string;
  started: string;
}

/**
 * A `pg.Pool` for an ORM that runs on the app's own pool (Prisma's
 * `@prisma/adapter-pg`, or any other that takes a `pg.Pool`): outside an
 * idempotent execution it is the app's pool, unchanged; inside one, its
 * statements run in the execution's transaction, so they commit with the
 * key's completion or roll back with it.
 *
 * Inside an idempotent execution (an `@Idempotent()` handler, a phase of
 * phased work, `IdempotencyService.execute`):
 * - `query()` runs on the transaction's connection;
 * - `connect()` lends that same connection; its `release()` gives nothing
 *   back, and its `BEGIN` / `COMMIT` / `ROLLBACK` become a savepoint of the
 *   transaction (`SAVEPOINT`, `RELEASE SAVEPOINT`, `ROLLBACK TO SAVEPOINT`),
 *   so the ORM's own transactions roll back alone and commit with the key;
 * - no COMMIT or ROLLBACK of the app's reaches the connection;
 * - the first statement checks, once per pool and data source, that the pool
 *   and the module's data source reach the same database.
 *
 * Everything runs on one connection there: the ORM's transactions run one
 * after the other (a second one beside an open one is refused), and nest
 * only through the ORM's own savepoints.
 */
export class IdempotentPool extends pg.Pool {
  /** Per module data source: the error to throw when the app's pool reaches another database, else undefined. */
  private readonly checked = new WeakMap<SourceDataSource, Promise<Error | undefined>>();
  private appIdentity?: Promise<DatabaseIdentity>;

  constructor(readonly appPool: pg.Pool) {
    // pg.Pool's own state stays unused (it opens nothing until asked); `options` is what adapters read of a pool.
    super(appPool.options);
  }

  override query(config: any, values?: any, callback?: any): any {
    if (!idempotencyContext.getStore()?.transactional)
      return (this.appPool.query as (...args: unknown[]) => unknown)(config, values, callback);
    if (typeof values === 'function') [values, callback] = [undefined, values];
    const answer = this.connection().then((connection) => connection.query(config, values));
    if (typeof callback !== 'function') return answer;
    answer.then(
      (result) => (callback as Callback)(null, result),
      (error: Error) => (callback as Callback)(error),
    );
    return undefined;
  }

  override connect(callback?: any): any {
    if (!idempotencyContext.getStore()?.transactional) return callback ? this.appPool.connect(callback) : this.appPool.connect();
    const client = this.connection().then((connection) => connection.lend());
    if (typeof callback !== 'function') return client;
    client.then(
      (lent) => (callback as Callback)(null, lent, () => lent.release()),
      (error: Error) => (callback as Callback)(error),
    );
    return undefined;
  }

  /** Ends the app's pool: the module's connections are the module's. */
  override end(callback?: any): any {
    return callback ? this.appPool.end(callback) : this.appPool.end();
  }

  /** The current execution's connection, once the pool is known to reach its database. */
  private async connection(): Promise<ExecutionConnection> {
    const runner = idempotencyContext.getStore()?.manager.queryRunner;
    if (!runner) throw new Error(messages.noConnection);
    const connection = await ExecutionConnection.of(runner);
    connection.checkLive();
    await this.sameDatabase(connection);
    return connection;
  }

  private async sameDatabase(connection: ExecutionConnection): Promise<void> {
    let check = this.checked.get(connection.dataSource);
    if (!check) {
      check = Promise.all([this.identityOfApp(), identityOf(connection.client)]).then(([app, module]) =>
        app.name === module.name && app.started === module.started
          ? undefined
          : new Error(messages.otherDatabase(app.name, module.name)),
      );
      // A check that could not run (the database did not answer) is tried again by the next statement; a verdict is kept.
      check.catch(() => this.checked.delete(connection.dataSource));
      this.checked.set(connection.dataSource, check);
    }
    const mismatch = await check;
    if (mismatch) throw new Error(mismatch.message);
  }

  private identityOfApp(): Promise<DatabaseIdentity> {
    this.appIdentity ??= identityOf(this.appPool);
    this.appIdentity.catch(() => (this.appIdentity = undefined));
    return this.appIdentity;
  }
}

// The app's pool's counts (getters on pg.Pool's prototype, typed as fields in @types/pg).
for (const count of ['totalCount', 'idleCount', 'waitingCount'] as const)
  Object.defineProperty(IdempotentPool.prototype, count, {
    get(this: IdempotentPool) {
      return this.appPool[count];
    },
  });

async function identityOf(queryable: Pick<PgConnection, 'query'> | pg.Pool): Promise<DatabaseIdentity> {
  const { rows } = await (queryable as PgConnection).query(IDENTITY);
  return rows[0] as DatabaseIdentity;
}

/**
 * The app's pool, made aware of idempotent executions: give it to the ORM in
 * place of the pool itself, e.g. `new PrismaClient({ adapter: new
 * PrismaPg(idempotentPool(pool)) })`. The pool and IdempotencyModule's data
 * source must reach the same database (checked at the first statement inside
 * an idempotent execution). Ending the returned pool ends the app's. Throws
 * when `pool` is not a `pg.Pool` of the `pg` this package loads (two copies
 * of `pg` in the app, where an ORM's `instanceof pg.Pool` may fail too).
 */
export function idempotentPool(pool: pg.Pool): IdempotentPool {
  if (!(pool instanceof pg.Pool)) throw new Error(messages.notAPool);
  return new IdempotentPool(pool);
}
