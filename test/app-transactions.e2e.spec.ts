import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { spawn, type ChildProcess } from 'node:child_process';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import type pg from 'pg';
import { IdempotencyConfigurationError, IdempotencyModule, ProblemType } from '../src/index.js';
import { createTables, databaseUrl, freshSchema, sqlClient } from './support/database.js';
import { post, sleep, type RawResponse } from './support/http.js';
import { ADAPTERS, type AdapterName } from './support/test-app.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');

type Manager = 'cls' | 'typeorm-transactional' | 'typeorm-transactional-als';
/** `@nestjs-cls/transactional` with its TypeORM adapter; typeorm-transactional with its default (cls-hooked) and its AsyncLocalStorage driver. */
const MANAGERS: Manager[] = ['cls', 'typeorm-transactional', 'typeorm-transactional-als'];

/** test/support/app-transactions-app.ts as an OS process of its own. */
class AppProcess {
  readonly output: string[] = [];
  url = '';
  private readonly child: ChildProcess;
  private readonly waiting: Array<{ pattern: RegExp; resolve: (line: string | undefined) => void }> = [];
  private stderr = '';
  private readonly closed: Promise<void>;
  private exited = false;

  constructor(env: Record<string, string>) {
    this.child = spawn(process.execPath, ['test/support/run-typescript.mjs', 'test/support/app-transactions-app.ts'], {
      cwd: ROOT,
      // Jest's --experimental-vm-modules is not for the child.
      env: { ...process.env, NODE_OPTIONS: '', DATABASE_URL: databaseUrl(), ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    this.child.stderr!.setEncoding('utf8').on('data', (chunk: string) => (this.stderr += chunk));
    createInterface({ input: this.child.stdout! }).on('line', (line) => {
      this.output.push(line);
      const waiter = this.waiting.find((w) => w.pattern.test(line));
      if (!waiter) return;
      this.waiting.splice(this.waiting.indexOf(waiter), 1);
      waiter.resolve(line);
    });
    this.closed = new Promise((resolve) =>
      this.child.once('close', () => {
        this.exited = true;
        for (const waiter of this.waiting.splice(0)) waiter.resolve(undefined);
        resolve();
      }),
    );
  }

  /** Starts the app and waits until it listens; throws with its output if it does not. */
  static async start(env: Record<string, string>): Promise<AppProcess> {
    const app = new AppProcess(env);
    const line = await app.line(/^(listening \d+|failed )/);
    if (!line?.startsWith('listening')) throw new Error(`the app did not start:\n${app.output.join('\n')}\n${app.stderr}`);
    app.url = `http://127.0.0.1:${line.split(' ')[1]}`;
    return app;
  }

  /** The first line matching `pattern`, printed before or after this call; undefined once the process has exited without it. */
  line(pattern: RegExp): Promise<string | undefined> {
    const seen = this.output.find((line) => pattern.test(line));
    if (seen !== undefined || this.exited) return Promise.resolve(seen);
    return new Promise((resolve) => this.waiting.push({ pattern, resolve }));
  }

  /** Resolves once the process has exited, with its signal. */
  async exit(): Promise<NodeJS.Signals | null> {
    await this.closed;
    return this.child.signalCode;
  }

  async stop(): Promise<void> {
    if (!this.exited) this.child.kill('SIGKILL');
    await this.closed;
  }
}

/** Effect rows the deferred trigger refuses at COMMIT: the app's own (the @Transactional() method's), labelled `refuse-…`. */
async function installCommitJudge(db: pg.Client): Promise<void> {
  await db.query(`CREATE FUNCTION judge_effect() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF NEW.tenant = 'app' AND NEW.label LIKE 'refuse-%' THEN RAISE EXCEPTION 'effect % refused at commit', NEW.id USING ERRCODE = '23514'; END IF;
      RETURN NULL;
    END $$`);
  await db.query(`CREATE CONSTRAINT TRIGGER judge_effect AFTER INSERT ON effects
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION judge_effect()`);
}

/**
 * A.5b: the app's own transaction manager, set up as its docs say, with
 * `transactionManager` in the module's options. Its `@Transactional()`
 * methods (default propagation) in an idempotent handler run in the
 * module's transaction: their writes commit with the key's completion, or
 * not at all. Every check counts the app's rows (tenant `app`), written by
 * the manager's method, beside the rows the module's own `TransactionHost`
 * writes (tenant `module`).
 */
describe.each(MANAGERS)('the app’s own transaction manager: %s', (manager) => {
  describe.each(ADAPTERS)('over %s', (adapter: AdapterName) => {
    let app: AppProcess;
    let db: pg.Client;
    let schema: string;
    let n = 0;
    const fresh = (kind: string) => `${kind}-${manager}-${adapter}-${Date.now()}-${++n}`;
    const env = () => ({ APP_SCHEMA: schema, HTTP_ADAPTER: adapter, TX_MANAGER: manager });
    /** Rows per writer for `label`: `{ app, module }`, what committed. */
    const effects = async (label: string) => {
      const { rows } = await db.query('SELECT tenant, count(*)::int AS n FROM effects WHERE label = $1 GROUP BY tenant', [label]);
      return Object.fromEntries(rows.map((r: { tenant: string; n: number }) => [r.tenant, r.n]));
    };
    const keyRow = async (key: string) =>
      (await db.query('SELECT status FROM idempotency_keys WHERE tenant_id = $1 AND key = $2', ['tenant-a', key])).rows[0] as
        { status: string } | undefined;

    beforeAll(async () => {
      schema = await freshSchema(`app_tx_${manager}_${adapter}`);
      await createTables(schema);
      db = await sqlClient(schema);
      await installCommitJudge(db);
      app = await AppProcess.start(env());
    });
    afterAll(async () => {
      await app?.stop();
      await db?.end();
    });

    it('runs a @Transactional() method in the module’s transaction, committed with the completed key, and replays it', async () => {
      const label = fresh('ok');
      const first = await post(app.url, '/transfers', { label }, `k-${label}`);
      const replay = await post(app.url, '/transfers', { label }, `k-${label}`);

      expect(first.status).toBe(201);
      const body = first.json();
      // The app's method and the module's TransactionHost saw one transaction.
      expect(body.app).toBe(body.module);
      expect(await effects(label)).toEqual({ app: 1, module: 1 });
      expect((await keyRow(`k-${label}`))?.status).toBe('completed');
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(replay.text()).toBe(first.text());
      expect(await effects(label)).toEqual({ app: 1, module: 1 });

      // Outside idempotent handlers nothing changes: the method opens and commits a transaction of its own.
      const plain = await post(app.url, '/plain-transfers', { label: `${label}-plain` }, undefined);
      expect(plain.status).toBe(201);
      expect(plain.json().app).not.toBe(body.app);
      expect(await effects(`${label}-plain`)).toEqual({ app: 1 });
    });

    it('joins @Transactional() methods that call one another', async () => {
      const label = fresh('nested');
      const response = await post(app.url, '/nested-transfers', { label }, `k-${label}`);

      expect(response.status).toBe(201);
      const { app: inner, module } = response.json();
      expect(inner).toEqual([module, module]);
      expect(await effects(label)).toEqual({ app: 2 });
    });

    it('joins each phase’s transaction in a phased handler, and keeps the committed phases when it fails later', async () => {
      const label = fresh('phased');
      const response = await post(app.url, '/phased-transfers', { label }, `k-${label}`);

      expect(response.status).toBe(201);
      const [debit, credit] = response.json().phases;
      expect(debit.app).toBe(debit.module);
      expect(credit.app).toBe(credit.module);
      expect(debit.module).not.toBe(credit.module);
      expect(await effects(label)).toEqual({ app: 2 });
      // typeorm-transactional's hooks follow each phase's transaction.
      if (manager !== 'cls') expect(await app.line(new RegExp(`^hook (commit|rollback) ${label}$`))).toBe(`hook commit ${label}`);

      const failing = fresh('phased-fail');
      expect((await post(app.url, '/phased-transfers', { label: failing, fail: true }, `k-${failing}`)).status).toBe(500);
      // Both phases committed with their recovery points before the handler failed; nothing else.
      expect(await effects(failing)).toEqual({ app: 2 });
    });

    it('joins work run through IdempotencyService.execute (a job or a consumer), and rolls it back when it fails', async () => {
      const label = fresh('job');
      const response = await post(app.url, '/jobs', { label, key: `k-${label}` }, undefined);
      expect(response.status).toBe(201);
      expect(response.json().app).toBe(response.json().module);
      expect(await effects(label)).toEqual({ app: 1 });
      expect((await keyRow(`k-${label}`))?.status).toBe('completed');

      const failing = fresh('job-fail');
      expect((await post(app.url, '/jobs', { label: failing, key: `k-${failing}`, fail: true }, undefined)).status).toBe(500);
      expect(await effects(failing)).toEqual({});
    });

    it('rolls the @Transactional() method’s writes back when the handler fails after it returned', async () => {
      const label = fresh('fail');
      const response = await post(app.url, '/transfers', { label, fail: true }, `k-${label}`);

      expect(response.status).toBe(500);
      expect(await effects(label)).toEqual({});
      // The default onError keeps the key in flight until its lease ends.
      expect((await keyRow(`k-${label}`))?.status).toBe('in_flight');
    });

    it.each([
      ['separate', '/transfers'],
      ['request-transaction', '/transfers-in-tx'],
    ])(
      'answers a COMMIT the database refuses (claim mode %s) with commit-refused: neither the completed key nor any effect',
      async (mode, path) => {
        const label = fresh('refuse');
        const response = await post(app.url, path, { label }, `k-${label}`);

        expect(response.status).toBe(500);
        expect(response.headers['content-type']).toMatch(/^application\/problem\+json/);
        expect(response.json().type).toBe(ProblemType.commitRefused);
        expect(await effects(label)).toEqual({});
        const row = await keyRow(`k-${label}`);
        if (mode === 'separate') expect(row?.status).toBe('in_flight');
        else expect(row).toBeUndefined();
      },
    );

    if (manager === 'cls') {
      it('opens a savepoint in the module’s transaction for Propagation.Nested: rolled back alone, the rest committed with the key', async () => {
        const label = fresh('savepoint');
        const response = await post(app.url, '/savepoint-transfers', { label }, `k-${label}`);

        expect(response.status).toBe(201);
        expect(response.json().app).toBe(response.json().module);
        expect(await effects(label)).toEqual({ app: 1 });
        expect(await effects(`${label}-undone`)).toEqual({});
        expect((await keyRow(`k-${label}`))?.status).toBe('completed');
      });
    }

    if (manager !== 'cls') {
      it('runs runOnTransactionCommit() hooks once the module’s transaction committed, and rollback hooks when the handler fails after the method', async () => {
        const committed = fresh('hooked');
        const failed = fresh('hooked-fail');
        expect((await post(app.url, '/transfers', { label: committed }, `k-${committed}`)).status).toBe(201);
        expect((await post(app.url, '/transfers', { label: failed, fail: true }, `k-${failed}`)).status).toBe(500);

        expect(await app.line(new RegExp(`^hook (commit|rollback) ${committed}$`))).toBe(`hook commit ${committed}`);
        // The method had returned, but the transaction it ran in was the module's, which rolled back.
        expect(await app.line(new RegExp(`^hook (commit|rollback) ${failed}$`))).toBe(`hook rollback ${failed}`);
      });
    }

    it('loses the @Transactional() method’s writes with the process killed between the handler and the COMMIT; a retry runs once', async () => {
      const label = fresh('crash');
      const key = `k-${label}`;
      const dying = app;
      const lost = await post(dying.url, '/crashing-transfers', { label }, key).catch((error: Error) => error);
      expect(await dying.exit()).toBe('SIGKILL');
      // The answer never came: the connection died with the process.
      expect(lost).toHaveProperty('code', 'ECONNRESET');

      // What the crash left: the claim in flight, and none of the handler's writes.
      expect(await effects(label)).toEqual({});
      expect((await keyRow(key))?.status).toBe('in_flight');

      // The same app, started again, whose crashing route no longer crashes.
      app = await AppProcess.start({ ...env(), CRASH: '0' });
      // The crashed attempt's lease (1 s) must end before a retry takes the key over.
      let retry: RawResponse = await post(app.url, '/crashing-transfers', { label }, key);
      for (let i = 0; i < 100 && retry.status === 409; i++) {
        await sleep(250);
        retry = await post(app.url, '/crashing-transfers', { label }, key);
      }
      const replay = await post(app.url, '/crashing-transfers', { label }, key);

      expect(retry.status).toBe(201);
      expect(retry.json().app).toBe(retry.json().module);
      expect(await effects(label)).toEqual({ app: 1, module: 1 });
      expect((await keyRow(key))?.status).toBe('completed');
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(await effects(label)).toEqual({ app: 1, module: 1 });
    });
  });
});

describe.each([
  ['cls', /^failed IdempotencyConfigurationError: clsTransactional\(\): the TransactionHost does not manage the data source/],
  [
    'typeorm-transactional',
    /^failed IdempotencyConfigurationError: typeormTransactional\(\): no data source named "default" was registered/,
  ],
])('start-up with %s set up wrong', (manager, message) => {
  it('stops the app with a message that says how to fix it', async () => {
    const schema = await freshSchema(`app_tx_misconfigured_${manager}`);
    await createTables(schema);
    const app = new AppProcess({ APP_SCHEMA: schema, HTTP_ADAPTER: 'express', TX_MANAGER: manager, MISCONFIGURE: '1' });
    const line = await app.line(/^(listening \d+|failed )/);
    await app.stop();
    expect(line).toMatch(message);
  });
});

it('refuses a transactionManager that is not one', () => {
  const forRoot = (transactionManager: unknown) =>
    IdempotencyModule.forRoot({ tenant: () => 't', transactionManager: transactionManager as never });
  expect(() => forRoot({})).toThrow(IdempotencyConfigurationError);
  expect(() => forRoot(() => undefined)).toThrow(/clsTransactional\(\) \(nest-idempotency-pg\/cls-transactional\)/);
});
