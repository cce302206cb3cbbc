import { EventEmitter } from 'node:events';
import type pg from 'pg';
import type { SourceDataSource, SourceQueryRunner } from '../../store/connection.js';
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
 * are refused, and a client `connect()` lends keeps its transaction as a
 * savepoint of the execution's. One such transaction is open at a time: a
 * second one beside it would share its savepoint, and its COMMIT would be
 * undone by the first one's ROLLBACK, which a pool of many connections never
 * does.
 */
export class ExecutionConnection {
  /** The lent client whose transaction is open, if any. */
  holder?: ExecutionClient;
  private named = 0;

  private constructor(
    private readonly runner: SourceQueryRunner,
    readonly client: PgConnection,
  ) {}

  private static readonly byRunner = new WeakMap<SourceQueryRunner, Promise<ExecutionConnection>>();

  /** The execution's connection for `runner` (the QueryRunner of its transaction): one per transaction. */
  static of(runner: SourceQueryRunner): Promise<ExecutionConnection> {
    let connection = ExecutionConnection.byRunner.get(runner);
    if (!connection) {
      // A released runner's connect() would take a new connection from the module's pool, and nothing would give it back.
      if (runner.isReleased) return Promise.reject(new Error(messages.ended));
      connection = (async () => new ExecutionConnection(runner, (await runner.connect()) as PgConnection))();
      ExecutionConnection.byRunner.set(runner, connection);
    }
    return connection;
  }

  /** The data source whose transaction this is. */
  get dataSource(): SourceDataSource {
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

  /** False once the execution's transaction has ended and its connection went back to the module's pool. */
  get live(): boolean {
    return !this.runner.isReleased;
  }

  checkLive(): void {
    if (!this.live) throw new Error(messages.ended);
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
    // After the execution's transaction ended, its connection is someone else's: nothing is sent there.
    if (this.savepoint && this.connection.live) void this.undo().catch(() => undefined);
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
        return this.commit();
      case 'rollback':
        return this.savepoint ? this.undo() : NOTHING_SENT;
      default:
        throw new Error(messages.controlRefused);
    }
  }

  private async begin(statement: Extract<TransactionStatement, { kind: 'begin' }>): Promise<pg.QueryResult> {
    if (this.savepoint) throw new Error(messages.beginTwice);
    if (statement.otherModes) throw new Error(messages.controlRefused);
    if (this.connection.holder) throw new Error(messages.overlapping);
    this.connection.holder = this;
    try {
      if (statement.isolation) await this.checkIsolation(statement.isolation);
    } catch (error) {
      this.connection.holder = undefined;
      throw error;
    }
    this.savepoint = this.connection.nextSavepoint();
    return this.connection.client.query(`SAVEPOINT ${this.savepoint}`);
  }

  /**
   * Releases the savepoint: its writes are the key's transaction's now. One
   * that fails (the savepoint's work hit an error) leaves it open, and
   * `release()` rolls back to it. Without a transaction open nothing is sent,
   * as PostgreSQL only warns then.
   */
  private async commit(): Promise<pg.QueryResult> {
    if (!this.savepoint) return NOTHING_SENT;
    const answer = await this.connection.client.query(`RELEASE SAVEPOINT ${this.savepoint}`);
    this.ended();
    return answer;
  }

  /** Rolls back to the savepoint and releases it, queued together so that no other statement runs between them. */
  private undo(): Promise<pg.QueryResult> {
    const name = this.savepoint;
    this.ended();
    const back = this.connection.client.query(`ROLLBACK TO SAVEPOINT ${name}`);
    const released = this.connection.client.query(`RELEASE SAVEPOINT ${name}`);
    return Promise.all([back, released]).then(([, answer]) => answer);
  }

  private ended(): void {
    this.savepoint = undefined;
    if (this.connection.holder === this) this.connection.holder = undefined;
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
