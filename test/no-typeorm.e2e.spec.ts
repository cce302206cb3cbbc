import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type pg from 'pg';
import { ProblemType } from '../src/index.js';
import { AppProcess } from './support/app-process.js';
import { freshSchema, installCommitJudge, sqlClient } from './support/database.js';
import { post, send, sleep } from './support/http.js';
import { ADAPTERS, type AdapterName } from './support/test-app.js';

const ORMS = ['prisma', 'drizzle'] as const;
const CASES = ORMS.flatMap((orm) => ADAPTERS.map((adapter) => [orm, adapter] as const));
/** The same handler in each claim mode. */
const MODES = [
  ['separate', '/transfers'],
  ['request-transaction', '/transfers-in-tx'],
] as const;

/**
 * Issue 29: an app without TypeORM (test/support/no-typeorm-app.ts, set up as
 * docs/transactions.md shows for Prisma and for Drizzle), in a process where
 * TypeORM's packages cannot be found (test/support/without-typeorm.mjs): the
 * module runs on the app's pg pool and creates its key table itself.
 */
describe.each(CASES)('an app on %s without TypeORM, over %s', (orm: (typeof ORMS)[number], adapter: AdapterName) => {
  let apps: AppProcess[] = [];
  let app: AppProcess;
  let db: pg.Client;
  let env: Record<string, string>;
  let n = 0;
  const fresh = (kind: string) => `${kind}-${orm}-${adapter}-${Date.now()}-${++n}`;
  const effects = async (label: string) =>
    (await db.query<{ n: number }>('SELECT count(*)::int AS n FROM effects WHERE label = $1', [label])).rows[0].n;
  const keyRows = async (key: string) =>
    (
      await db.query<{ status: string }>('SELECT status FROM idempotency_keys WHERE tenant_id = $1 AND key = $2', [
        'tenant-a',
        key,
      ])
    ).rows;

  beforeAll(async () => {
    const schema = await freshSchema(`no_typeorm_${orm}_${adapter}`);
    db = await sqlClient(schema);
    // The app's own table; the module's key table is left for the module to create.
    await db.query(`CREATE TABLE effects (
      id bigserial PRIMARY KEY, tenant text NOT NULL, label text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`);
    // Effects whose label is listed are refused at COMMIT (a deferred constraint trigger), until taken off the list.
    await installCommitJudge(db);
    env = {
      APP_SCHEMA: schema,
      CRASH: '0',
      ORM: orm,
      HTTP_ADAPTER: adapter,
      NODE_OPTIONS: '--import ./test/support/without-typeorm.mjs',
    };
    // Two instances starting together on the empty schema: both migrate at start-up.
    apps = await Promise.all([
      AppProcess.start('test/support/no-typeorm-app.ts', env),
      AppProcess.start('test/support/no-typeorm-app.ts', env),
    ]);
    app = apps[0];
  });
  afterAll(async () => {
    await Promise.all(apps.map((instance) => instance.stop()));
    await db?.end();
  });

  it('creates the key table at start-up, the migration applied once by the two instances that started together', async () => {
    const { rows } = await db.query<{ found: boolean }>(`SELECT to_regclass('idempotency_keys') IS NOT NULL AS found`);
    expect(rows[0].found).toBe(true);
    const applied = await db.query<{ name: string }>('SELECT name FROM nest_idempotency_migrations');
    expect(applied.rows.map((row) => row.name).sort()).toEqual(
      ['CreateEffectLedger1764806400000', 'CreateIdempotencyKeys1764460800000'].sort(),
    );
  });

  it('never imports nor loads typeorm, @nestjs/typeorm, typeorm-transactional or the cls TypeORM adapter', async () => {
    for (const instance of apps) {
      const answer = await send(instance.url, 'GET', '/typeorm', { headers: [] });
      expect(answer.json()).toEqual({ attempts: [], loaded: [] });
    }
  });

  it.each(MODES)(
    'runs concurrent duplicates once (claim mode %s): one effect, one key row, every success the same bytes',
    async (_mode, path) => {
      const label = fresh('storm');
      const key = `k-${label}`;
      const answers = await Promise.all(
        Array.from({ length: 8 }, (_, i) => post(apps[i % 2].url, path, { label, waitMs: 150 }, key)),
      );

      expect(await effects(label)).toBe(1);
      expect(await keyRows(key)).toEqual([{ status: 'completed' }]);
      const succeeded = answers.filter((answer) => answer.status === 201);
      expect(succeeded.length).toBeGreaterThanOrEqual(1);
      for (const answer of succeeded) expect(answer.body.equals(succeeded[0].body)).toBe(true);
      // The others were told the key is in flight, never run a second time.
      for (const answer of answers.filter((a) => a.status !== 201)) expect(answer.status).toBe(409);
    },
  );

  it('replays the first answer byte for byte', async () => {
    const label = fresh('replay');
    const first = await post(app.url, '/transfers', { label }, `k-${label}`);
    const replay = await post(apps[1].url, '/transfers', { label }, `k-${label}`);

    expect(first.status).toBe(201);
    expect(replay.status).toBe(201);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.body.equals(first.body)).toBe(true);
    expect(await effects(label)).toBe(1);
  });

  it('answers another request under a used key 422, and writes nothing for it', async () => {
    const label = fresh('mismatch');
    expect((await post(app.url, '/transfers', { label }, `k-${label}`)).status).toBe(201);
    const other = await post(apps[1].url, '/transfers', { label, other: true }, `k-${label}`);

    expect(other.status).toBe(422);
    expect(other.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(await effects(label)).toBe(1);
  });

  it.each(MODES)(
    'answers a COMMIT the database refuses (claim mode %s): neither the completion nor the effect; a retry writes once',
    async (_mode, path) => {
      const label = fresh('refuse');
      await db.query('INSERT INTO refused_labels VALUES ($1)', [label]);
      const refused = await post(app.url, path, { label }, `k-${label}`);

      expect(refused.status).toBe(500);
      expect(refused.json().type).toBe(ProblemType.commitRefused);
      expect(await effects(label)).toBe(0);
      expect((await keyRows(`k-${label}`)).map((row) => row.status)).not.toContain('completed');

      await db.query('DELETE FROM refused_labels WHERE label = $1', [label]);
      expect((await post(app.url, path, { label }, `k-${label}`)).status).toBe(201);
      expect(await effects(label)).toBe(1);
      expect(await keyRows(`k-${label}`)).toEqual([{ status: 'completed' }]);
    },
  );

  it('commits each phase with its write, and replays the phased answer without running a phase again', async () => {
    const label = fresh('phased');
    const first = await post(app.url, '/phased-transfers', { label }, `k-${label}`);
    expect(first.status).toBe(201);
    expect([await effects(`${label}-debit`), await effects(`${label}-credit`)]).toEqual([1, 1]);

    const replay = await post(apps[1].url, '/phased-transfers', { label }, `k-${label}`);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.body.equals(first.body)).toBe(true);
    expect([await effects(`${label}-debit`), await effects(`${label}-credit`)]).toEqual([1, 1]);

    // Failing after its phases: they stay committed, each once.
    const failing = fresh('phased-fail');
    expect((await post(app.url, '/phased-transfers', { label: failing, fail: true }, `k-${failing}`)).status).toBe(500);
    expect([await effects(`${failing}-debit`), await effects(`${failing}-credit`)]).toEqual([1, 1]);
  });

  it('records a business key in the effect ledger with the write: once across keys, undone with a failing handler', async () => {
    const label = fresh('ledger');
    // The handler fails after the ledger and the write: both roll back, so the next key's attempt is the first.
    expect((await post(app.url, '/ledger-transfers', { label, fail: true }, `k1-${label}`)).status).toBe(500);
    expect(await effects(label)).toBe(0);
    const first = await post(app.url, '/ledger-transfers', { label }, `k2-${label}`);
    const second = await post(apps[1].url, '/ledger-transfers', { label }, `k3-${label}`);

    expect(first.json()).toMatchObject({ first: true });
    expect(second.json()).toMatchObject({ first: false });
    expect(await effects(label)).toBe(1);
  });

  it.each(MODES)(
    'leaves neither the effect nor a completed key when the handler throws after its write (claim mode %s); the retry writes once',
    async (_mode, path) => {
      const label = fresh('fail');
      expect((await post(app.url, path, { label, fail: true }, `k-${label}`)).status).toBe(500);
      expect(await effects(label)).toBe(0);
      expect(await keyRows(`k-${label}`)).toEqual([]);

      expect((await post(app.url, path, { label }, `k-${label}`)).status).toBe(201);
      expect(await effects(label)).toBe(1);
      expect(await keyRows(`k-${label}`)).toEqual([{ status: 'completed' }]);
    },
  );

  it('loses the handler’s write with the completion when killed (SIGKILL) before the COMMIT; the retry after the lease writes once', async () => {
    const label = fresh('crash');
    const key = `k-${label}`;
    const doomed = await AppProcess.start('test/support/no-typeorm-app.ts', { ...env, CRASH: '1' });
    apps.push(doomed);
    const answer = await post(doomed.url, '/crashing-transfers', { label }, key).catch((error: Error) => error);

    expect(await doomed.exit()).toBe('SIGKILL');
    // The answer never came: the connection died with the process.
    expect(answer).toHaveProperty('code', 'ECONNRESET');
    expect(await effects(label)).toBe(0);
    expect(await keyRows(key)).toEqual([{ status: 'in_flight' }]);

    // The crashed attempt's lease (1 s) must run out first.
    let retried = await post(app.url, '/crashing-transfers', { label }, key);
    for (let i = 0; i < 100 && retried.status === 409; i++) {
      await sleep(250);
      retried = await post(app.url, '/crashing-transfers', { label }, key);
    }
    expect(retried.status).toBe(201);
    expect(await effects(label)).toBe(1);
    expect(await keyRows(key)).toEqual([{ status: 'completed' }]);
  });
});
