import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type pg from 'pg';
import {
  EventSubscriber,
  type DataSource,
  type EntitySubscriberInterface,
  type QueryRunner,
  type TransactionStartEvent,
} from 'typeorm';
import { IdempotencyEngine } from '../src/core/idempotency-engine.js';
import { DeferredBegin } from '../src/store/postgres/deferred-begin.js';
import type { PgClient } from '../src/store/postgres/pools.js';
import { PostgresIdempotencyStore } from '../src/store/postgres/postgres-idempotency.store.js';
import { createTables, dataSourceOptions, freshSchema, openDataSource, sqlClient } from './support/database.js';

/** node-postgres's transaction status of the connection, from the server's last ReadyForQuery. */
const txStatus = (client: PgClient) => (client as unknown as { _txStatus: string })._txStatus;

/**
 * The deferred BEGIN on a real connection: the work's statement never runs
 * outside its transaction, whatever form it takes, and a BEGIN that fails
 * takes the statement (and every statement behind it) down with it.
 */
describe('the deferred BEGIN', () => {
  let source: DataSource;
  let db: pg.Client;
  let n = 0;
  const label = () => `deferred-${Date.now()}-${++n}`;
  const effects = async (value: string) =>
    Number((await db.query('SELECT count(*) FROM effects WHERE label = $1', [value])).rows[0].count);
  /** A runner holding a connection, its BEGIN deferred as the store defers it. */
  const armed = async (statement = 'START TRANSACTION') => {
    const runner = source.createQueryRunner();
    const client = (await runner.connect()) as PgClient;
    const begin = DeferredBegin.arm(runner, client, statement, source);
    begin.watchRunner();
    return { runner, client, begin };
  };
  const release = async (runner: QueryRunner) => {
    if (!runner.isReleased) await runner.release();
  };

  beforeAll(async () => {
    const schema = await freshSchema('deferred_begin');
    await createTables(schema);
    source = await openDataSource(dataSourceOptions(schema, { poolSize: 1 }));
    db = await sqlClient(schema);
  });
  afterAll(async () => {
    await source?.destroy();
    await db?.end();
  });

  it('opens the transaction with the first parameterised statement, in one batch', async () => {
    const value = label();
    const { runner, client, begin } = await armed();
    expect(txStatus(client)).toBe('I');
    await runner.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', ['t', value]);
    expect(begin.opened).toBe(true);
    expect(txStatus(client)).toBe('T');
    expect(await effects(value)).toBe(0);
    await client.query('ROLLBACK');
    expect(await effects(value)).toBe(0);
    await release(runner);
  });

  it('opens it with a statement without parameters (one simple-protocol message), whose result is its own', async () => {
    const { runner, client } = await armed();
    const rows = await runner.query(`SELECT 'only' AS result`);
    expect(rows).toEqual([{ result: 'only' }]);
    expect(txStatus(client)).toBe('T');
    await client.query('ROLLBACK');
    await release(runner);
  });

  it.each([
    ['fails to parse', 'START TRANSACTION ISOLATION LEVEL NONSENSE'],
    ['fails as it runs', 'SELECT 1 / 0'],
  ])('a BEGIN that %s: the parameterised statement it carried never runs', async (_how, statement) => {
    const value = label();
    const { runner, client, begin } = await armed(statement);
    await expect(runner.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', ['t', value])).rejects.toThrow();
    expect(begin.opened).toBe(false);
    expect(txStatus(client)).toBe('I');
    expect(await effects(value)).toBe(0);
    // Every later statement fails too, as in an aborted transaction: none runs outside one.
    await expect(runner.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', ['t', value])).rejects.toThrow();
    await expect(runner.query(`INSERT INTO effects (tenant, label) VALUES ('t', '${value}')`)).rejects.toThrow();
    expect(await effects(value)).toBe(0);
    await release(runner);
  });

  it('a BEGIN that fails under a statement without parameters: that statement never runs', async () => {
    const value = label();
    const { runner, client } = await armed('SELECT 1 / 0');
    await expect(runner.query(`INSERT INTO effects (tenant, label) VALUES ('t', '${value}')`)).rejects.toThrow(
      /division by zero/,
    );
    expect(txStatus(client)).toBe('I');
    expect(await effects(value)).toBe(0);
    await release(runner);
  });

  it('statements sent together before the first answers: all inside the transaction, or none run', async () => {
    const ok = label();
    const good = await armed();
    await Promise.all(
      [1, 2, 3].map((i) => good.runner.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', [`t${i}`, ok])),
    );
    expect(txStatus(good.client)).toBe('T');
    await good.client.query('ROLLBACK');
    expect(await effects(ok)).toBe(0);
    await release(good.runner);

    const value = label();
    const bad = await armed('SELECT 1 / 0');
    const sent = await Promise.allSettled(
      [1, 2, 3].map((i) => bad.runner.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', [`t${i}`, value])),
    );
    expect(sent.map((result) => result.status)).toEqual(['rejected', 'rejected', 'rejected']);
    expect(await effects(value)).toBe(0);
    await release(bad.runner);
  });

  it('a named prepared statement not yet parsed gets the BEGIN awaited ahead of it, then runs in its transaction', async () => {
    const value = label();
    const { runner, client } = await armed();
    const name = `deferred_insert_${n}`;
    await (client as unknown as pg.Client).query({
      name,
      text: 'INSERT INTO effects (tenant, label) VALUES ($1, $2)',
      values: ['t', value],
    });
    expect(txStatus(client)).toBe('T');
    await client.query('ROLLBACK');
    expect(await effects(value)).toBe(0);
    // Parsed once, under its own name: it runs again on this connection.
    await (client as unknown as pg.Client).query({
      name,
      text: 'INSERT INTO effects (tenant, label) VALUES ($1, $2)',
      values: ['t', value],
    });
    expect(await effects(value)).toBe(1);
    await release(runner);
  });

  it('a BEGIN awaited ahead of a named statement that fails: the statement is never sent', async () => {
    const value = label();
    const { runner, client } = await armed('SELECT 1 / 0');
    const named = {
      name: `deferred_failed_${n}`,
      text: 'INSERT INTO effects (tenant, label) VALUES ($1, $2)',
      values: ['t', value],
    };
    await expect((client as unknown as pg.Client).query(named)).rejects.toThrow(/division by zero/);
    expect(txStatus(client)).toBe('I');
    expect(await effects(value)).toBe(0);
    await release(runner);
  });

  it('a ROLLBACK before any statement sends nothing; a connection given back unused is lent on as it was', async () => {
    const { runner, client, begin } = await armed();
    // As after TypeORM's startTransaction(), whose statement the store defers.
    (runner as unknown as { isTransactionActive: boolean; transactionDepth: number }).isTransactionActive = true;
    (runner as unknown as { transactionDepth: number }).transactionDepth = 1;
    const stream = (client as unknown as { connection: { stream: { write: (...args: unknown[]) => boolean } } }).connection
      .stream;
    const write = stream.write;
    let writes = 0;
    stream.write = function (this: unknown, ...args: unknown[]) {
      writes++;
      return write.apply(this, args);
    };
    try {
      await runner.rollbackTransaction();
    } finally {
      stream.write = write;
    }
    expect(writes).toBe(0);
    expect(runner.isTransactionActive).toBe(false);
    expect(begin.opened).toBe(true);
    await release(runner);

    // Armed and given back without a statement (an attempt aborted): the pool's next borrower sends plain statements.
    const again = await armed();
    await release(again.runner);
    const next = source.createQueryRunner();
    const lent = (await next.connect()) as PgClient;
    expect(lent).toBe(again.client);
    await next.query('SELECT 1');
    expect(txStatus(lent)).toBe('I');
    await release(next);
  });
});

/** The app's TypeORM subscribers see the work's transaction as TypeORM's own; a replay shows them none. */
describe('TypeORM subscribers with the deferred BEGIN', () => {
  const events: string[] = [];
  @EventSubscriber()
  class Watcher implements EntitySubscriberInterface {
    beforeTransactionStart(): void {
      events.push('beforeStart');
    }
    async afterTransactionStart(event: TransactionStartEvent): Promise<void> {
      events.push('afterStart');
      // A statement of the subscriber's: it carries the BEGIN, so it runs inside the work's transaction.
      await event.queryRunner.query(`SELECT set_config('app.subscriber', 'seen', true)`);
    }
    beforeTransactionCommit(): void {
      events.push('beforeCommit');
    }
    afterTransactionCommit(): void {
      events.push('afterCommit');
    }
    beforeTransactionRollback(): void {
      events.push('beforeRollback');
    }
    afterTransactionRollback(): void {
      events.push('afterRollback');
    }
  }
  let source: DataSource;
  let engine: IdempotencyEngine<import('typeorm').EntityManager>;

  beforeAll(async () => {
    const schema = await freshSchema('deferred_subscribers');
    await createTables(schema);
    source = await openDataSource({ ...dataSourceOptions(schema), subscribers: [Watcher] } as never);
    engine = new IdempotencyEngine(new PostgresIdempotencyStore(source, 'idempotency_keys'));
  });
  afterAll(async () => {
    await source?.destroy();
  });

  const work = (key: string, run: (tx: import('typeorm').EntityManager) => Promise<string>) => ({
    tenant: 't',
    key,
    fingerprint: 'same',
    leaseMs: 30_000,
    ttlMs: 60_000,
    claimMode: 'separate' as const,
    heartbeat: false,
    onFailure: () => ({ action: 'release' as const }),
    run: async (tx: import('typeorm').EntityManager) => {
      const result = await run(tx);
      return { response: { status: 201, headers: [], body: Buffer.from(result) }, result };
    },
  });

  it('a new key: start and commit, as with TypeORM alone; the subscriber statement runs in the transaction', async () => {
    events.length = 0;
    const outcome = await engine.execute(
      work('sub-1', async (tx) => {
        // Set with `is_local`: seen only inside the transaction the subscriber's statement ran in.
        const [row] = (await tx.query(`SELECT current_setting('app.subscriber', true) AS seen`)) as Array<{ seen: string }>;
        return row.seen;
      }),
    );
    expect(outcome).toMatchObject({ kind: 'executed' });
    expect((outcome as { response: { body: Buffer } }).response.body.toString()).toBe('seen');
    expect(events).toEqual(['beforeStart', 'afterStart', 'beforeCommit', 'afterCommit']);
  });

  it('a replay: no transaction, so no transaction events at all', async () => {
    events.length = 0;
    await expect(engine.execute(work('sub-1', async () => 'again'))).resolves.toMatchObject({ kind: 'replayed' });
    await new Promise((r) => setTimeout(r, 100));
    expect(events).toEqual([]);
  });

  it("a handler hung past maxHold loses its key: its late write rolls back with its fenced completion, the retry's commits once", async () => {
    const other = new IdempotencyEngine(new PostgresIdempotencyStore(source, 'idempotency_keys'));
    const key = 'sub-hung';
    let lateWrite: unknown;
    const hung = engine.execute({
      ...work(key, async (tx) => {
        await new Promise((r) => setTimeout(r, 1_500));
        lateWrite = await tx
          .query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', ['t', key])
          .catch((error: unknown) => error);
        return 'late';
      }),
      leaseMs: 300,
      maxHoldMs: 600,
      heartbeat: true,
    });
    hung.catch(() => undefined);
    await new Promise((r) => setTimeout(r, 1_000));
    const retry = await other.execute({
      ...work(key, async (tx) => {
        await tx.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', ['t', key]);
        return 'retry';
      }),
      leaseMs: 300,
    });
    expect(retry).toMatchObject({ kind: 'executed' });
    await expect(hung).rejects.toMatchObject({ name: 'LeaseLostError' });
    // It ran in the hung attempt's own transaction, which its refused completion rolled back.
    expect(Array.isArray(lateWrite)).toBe(true);
    const [{ count }] = (await source.query('SELECT count(*)::int AS count FROM effects WHERE label = $1', [key])) as Array<{
      count: number;
    }>;
    expect(count).toBe(1);
  });

  it('a failure before any statement: start and rollback, as with TypeORM alone', async () => {
    events.length = 0;
    const failing = engine.execute(
      work('sub-2', async () => {
        throw new Error('refused before any statement');
      }),
    );
    await expect(failing).rejects.toThrow('refused before any statement');
    // The subscriber's own statement opened the transaction; its rollback is an ordinary one.
    expect(events).toEqual(['beforeStart', 'afterStart', 'beforeRollback', 'afterRollback']);
  });
});
