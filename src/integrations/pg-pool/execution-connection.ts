import { EventEmitter } from 'node:events';
import type pg from 'pg';
import type { DataSource, QueryRunner } from 'typeorm';
import { idempotentPoolMessages as messages } from './messages.js';
import { transactionStatementOf, type IsolationLevel, type TransactionStatement } from './transaction-statements.js';

/** node-postgres's client, as far as the app's statements use it. */
export interface PgConnection {
  query(config: unknown, values?: unknown): Promise<pg.QueryResult>;
  escapeLiteral(value: string): string;
  escapeIdentifier(value: string): string;
}

/** What a statement answered when it was not sent (an isolation level that is already the transaction's). */
const NOTHING_SENT = { command: 'SET', rowCount: null, oid: 0, rows: [], fields: [] } as unknown as pg.QueryResult;

/**
 * The connection of one idempotent execution's transaction, as the app's
 * statements see it: statements go to it as they are, transaction statements
 * are refused, and each client `connect()` lends keeps its transaction as a
 * savepoint of the execution's. Its savepoints nest like the app's
 * transactions would on a pool of one connection.
 */
export class ExecutionConnection {
  /** Savepoints open now, innermost last. */
  readonly open: string[] = [];
  private named = 0;

  private constructor(
    private readonly runner: QueryRunner,
    readonly client: PgConnection,
  ) {}

  private static readonly byRunner = new WeakMap<QueryRunner, Promise<ExecutionConnection>>();

  /** The execution's connection for `runner` (the QueryRunner of its transaction): one per transaction. */
  static of(runner: QueryRunner): Promise<ExecutionConnection> {
    let connection = ExecutionConnection.byRunner.get(runner);
    if (!connection) {
      connection = (async () => new ExecutionConnection(runner, (await runner.connect()) as PgConnection))();
      ExecutionConnection.byRunner.set(runner, connection);
    }
    return connection;
  }

  /** The data source whose transaction this is. */
  get dataSource(): DataSource {
    return this.runner.connection;
  }

  /** A statement through `pool.query()`: as it is, or refused when it is a transaction statement. */
  query(config: unknown, values?: unknown): Promise<pg.QueryResult> {
    this.checkLive();
    if (statementOf(config)) throw new Error(messages.controlOnPool);
    return this.client.query(config, values);
  }

  /** A client for `pool.connect()`: the same connection, its transaction a savepoint of the execution's. */
  lend(): ExecutionClient {
    this.checkLive();
    return new ExecutionClient(this);
  }

  checkLive(): void {
    if (this.runner.isReleased) throw new Error(messages.ended);
  }

  /** A savepoint name no other of this transaction has; never derived from the key or the request. */
  nextSavepoint(): string {
    return `idempotent_app_tx_${++this.named}`;
  }

  /** The isolation level the execution's transaction runs at. */
  async isolation(): Promise<IsolationLevel> {
    const { rows } = await this.client.query("SELECT current_setting('transaction_isolation') AS level");
    return (rows[0] as { level: IsolationLevel }).level;
  }
}

/**
 * What `pool.connect()` answers inside an idempotent execution: the
 * execution's connection, whose `release()` gives nothing back (the module
 * ends that transaction and returns the connection), and on which the app's
 * `BEGIN` / `COMMIT` / `ROLLBACK` are a savepoint's `SAVEPOINT` / `RELEASE
 * SAVEPOINT` / `ROLLBACK TO SAVEPOINT` and `RELEASE SAVEPOINT`. A
 * `SET TRANSACTION ISOLATION LEVEL` (Prisma's, after its BEGIN) that asks for
 * the level the transaction already has is not sent; another level is refused,
 * since a savepoint cannot change it.
 */
export class ExecutionClient extends EventEmitter {
  private savepoint?: string;
  private released = false;

  constructor(private readonly connection: ExecutionConnection) {
    super();
  }

  query(config: unknown, values?: unknown, callback?: (error: Error | null, result?: pg.QueryResult) => void): any {
    if (typeof values === 'function') [values, callback] = [undefined, values as typeof callback];
    const result = this.run(config, values);
    if (!callback) return result;
    result.then(
      (answer) => callback(null, answer),
      (error: Error) => callback(error),
    );
    return undefined;
  }

  /** Gives the client up; a transaction it left open (a COMMIT that failed, or none sent) is rolled back to its savepoint. */
  release(): void {
    if (this.released) return;
    this.released = true;
    if (this.savepoint) void this.undo(this.savepoint).catch(() => undefined);
    this.savepoint = undefined;
  }

  escapeLiteral(value: string): string {
    return this.connection.client.escapeLiteral(value);
  }

  escapeIdentifier(value: string): string {
    return this.connection.client.escapeIdentifier(value);
  }

  private async run(config: unknown, values: unknown): Promise<pg.QueryResult> {
    if (this.released) throw new Error(messages.released);
    this.connection.checkLive();
    const statement = statementOf(config);
    if (!statement) return this.connection.client.query(config, values);
    switch (statement.kind) {
      case 'begin':
        return this.begin(statement);
      case 'set-isolation':
        await this.checkIsolation(statement.isolation);
        return NOTHING_SENT;
      case 'commit':
        return this.end('commit');
      case 'rollback':
        return this.end('rollback');
      default:
        throw new Error(messages.controlRefused);
    }
  }

  private async begin(statement: Extract<TransactionStatement, { kind: 'begin' }>): Promise<pg.QueryResult> {
    if (this.savepoint) throw new Error(messages.beginTwice);
    if (statement.otherModes) throw new Error(messages.controlRefused);
    if (statement.isolation) await this.checkIsolation(statement.isolation);
    const name = this.connection.nextSavepoint();
    this.savepoint = name;
    this.connection.open.push(name);
    return this.connection.client.query(`SAVEPOINT ${name}`);
  }

  /**
   * COMMIT releases the savepoint, ROLLBACK rolls back to it and releases
   * it. Without a transaction open nothing is sent, as PostgreSQL only warns
   * then. A savepoint that is not the innermost open one cannot end alone.
   */
  private async end(how: 'commit' | 'rollback'): Promise<pg.QueryResult> {
    const name = this.savepoint;
    if (!name) return NOTHING_SENT;
    const open = this.connection.open;
    if (open[open.length - 1] !== name) {
      if (!open.includes(name)) this.savepoint = undefined;
      throw new Error(messages.overlapping);
    }
    if (how === 'rollback') {
      this.savepoint = undefined;
      return this.undo(name);
    }
    // A RELEASE that fails (the savepoint's work hit an error) leaves it open: release() rolls back to it.
    const answer = await this.connection.client.query(`RELEASE SAVEPOINT ${name}`);
    open.pop();
    this.savepoint = undefined;
    return answer;
  }

  /** Rolls back to `name` and releases it; the savepoints opened after it are gone with it. */
  private undo(name: string): Promise<pg.QueryResult> {
    const open = this.connection.open;
    const at = open.indexOf(name);
    if (at < 0) return Promise.resolve(NOTHING_SENT);
    open.splice(at);
    // Queued together: no statement of the app's runs between them.
    const back = this.connection.client.query(`ROLLBACK TO SAVEPOINT ${name}`);
    const released = this.connection.client.query(`RELEASE SAVEPOINT ${name}`);
    return Promise.all([back, released]).then(([, answer]) => answer);
  }

  private async checkIsolation(asked: IsolationLevel): Promise<void> {
    const running = await this.connection.isolation();
    if (running !== asked) throw new Error(messages.otherIsolation(asked, running));
  }
}

/** The transaction statement `config` (a text, a query config or a submittable with a text) is, if any. */
function statementOf(config: unknown): TransactionStatement | undefined {
  const text = typeof config === 'string' ? config : (config as { text?: unknown } | null)?.text;
  return typeof text === 'string' ? transactionStatementOf(text) : undefined;
}
