import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { spawn, type ChildProcess } from 'node:child_process';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import type pg from 'pg';
import { createTables, databaseUrl, freshSchema, installCommitJudge, sqlClient } from './support/database.js';
import { post, sleep, type RawResponse } from './support/http.js';
import { ADAPTERS, type AdapterName } from './support/test-app.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');

/** test/support/prisma-cls-app.ts as an OS process of its own; resolves once it listens. */
async function startApp(env: Record<string, string>): Promise<{ url: string; child: ChildProcess; output: string[] }> {
  const child = spawn(process.execPath, ['test/support/run-typescript.mjs', 'test/support/prisma-cls-app.ts'], {
    cwd: ROOT,
    // Jest's --experimental-vm-modules is not for the child.
    env: { ...process.env, NODE_OPTIONS: '', DATABASE_URL: databaseUrl(), ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const output: string[] = [];
  child.stderr!.setEncoding('utf8').on('data', (chunk: string) => output.push(chunk));
  const line = await new Promise<string | undefined>((resolve) => {
    createInterface({ input: child.stdout! }).on('line', (text) => {
      output.push(text);
      if (/^(listening \d+|failed )/.test(text)) resolve(text);
    });
    child.once('close', () => resolve(undefined));
  });
  if (!line?.startsWith('listening')) throw new Error(`the app did not start:\n${output.join('\n')}`);
  return { url: `http://127.0.0.1:${line.split(' ')[1]}`, child, output };
}

/**
 * Issue 29 (f): `@nestjs-cls/transactional` with its Prisma adapter
 * (`@nestjs-cls/transactional-adapter-prisma` 1.4), on a PrismaClient over
 * `idempotentPool`, the module not told about the manager: a `@Transactional()`
 * method in an idempotent handler runs as a savepoint of the key's transaction.
 */
describe.each(ADAPTERS)(
  '@nestjs-cls/transactional with its Prisma adapter on idempotentPool, over %s',
  (adapter: AdapterName) => {
    let app: { url: string; child: ChildProcess };
    let schema: string;
    let db: pg.Client;
    let n = 0;
    const fresh = (kind: string) => `${kind}-${adapter}-${Date.now()}-${++n}`;
    /** Committed rows per writer (`app`: the @Transactional() method through Prisma, `module`: the module's TransactionHost). */
    const effects = async (label: string) => {
      const { rows } = await db.query('SELECT tenant, count(*)::int AS n FROM effects WHERE label = $1 GROUP BY tenant', [label]);
      return Object.fromEntries(rows.map((r: { tenant: string; n: number }) => [r.tenant, r.n]));
    };
    const keyStatus = async (key: string) =>
      (
        (await db.query('SELECT status FROM idempotency_keys WHERE tenant_id = $1 AND key = $2', ['tenant-a', key])).rows[0] as
          { status: string } | undefined
      )?.status;

    beforeAll(async () => {
      schema = await freshSchema(`prisma_cls_${adapter}`);
      await createTables(schema);
      db = await sqlClient(schema);
      // A COMMIT the database refuses: the module's own row (written after the method returned) of a label listed here.
      // Had the method committed a transaction of its own, its row would stay.
      await installCommitJudge(db, 'module');
      app = await startApp({ APP_SCHEMA: schema, HTTP_ADAPTER: adapter });
    });
    afterAll(async () => {
      if (app && app.child.exitCode === null) {
        const closed = new Promise((resolve) => app.child.once('close', resolve));
        app.child.kill('SIGKILL');
        await closed;
      }
      await db?.end();
    });

    it('runs a @Transactional() method in the key’s transaction, committed with its completion, and replays it', async () => {
      const label = fresh('ok');
      const first = await post(app.url, '/transfers', { label }, `k-${label}`);
      const replay = await post(app.url, '/transfers', { label }, `k-${label}`);

      expect(first.status).toBe(201);
      expect(first.json().app).toBe(first.json().module);
      expect(await effects(label)).toEqual({ app: 1, module: 1 });
      expect(await keyStatus(`k-${label}`)).toBe('completed');
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(await effects(label)).toEqual({ app: 1, module: 1 });
    });

    it('rolls the method’s writes back with a handler that fails after it returned; the retry writes once', async () => {
      const label = fresh('fail');
      expect((await post(app.url, '/transfers', { label, fail: true }, `k-${label}`)).status).toBe(500);
      expect(await effects(label)).toEqual({});
      expect(await keyStatus(`k-${label}`)).toBeUndefined();

      expect((await post(app.url, '/transfers', { label }, `k-${label}`)).status).toBe(201);
      expect(await effects(label)).toEqual({ app: 1, module: 1 });
    });

    it('leaves neither the completion nor the method’s writes when the database refuses the COMMIT; the retry writes once', async () => {
      const label = fresh('refuse');
      await db.query('INSERT INTO refused_labels (label) VALUES ($1)', [label]);
      expect((await post(app.url, '/transfers', { label }, `k-${label}`)).status).toBe(500);
      expect(await effects(label)).toEqual({});
      expect(await keyStatus(`k-${label}`)).toBeUndefined();

      await db.query('DELETE FROM refused_labels WHERE label = $1', [label]);
      expect((await post(app.url, '/transfers', { label }, `k-${label}`)).status).toBe(201);
      expect(await effects(label)).toEqual({ app: 1, module: 1 });
    });

    it('loses the Prisma writes with the process killed between the handler and the COMMIT; a retry after the lease writes once', async () => {
      const label = fresh('crash');
      const key = `k-${label}`;
      const dying = app;
      const exited = new Promise<NodeJS.Signals | null>((resolve) =>
        dying.child.once('close', (_code, signal) => resolve(signal)),
      );
      const lost = await post(dying.url, '/crashing-transfers', { label }, key).catch((error: Error) => error);
      expect(await exited).toBe('SIGKILL');
      // The answer never came: the connection died with the process.
      expect(lost).toHaveProperty('code', 'ECONNRESET');
      expect(await effects(label)).toEqual({});
      expect(await keyStatus(key)).toBe('in_flight');

      // The same app again, whose crashing route no longer crashes; the crashed attempt's lease (1 s) must run out.
      app = await startApp({ APP_SCHEMA: schema, HTTP_ADAPTER: adapter, CRASH: '0' });
      let retry: RawResponse = await post(app.url, '/crashing-transfers', { label }, key);
      for (let i = 0; i < 100 && retry.status === 409; i++) {
        await sleep(250);
        retry = await post(app.url, '/crashing-transfers', { label }, key);
      }
      expect(retry.status).toBe(201);
      expect(retry.json().app).toBe(retry.json().module);
      expect(await effects(label)).toEqual({ app: 1, module: 1 });
      expect(await keyStatus(key)).toBe('completed');
      expect((await post(app.url, '/crashing-transfers', { label }, key)).headers['idempotent-replayed']).toBe('true');
      expect(await effects(label)).toEqual({ app: 1, module: 1 });
    });

    it('undoes only a Nested block that throws, and commits the rest with the key', async () => {
      const label = fresh('nested');
      const answer = await post(app.url, '/transfers', { label, nested: true }, `k-${label}`);

      expect(answer.status).toBe(201);
      expect(answer.json().app).toBe(answer.json().module);
      expect(await effects(label)).toEqual({ app: 1, module: 1 });
      expect(await effects(`${label}-undone`)).toEqual({});
    });
  },
);
