import type { DataSource, QueryRunner } from 'typeorm';
import type { PipelinedStatement } from './pipelined.js';
import type { PgClient } from './pools.js';

/** What a statement of the work answered, as node-postgres's callback gets it. */
type Callback = (error: Error | null, result?: unknown) => void;

/** node-postgres's `Query` (a submittable), as far as the deferred BEGIN drives it. */
interface PgQuery {
  text?: string;
  name?: string;
  callback?: Callback;
  submit(connection: PgConnection): Error | null | undefined;
  requiresPreparation(): boolean;
  hasBeenParsed(connection: PgConnection): boolean;
  handleCommandComplete(message: unknown, connection: PgConnection): void;
  handleError(error: Error, connection: PgConnection): void;
  handleReadyForQuery(connection: PgConnection): void;
}

/** node-postgres's connection: the protocol messages the deferred BEGIN writes ahead of a statement. */
interface PgConnection {
  parse(query: { text: string; name?: string }): void;
  bind(config: { portal?: string; statement?: string; values?: unknown[] }): void;
  execute(config: { portal?: string; rows?: number }): void;
  parsedStatements: Record<string, string | undefined>;
  stream: { cork?: () => void; uncork?: () => void };
}

type QueryClass = new (config: unknown, values?: unknown, callback?: unknown) => PgQuery;

/**
 * The work's `START TRANSACTION` of a separate claim, not sent with the claim
 * but with the work's first statement on the claim's connection, in the same
 * round trip. A claim answered without claiming (a replay, a 409, a 422) then
 * opens no transaction at all, and a new key still costs three round trips.
 *
 * TypeORM has already run `startTransaction()` (its subscribers saw the start,
 * and it counts the transaction as open); until the first statement goes out,
 * the server has none. The first statement's protocol messages are preceded,
 * in the same write, by the BEGIN's (Parse, Bind, Execute: no Sync between
 * them), so PostgreSQL runs both as one extended-query batch: when the BEGIN
 * fails, the server skips the statement up to the batch's Sync, and the
 * statement fails with the BEGIN's error. A statement without parameters
 * (the simple protocol) gets the BEGIN in front of its text, one message,
 * which PostgreSQL stops at the first error just the same. Either way the
 * work's statement never runs outside its transaction.
 *
 * Any other form (a `QueryStream` or cursor of TypeORM's `stream()`) gets the
 * BEGIN as a statement of its own, awaited. So does every statement sent
 * while the first one's answer is still out: each runs only once the BEGIN
 * is known to have opened the transaction, and fails with the BEGIN's error
 * otherwise, as statements of an aborted transaction fail.
 *
 * A ROLLBACK before any statement (the work failed without touching the
 * database) sends nothing, and the completion takes the BEGIN into its own
 * message (`take`).
 */
export class DeferredBegin {
  /** armed: nothing sent; sent: the first statement carries it; open / failed: its answer. */
  private state: 'armed' | 'sent' | 'open' | 'failed' = 'armed';
  private failure?: Error;
  private announced = false;
  private readonly runnerQuery: QueryRunner['query'];
  private readonly clientQuery: PgClient['query'];

  private constructor(
    private readonly runner: QueryRunner,
    private readonly client: PgClient,
    private readonly statement: string,
    private readonly source: DataSource,
  ) {
    this.runnerQuery = Object.getPrototypeOf(runner).query as QueryRunner['query'];
    this.clientQuery = Object.getPrototypeOf(client).query as PgClient['query'];
  }

  /**
   * Defers `statement` (the work's START TRANSACTION, as TypeORM would send
   * it) to the first statement on `client`, the connection `runner` holds.
   * Called from within TypeORM's `startTransaction()`, so that a statement of
   * the app's `afterTransactionStart` subscribers carries it too; `watchRunner`
   * follows once that has returned.
   */
  static arm(runner: QueryRunner, client: PgClient, statement: string, source: DataSource): DeferredBegin {
    const begin = new DeferredBegin(runner, client, statement, source);
    begin.hookClient();
    return begin;
  }

  /** Whether `client` is node-postgres's JavaScript client, whose statements the BEGIN can be written ahead of. */
  static canDefer(client: PgClient): boolean {
    return queryClassOf(client) !== undefined;
  }

  /** Nothing has been sent on the connection since the claim: the server has no transaction open yet. */
  get pending(): boolean {
    return this.state === 'armed';
  }

  /**
   * The transaction may be open on the server: the BEGIN answered, went out
   * with the completion, or was dropped by a ROLLBACK before any statement.
   * False while it waits, is on its way, or failed.
   */
  get opened(): boolean {
    return this.state === 'open';
  }

  /**
   * The BEGIN as the first statement of a message the store sends itself
   * (the completion's: `START TRANSACTION`, completion, `COMMIT`), when the
   * work sent none; undefined once it has gone out. Its transaction would hold
   * the completion alone, so even a BEGIN that failed there changes nothing:
   * the completion then commits on its own, as it would have with it.
   */
  take(): PipelinedStatement | undefined {
    if (this.state !== 'armed') return undefined;
    this.state = 'open';
    this.announced = true;
    this.unhookRunner();
    this.unhookClient();
    return { text: this.statement };
  }

  /**
   * Logs the BEGIN through the data source's logger once, before the
   * statement that carries it (TypeORM logs a statement before sending it).
   */
  private announce(): void {
    if (this.announced) return;
    this.announced = true;
    this.source.logger.logQuery(this.statement, undefined, this.runner);
  }

  /**
   * TypeORM's side: the first statement through the runner logs the BEGIN
   * ahead of itself; a ROLLBACK before any statement sends nothing (TypeORM
   * still tells the app's subscribers of the rollback).
   */
  watchRunner(): void {
    if (this.state !== 'armed') return;
    const own = this.runner as QueryRunner & { query: QueryRunner['query'] };
    own.query = ((sql: string, ...rest: unknown[]) => {
      this.unhookRunner();
      if (this.state === 'armed' && sql === 'ROLLBACK' && !this.runner.isReleased) {
        this.state = 'open';
        this.unhookClient();
        return Promise.resolve([]);
      }
      if (this.state === 'armed') this.announce();
      return (this.runnerQuery as (...args: unknown[]) => Promise<unknown>).call(this.runner, sql, ...rest);
    }) as QueryRunner['query'];
  }

  private unhookRunner(): void {
    // Assigned back, never deleted: a delete would turn the runner into a dictionary-mode object (see
    // typeorm-transaction-hook.ts).
    (this.runner as QueryRunner & { query: QueryRunner['query'] }).query = this.runnerQuery;
  }

  /** node-postgres's side: every statement on the connection, whoever sends it (TypeORM, or the app on the raw client). */
  private hookClient(): void {
    const original = this.clientQuery as (...args: unknown[]) => unknown;
    (this.client as { query: unknown }).query = (config: unknown, values?: unknown, callback?: unknown) => {
      // The connection went back to its pool (the attempt ended): whoever holds it now gets it as it was. The same
      // once the transaction is open, and for the ROLLBACK after a failed BEGIN, which goes to the server (it tells a
      // dead connection apart).
      if (this.runner.isReleased || this.state === 'open' || (this.state === 'failed' && config === 'ROLLBACK')) {
        this.unhookClient();
        return original.call(this.client, config, values, callback);
      }
      if (this.state === 'armed') {
        this.state = 'sent';
        this.announce();
        return this.sendFirst(config, values, callback);
      }
      return this.sendAfter(config, values, callback);
    };
  }

  private unhookClient(): void {
    (this.client as { query: unknown }).query = this.clientQuery;
  }

  /** The first statement, carrying the BEGIN. */
  private sendFirst(config: unknown, values: unknown, callback: unknown): unknown {
    const Query = queryClassOf(this.client)!;
    const [query, result] = this.queryOf(Query, config, values, callback);
    const connection = (this.client as unknown as { connection: PgConnection }).connection;
    // A cursor or a stream keeps its portal open across round trips, and a named statement not yet parsed would have
    // node-postgres file the BEGIN's parse under its name: the BEGIN goes first, on its own, and the statement only
    // after it answered.
    const carries = query instanceof Query && !(query.name && !query.hasBeenParsed(connection));
    if (carries) this.carryBegin(query);
    else {
      // Its outcome is read off its answers (see watchBegin); an error reaches the statements held back behind it.
      const own = new Query(this.statement, undefined, () => undefined);
      this.watchBegin(own, false);
      this.send(own, undefined, undefined);
      this.holdBack(query);
    }
    return this.send(query, values, callback) ?? result;
  }

  /**
   * A statement sent after the BEGIN but before its answer: node-postgres sends it once the statements before it
   * answered, and by then the BEGIN's outcome is known. It runs only inside the opened transaction.
   */
  private sendAfter(config: unknown, values: unknown, callback: unknown): unknown {
    const [query, result] = this.queryOf(queryClassOf(this.client)!, config, values, callback);
    this.holdBack(query);
    return this.send(query, values, callback) ?? result;
  }

  /** Makes `query` fail, unsent, unless the BEGIN has opened the transaction by the time node-postgres sends it. */
  private holdBack(query: PgQuery): void {
    const submit = query.submit;
    query.submit = (connection: PgConnection) => {
      query.submit = submit;
      if (this.state !== 'open') return this.failure ?? new Error('The transaction of the work has not opened.');
      return submit.call(query, connection);
    };
  }

  /**
   * Hands `query` to node-postgres; for a submittable the caller passed (a
   * cursor, a stream, a Query), what node-postgres returns for it.
   */
  private send(query: PgQuery, values: unknown, callback: unknown): unknown {
    const own = (query as { [OWN]?: boolean })[OWN];
    const sent = (this.clientQuery as (...args: unknown[]) => unknown).call(
      this.client,
      query,
      own ? undefined : values,
      own ? undefined : callback,
    );
    return own ? undefined : sent;
  }

  /**
   * node-postgres's Query for `client.query(config, values, callback)`, and
   * what that call returns (a promise when there is no callback), as
   * node-postgres makes them.
   */
  private queryOf(Query: QueryClass, config: unknown, values: unknown, callback: unknown): [PgQuery, unknown] {
    if (typeof (config as { submit?: unknown } | null)?.submit === 'function') return [config as PgQuery, undefined];
    const query = Object.assign(new Query(config, values, callback), { [OWN]: true });
    if (query.callback) return [query, undefined];
    const result = new Promise((resolve, reject) => {
      query.callback = (error, rows) => (error ? reject(error) : resolve(rows));
    });
    return [query, result];
  }

  /** Writes the BEGIN ahead of `query`'s own messages, in the same batch; reads its answer ahead of the query's. */
  private carryBegin(query: PgQuery): void {
    const submit = query.submit;
    query.submit = (connection: PgConnection) => {
      query.submit = submit;
      if (!query.requiresPreparation()) {
        // One simple-protocol message: PostgreSQL runs its statements in order and stops at the first error.
        query.text = `${this.statement}; ${query.text}`;
        return submit.call(query, connection);
      }
      // Until the batch's Sync, an error makes PostgreSQL skip every message: a failed BEGIN skips the statement.
      connection.stream.cork?.();
      try {
        connection.parse({ text: this.statement });
        connection.bind({});
        connection.execute({});
        return submit.call(query, connection);
      } finally {
        connection.stream.uncork?.();
      }
    };
    this.watchBegin(query, true);
  }

  /**
   * Reads the BEGIN's outcome off `query`'s answers: its CommandComplete comes first (taken off the query's
   * result when it carries the BEGIN); an error before it means the BEGIN did not open the transaction.
   */
  private watchBegin(query: PgQuery, carried: boolean): void {
    let begun = false;
    const { handleCommandComplete, handleError, handleReadyForQuery } = query;
    query.handleCommandComplete = (message: unknown, connection: PgConnection) => {
      if (!begun) {
        begun = true;
        if (carried) return;
      }
      return handleCommandComplete.call(query, message, connection);
    };
    query.handleError = (error: Error, connection: PgConnection) => {
      if (this.state === 'sent') this.settle(begun, error);
      return handleError.call(query, error, connection);
    };
    query.handleReadyForQuery = (connection: PgConnection) => {
      if (this.state === 'sent') this.settle(begun);
      return handleReadyForQuery.call(query, connection);
    };
  }

  private settle(begun: boolean, error?: Error): void {
    if (begun) {
      this.state = 'open';
      this.unhookClient();
      return;
    }
    this.state = 'failed';
    this.failure = error ?? new Error('The transaction of the work did not open.');
  }
}

/** Marks a Query the deferred BEGIN made itself (for a text and values), whose caller gets a promise or a callback. */
const OWN = Symbol('made by the deferred BEGIN');

/** node-postgres's Query class, when the client is node-postgres's JavaScript client (not pg-native). */
function queryClassOf(client: PgClient): QueryClass | undefined {
  const Query = (client.constructor as { Query?: unknown }).Query;
  const connection = (client as { connection?: { parse?: unknown } }).connection;
  return typeof Query === 'function' && typeof connection?.parse === 'function' ? (Query as QueryClass) : undefined;
}
