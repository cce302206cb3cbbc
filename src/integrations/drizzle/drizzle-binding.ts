import type { NodePgQueryResultHKT } from 'drizzle-orm/node-postgres';
import type { PgDatabase } from 'drizzle-orm/pg-core';
import type { EntityManager } from 'typeorm';
import { IdempotencyConfigurationError } from '../../errors/configuration.error.js';
import { loadOptionalPackage } from '../../outbound/optional-package.js';
import { idempotencyContext } from '../../transaction/idempotency-context.js';
import { drizzleMessages } from './messages.js';

/**
 * A Drizzle database on node-postgres: what `drizzle()` of
 * `drizzle-orm/node-postgres` returns, and what a transaction of it is.
 * Both the app's own database and the one bound to an idempotent
 * execution's transaction are one.
 */
export type DrizzleDatabase<TSchema extends Record<string, unknown> = Record<string, never>> = PgDatabase<
  NodePgQueryResultHKT,
  TSchema
>;

/** What the binding uses of drizzle-orm, loaded at start-up. */
interface Drizzle {
  is(value: unknown, type: unknown): boolean;
  PgDatabase: unknown;
  NodePgSession: new (client: QueryClient, dialect: unknown, schema: unknown, options: unknown) => unknown;
  NodePgTransaction: new (dialect: unknown, session: unknown, schema: unknown, nestedIndex?: number) => DrizzleDatabase;
}

/** What Drizzle's node-postgres session calls on its client: `query` and nothing else, outside `session.transaction()`. */
interface QueryClient {
  query(...args: unknown[]): unknown;
}

/** The parts of a Drizzle database the binding reads: not in drizzle-orm's typed API, but what its own transactions copy. */
interface DatabaseParts {
  dialect: unknown;
  _: { schema?: unknown; fullSchema: unknown; tableNamesMap: unknown; session: SessionParts };
}
interface SessionParts {
  options?: { logger?: unknown; cache?: unknown };
  logger?: unknown;
  cache?: unknown;
}

/** One binding per app database, shared by `DrizzleTransactionHost` and `clsTransactionalDrizzle()`. */
const bindings = new WeakMap<object, Promise<DrizzleBinding>>();

/**
 * Binds the app's Drizzle database to the connection of an idempotent
 * execution's transaction: a Drizzle transaction (`NodePgTransaction`) on
 * that pg client, as Drizzle's own `db.transaction()` would hand its
 * callback, with the app database's dialect (casing), relational schema,
 * logger and cache. Being a transaction, its `transaction()` opens a
 * savepoint, never a BEGIN or a COMMIT of its own: the module's transaction
 * (which also completes the key) is the only one, and the module commits it.
 *
 * One per pg client (a pool connection), kept while the client lives, so a
 * request does not build one. Each statement first checks that it runs in
 * the execution whose transaction holds that client, still open: a Drizzle
 * transaction kept past its execution would otherwise run on a connection
 * the pool has lent to another request.
 */
export class DrizzleBinding<TSchema extends Record<string, unknown> = Record<string, never>> {
  private readonly transactions = new WeakMap<object, DrizzleDatabase<TSchema>>();
  private readonly schemaConfig: unknown;

  private constructor(
    readonly appDb: DrizzleDatabase<TSchema>,
    private readonly drizzle: Drizzle,
  ) {
    const { _: parts } = appDb as unknown as DatabaseParts;
    // What drizzle() builds from its `schema` option, and what its transactions are given.
    this.schemaConfig = parts.schema
      ? { schema: parts.schema, fullSchema: parts.fullSchema, tableNamesMap: parts.tableNamesMap }
      : undefined;
  }

  /**
   * The binding of `db`, after loading drizzle-orm and checking `db` is a
   * Drizzle database on node-postgres (else an `IdempotencyConfigurationError`
   * naming `who`).
   */
  static of<TSchema extends Record<string, unknown>>(db: unknown, who: string): Promise<DrizzleBinding<TSchema>> {
    if (typeof db !== 'object' || db === null) {
      return Promise.reject(new IdempotencyConfigurationError(drizzleMessages.notNodePostgres(who)));
    }
    let binding = bindings.get(db);
    if (!binding) {
      binding = DrizzleBinding.create(db, who);
      bindings.set(db, binding);
      binding.catch(() => bindings.delete(db));
    }
    return binding as Promise<DrizzleBinding<TSchema>>;
  }

  private static async create(db: object, who: string): Promise<DrizzleBinding<never>> {
    // drizzle-orm first: when it is missing, its own name is the one in the error.
    const core = await loadOptionalPackage<Pick<Drizzle, 'is'>>('drizzle-orm', drizzleMessages.missing);
    const pgCore = await loadOptionalPackage<Pick<Drizzle, 'PgDatabase'>>('drizzle-orm/pg-core', drizzleMessages.missing);
    const nodePg = await loadOptionalPackage<Pick<Drizzle, 'NodePgSession' | 'NodePgTransaction'>>(
      'drizzle-orm/node-postgres',
      drizzleMessages.missing,
    );
    const drizzle: Drizzle = { is: core.is, PgDatabase: pgCore.PgDatabase, ...nodePg };
    const parts = db as Partial<DatabaseParts>;
    // `is` follows Drizzle's entity kinds, so a second copy of drizzle-orm in node_modules still passes.
    if (!drizzle.is(db, drizzle.PgDatabase) || !parts.dialect || !drizzle.is(parts._?.session, drizzle.NodePgSession)) {
      throw new IdempotencyConfigurationError(drizzleMessages.notNodePostgres(who));
    }
    return new DrizzleBinding(db as DrizzleDatabase<never>, drizzle);
  }

  /**
   * The Drizzle database to use where this is called: bound to the
   * transaction of the idempotent execution it runs in, the app's own
   * database outside one.
   */
  current(): DrizzleDatabase<TSchema> {
    const context = idempotencyContext.getStore();
    return context?.transactional ? this.transactionOf(context.manager) : this.appDb;
  }

  /** The Drizzle transaction on the connection of `manager`'s transaction (the module's). */
  transactionOf(manager: EntityManager): DrizzleDatabase<TSchema> {
    const client = clientOf(manager);
    if (!client) throw new Error(manager.queryRunner?.isReleased ? drizzleMessages.ended : drizzleMessages.noConnection);
    let tx = this.transactions.get(client);
    if (!tx) {
      tx = this.bind(client);
      this.transactions.set(client, tx);
    }
    return tx;
  }

  private bind(client: QueryClient): DrizzleDatabase<TSchema> {
    const { dialect, _: parts } = this.appDb as unknown as DatabaseParts;
    const session = parts.session;
    const options = session.options ?? { logger: session.logger, cache: session.cache };
    const guarded: QueryClient = {
      query: (...args: unknown[]) => {
        const manager = idempotencyContext.getStore()?.manager;
        if (!manager || clientOf(manager) !== client) throw new Error(drizzleMessages.ended);
        // Read at each call: the module's deferred BEGIN hooks the client's own `query` until the transaction opens.
        return client.query(...args);
      },
    };
    const { NodePgSession, NodePgTransaction } = this.drizzle;
    const boundSession = new NodePgSession(guarded, dialect, this.schemaConfig, options);
    return new NodePgTransaction(dialect, boundSession, this.schemaConfig) as unknown as DrizzleDatabase<TSchema>;
  }
}

/** The pg client of `manager`'s query runner while its transaction holds it; undefined once it went back to the pool. */
function clientOf(manager: EntityManager): QueryClient | undefined {
  const runner = manager.queryRunner;
  if (!runner || runner.isReleased) return undefined;
  return (runner as unknown as { databaseConnection?: QueryClient }).databaseConnection;
}
