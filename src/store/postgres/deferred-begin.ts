import type { SourceDataSource, SourceQueryRunner } from '../connection.js';
import type { PipelinedStatement } from './pipeline-types.js';
import type { PgClient } from './pools.js';
import { sendAfterBegin, sendBeginAlone } from './deferred-begin-alone.js';
import { OWN, queryClassOf, queryOf } from './node-postgres-query.js';
import type { PgConnection, PgQuery } from './node-postgres-types.js';

/**
 * The work's `START TRANSACTION` of a separate claim, sent with the work's first statement in the same batch (no
 * Sync between), so a failed BEGIN makes PostgreSQL skip the statement: it never runs outside its transaction. Why
 * and how: docs/design.md#the-deferred-begin.
 */
export class DeferredBegin {
  /** armed: nothing sent; sent: the first statement carries it; open / failed: its answer. */
  private state: 'armed' | 'sent' | 'open' | 'failed' = 'armed';
  /** Why the BEGIN did not open the transaction, once it failed. */
  failure?: Error;
  private announced = false;
  private readonly runnerQuery: SourceQueryRunner['query'];
  private readonly clientQuery: PgClient['query'];

  private constructor(
    private readonly runner: SourceQueryRunner,
    private readonly client: PgClient,
    readonly statement: string,
    private readonly source: SourceDataSource,
  ) {
    this.runnerQuery = Object.getPrototypeOf(runner).query as SourceQueryRunner['query'];
    this.clientQuery = Object.getPrototypeOf(client).query as PgClient['query'];
  }

  /** Defers `statement` to `client`'s first statement, an `afterTransactionStart` subscriber's included. */
  static arm(runner: SourceQueryRunner, client: PgClient, statement: string, source: SourceDataSource): DeferredBegin {
    const begin = new DeferredBegin(runner, client, statement, source);
    begin.hookClient();
    return begin;
  }

  /** The BEGIN answered, went out with the completion, or was dropped by a ROLLBACK before any statement. */
  get opened(): boolean {
    return this.state === 'open';
  }

  /** The BEGIN for the completion's message when the work sent no statement (failing, the completion commits alone). */
  take(): PipelinedStatement | undefined {
    if (this.state !== 'armed') return undefined;
    this.state = 'open';
    this.announced = true;
    this.unhookRunner();
    this.unhookClient();
    return { text: this.statement };
  }

  /** Logs the BEGIN once, before the statement that carries it, as TypeORM logs a statement before sending it. */
  private announce(): void {
    if (this.announced) return;
    this.announced = true;
    this.source.logger.logQuery(this.statement, undefined, this.runner);
  }

  /** TypeORM's side: a ROLLBACK before any statement sends nothing (TypeORM still tells its subscribers). */
  watchRunner(): void {
    if (this.state !== 'armed') return;
    const own = this.runner as SourceQueryRunner & { query: SourceQueryRunner['query'] };
    own.query = ((sql: string, ...rest: unknown[]) => {
      this.unhookRunner();
      if (this.state === 'armed' && sql === 'ROLLBACK' && !this.runner.isReleased) {
        this.state = 'open';
        this.unhookClient();
        return Promise.resolve([]);
      }
      if (this.state === 'armed') this.announce();
      return (this.runnerQuery as (...args: unknown[]) => Promise<unknown>).call(this.runner, sql, ...rest);
    }) as SourceQueryRunner['query'];
  }

  private unhookRunner(): void {
    // Assigned back, never deleted (see typeorm-transaction-hook.ts).
    (this.runner as SourceQueryRunner & { query: SourceQueryRunner['query'] }).query = this.runnerQuery;
  }

  /** node-postgres's side: every statement on the connection, whoever sends it (TypeORM, or the app on the raw client). */
  private hookClient(): void {
    const original = this.clientQuery as (...args: unknown[]) => unknown;
    (this.client as { query: unknown }).query = (config: unknown, values?: unknown, callback?: unknown) => {
      // Back in its pool (the attempt ended), or the transaction open: as it was. The ROLLBACK after a failed BEGIN
      // goes to the server too (it tells a dead connection apart).
      if (this.runner.isReleased || this.state === 'open' || (this.state === 'failed' && config === 'ROLLBACK')) {
        this.unhookClient();
        return original.call(this.client, config, values, callback);
      }
      if (this.state === 'armed') {
        this.state = 'sent';
        this.announce();
        return this.sendFirst(config, values, callback);
      }
      return sendAfterBegin(this, queryClassOf(this.client)!, config, values, callback);
    };
  }

  private unhookClient(): void {
    (this.client as { query: unknown }).query = this.clientQuery;
  }

  /** The first statement, carrying the BEGIN. */
  private sendFirst(config: unknown, values: unknown, callback: unknown): unknown {
    const Query = queryClassOf(this.client)!;
    const [query, result] = queryOf(Query, config, values, callback);
    const connection = (this.client as unknown as { connection: PgConnection }).connection;
    // Not a cursor or a stream, nor a named statement not yet parsed: see sendBeginAlone.
    const carries = query instanceof Query && !(query.name && !query.hasBeenParsed(connection));
    if (carries) this.carryBegin(query);
    else sendBeginAlone(this, Query, query);
    return this.send(query, values, callback) ?? result;
  }

  /** Hands `query` to node-postgres; for a submittable the caller passed, what node-postgres returns for it. */
  send(query: PgQuery, values: unknown, callback: unknown): unknown {
    const own = (query as { [OWN]?: boolean })[OWN];
    const sent = (this.clientQuery as (...args: unknown[]) => unknown).call(
      this.client,
      query,
      own ? undefined : values,
      own ? undefined : callback,
    );
    return own ? undefined : sent;
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

  /** Reads the BEGIN's outcome off `query`'s answers: its CommandComplete comes first; an error before it, it failed. */
  watchBegin(query: PgQuery, carried: boolean): void {
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
