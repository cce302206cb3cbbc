import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { randomUUID } from 'node:crypto';
import type pg from 'pg';
import type { DataSource, EntityManager } from 'typeorm';
import { IdempotencyEngine } from '../src/core/idempotency-engine.js';
import type { ClaimMode } from '../src/core/idempotency-store.js';
import { FingerprintMismatchError, KeyInFlightError, LeaseLostError, StoreUnavailableError } from '../src/core/errors.js';
import { PostgresIdempotencyStore } from '../src/store/postgres/postgres-idempotency.store.js';
import { IdempotencySchemaCheck } from '../src/store/schema-check.js';
import { resolveIdempotencyOptions } from '../src/resolve-options.js';
import { createOutboxStatements, createTableStatements } from '../src/store/sql.js';
import { OutboxStore } from '../src/outbox/outbox.store.js';
import { BoardQueries } from '../src/board/board.queries.js';
import { boardKey } from '../src/board/board-key.js';
import { createEffectLedgerStatements } from '../src/ledger/effect-ledger.sql.js';
import { EffectLedger } from '../src/ledger/effect-ledger.js';
import { distributeIdempotencyTables } from '../src/store/citus/distribute.js';
import { createIdempotencyKeysMigration } from '../src/store/idempotency-keys.migration.js';
import {
  citusClient,
  citusClusterDir,
  citusDataSource,
  controlWorker,
  describeWithCitus,
  freshCitusSchema,
  workerDataDir,
} from './support/citus.js';
import { NOT_RUN_PREFIX } from './support/brokers.js';
import { sleep } from './support/http.js';

/**
 * The module's contract on a Citus cluster sharded by tenant (issue 31), with the layout a user makes: the module's
 * migrations, a business table (`charges`) distributed by tenant, then `distributeIdempotencyTables`, and stores with
 * `citus: true`. Engines with stores and pools of their own stand for separate app instances. The tenants live on
 * both workers (tenant-a and tenant-b hash to different ones on the default 32 shards), and every effect is a row of
 * `charges`, co-located with the key's row, so "one effect per key" is counted where it would be committed.
 */
await describeWithCitus('the contract on a Citus cluster sharded by tenant', () => {
  const TENANTS = ['tenant-a', 'tenant-b'];
  let schema: string;
  let db: pg.Client;
  const sources: DataSource[] = [];
  let n = 0;
  const fresh = () => `c-${Date.now()}-${++n}`;

  const open = async (poolSize = 10) => {
    const source = await citusDataSource(schema, poolSize);
    sources.push(source);
    return source;
  };
  const engine = async (poolSize = 10) =>
    new IdempotencyEngine(new PostgresIdempotencyStore(await open(poolSize), 'idempotency_keys', { citus: true }));
  const charges = async (tenant: string, key: string) =>
    (await db.query('SELECT count(*)::int AS count FROM charges WHERE tenant_id = $1 AND label = $2', [tenant, key])).rows[0]
      .count as number;
  const work = (
    tenant: string,
    key: string,
    claimMode: ClaimMode,
    over: { fingerprint?: string; leaseMs?: number; run?: (tx: EntityManager) => Promise<unknown> } = {},
  ) => ({
    tenant,
    key,
    fingerprint: over.fingerprint ?? 'fp',
    leaseMs: over.leaseMs ?? 30_000,
    ttlMs: 3_600_000,
    claimMode,
    heartbeat: false,
    onFailure: () => ({ action: 'keep' as const }),
    run: async (tx: EntityManager) => {
      await tx.query('INSERT INTO charges (tenant_id, label) VALUES ($1, $2)', [tenant, key]);
      await over.run?.(tx);
      return { response: { status: 201, headers: [], body: Buffer.from(`${tenant}/${key}`) }, result: claimMode };
    },
  });
  const schemaCheck = (dataSource: DataSource, options: Record<string, unknown> = {}) => {
    const resolved = resolveIdempotencyOptions({ tenant: () => 'tenant-a', citus: true, ledger: {}, outbox: {}, ...options });
    return new IdempotencySchemaCheck(
      dataSource,
      resolved,
      new PostgresIdempotencyStore(dataSource, 'idempotency_keys', { citus: true }),
    );
  };

  const LAYOUT = { colocateWith: 'charges', ledgerTableName: 'effect_ledger', outboxTableName: 'outbox_messages' };
  const accepted = () => new Error('the start-up check accepted the layout');
  const refusedWith = (error: unknown) => error as Error;

  beforeAll(async () => {
    schema = await freshCitusSchema('citus_contract');
    db = await citusClient(schema);
    // What a user runs, in order: the module's migrations, the business table distributed by tenant, the module's step.
    for (const statement of [
      ...createTableStatements('idempotency_keys'),
      ...createEffectLedgerStatements('effect_ledger'),
      ...createOutboxStatements('outbox_messages'),
    ]) {
      await db.query(statement);
    }
    await db.query(
      `CREATE TABLE charges (tenant_id text NOT NULL, id bigserial, label text NOT NULL, PRIMARY KEY (tenant_id, id))`,
    );
    await db.query(`SELECT create_distributed_table('charges', 'tenant_id')`);
    await distributeIdempotencyTables(await open(1), LAYOUT);
  });
  afterAll(async () => {
    await Promise.all(sources.map((source) => source.destroy()));
    await db?.end();
  });

  it('distributes the module tables by tenant_id, co-located with the business table, and the start-up check accepts the layout', async () => {
    const { rows } = await db.query(
      `SELECT logicalrelid::regclass::text AS name, column_to_column_name(logicalrelid, partkey) AS column, colocationid
         FROM pg_dist_partition WHERE logicalrelid::regclass::text IN ('charges', 'idempotency_keys', 'effect_ledger', 'outbox_messages') ORDER BY 1`,
    );
    expect(rows.map((row) => [row.name, row.column])).toEqual([
      ['charges', 'tenant_id'],
      ['effect_ledger', 'tenant_id'],
      ['idempotency_keys', 'tenant_id'],
      ['outbox_messages', 'tenant_id'],
    ]);
    expect(new Set(rows.map((row) => row.colocationid)).size).toBe(1);
    // The two tenants of these tests live on different workers, so both are exercised.
    const { rows: placements } = await db.query(
      `SELECT count(DISTINCT p.groupid)::int AS workers FROM unnest($1::text[]) t
         JOIN pg_dist_placement p ON p.shardid = get_shard_id_for_distribution_column('charges', t)`,
      [TENANTS],
    );
    expect(placements[0].workers).toBe(2);
    await expect(schemaCheck(await open(1)).onModuleInit()).resolves.toBeUndefined();
  });

  describe.each(['separate', 'request-transaction'] as const)('claim mode %s', (claimMode) => {
    it.each(TENANTS)('the state table for %s: new, replay, 422 for another request, 409 while in flight', async (tenant) => {
      const [first, second] = [await engine(), await engine()];
      const key = fresh();
      await expect(first.execute(work(tenant, key, claimMode))).resolves.toMatchObject({ kind: 'executed' });
      const replay = await second.execute(work(tenant, key, claimMode));
      expect(replay).toMatchObject({ kind: 'replayed' });
      expect(Buffer.from((replay as { response: { body: Buffer } }).response.body).toString()).toBe(`${tenant}/${key}`);
      await expect(second.execute(work(tenant, key, claimMode, { fingerprint: 'other' }))).rejects.toBeInstanceOf(
        FingerprintMismatchError,
      );

      // In flight: a holder that waits inside its handler.
      const held = fresh();
      let release!: () => void;
      const gate = new Promise<void>((resolve) => (release = resolve));
      const holding = first.execute(work(tenant, held, claimMode, { run: () => gate }));
      await sleep(300);
      const conflict = await second.execute(work(tenant, held, claimMode)).catch((error: unknown) => error);
      expect(conflict).toBeInstanceOf(KeyInFlightError);
      expect((conflict as KeyInFlightError).retryAfterSeconds).toBeGreaterThanOrEqual(1);
      // Another request with the key: 422 where the claim wrote the row; in request-transaction mode the holder's row
      // is written only at its completion, so there is nothing to compare yet, and the answer is 409, as on one server.
      await expect(second.execute(work(tenant, held, claimMode, { fingerprint: 'other' }))).rejects.toBeInstanceOf(
        claimMode === 'separate' ? FingerprintMismatchError : KeyInFlightError,
      );
      release();
      await expect(holding).resolves.toMatchObject({ kind: 'executed' });
      expect(await charges(tenant, held)).toBe(1);
      expect(await charges(tenant, key)).toBe(1);
    });

    it('concurrent duplicates from two instances, on both workers: one effect per key', async () => {
      const engines = [await engine(), await engine()];
      const keys = TENANTS.flatMap((tenant) => [0, 1, 2].map(() => ({ tenant, key: fresh() })));
      const attempts = keys.flatMap(({ tenant, key }) =>
        Array.from({ length: 6 }, (_, i) =>
          engines[i % 2].execute({ ...work(tenant, key, claimMode, { run: () => sleep(50) }), waitMs: 2_000 }).then(
            (outcome) => outcome.kind,
            (error: unknown) => (error instanceof KeyInFlightError ? 'in-flight' : String(error)),
          ),
        ),
      );
      const outcomes = await Promise.all(attempts);
      expect(outcomes.filter((kind) => !['executed', 'replayed', 'in-flight'].includes(kind))).toEqual([]);
      expect(outcomes.filter((kind) => kind === 'executed')).toHaveLength(keys.length);
      for (const { tenant, key } of keys) expect(await charges(tenant, key)).toBe(1);
    });

    it('a takeover after the lease fences the first attempt: its completion is refused and its effect rolled back', async () => {
      const [slow, taker] = [await engine(), await engine()];
      for (const tenant of TENANTS) {
        const key = fresh();
        const first = slow
          .execute(work(tenant, key, claimMode, { leaseMs: 300, run: () => sleep(1_200) }))
          .catch((error: unknown) => error);
        await sleep(700);
        const second = await taker.execute(work(tenant, key, claimMode, { leaseMs: 300 })).catch((error: unknown) => error);
        if (claimMode === 'separate') {
          // The lease lapsed: the taker runs, and the first attempt's completion is fenced.
          expect(second).toMatchObject({ kind: 'executed' });
          expect(await first).toBeInstanceOf(LeaseLostError);
        } else {
          // In request-transaction mode the first attempt's transaction holds the key's lock (on the tenant's
          // worker): the duplicate waits, then answers 409, and the first attempt completes.
          expect(second).toBeInstanceOf(KeyInFlightError);
          expect(await first).toMatchObject({ kind: 'executed' });
        }
        expect(await charges(tenant, key)).toBe(1);
      }
    });
  });

  it("the ledger records a business key once, in the handler's transaction on the tenant's worker", async () => {
    const ledger = new EffectLedger(await open(2), resolveIdempotencyOptions({ tenant: () => 'x', ledger: {} }));
    const runner = await engine();
    const recorded: boolean[] = [];
    for (const key of [fresh(), fresh()]) {
      await runner.execute(
        work('tenant-b', key, 'separate', {
          run: async (tx) => void recorded.push(await ledger.once(tx, 'refund-77', { tenant: 'tenant-b', scope: 'refund' })),
        }),
      );
    }
    expect(recorded).toEqual([true, false]);
    await expect(ledger.has('refund-77', { tenant: 'tenant-b', scope: 'refund' })).resolves.toBe(true);
    await expect(ledger.has('refund-77', { tenant: 'tenant-a', scope: 'refund' })).resolves.toBe(false);
  });

  it("the outbox: a message commits with the handler's writes on the tenant's worker, needs a tenant, and two relays claim each message once, per tenant", async () => {
    const source = await open(4);
    const outbox = new OutboxStore(source, 'outbox_messages', { citus: true });
    const runner = await engine();
    const keys = TENANTS.flatMap((tenant) => [0, 1, 2].map(() => ({ tenant, key: fresh() })));
    for (const { tenant, key } of keys) {
      await runner.execute(
        work(tenant, key, 'separate', {
          run: async (tx) => void (await outbox.enqueue(tx, { tenant, topic: 'receipt', payload: { key } })),
        }),
      );
    }
    await expect(source.transaction((tx) => outbox.enqueue(tx, { tenant: null, topic: 'receipt', payload: {} }))).rejects.toThrow(
      'a message needs a tenant with `citus: true`',
    );
    // A failed handler's message is rolled back with its charge.
    const failed = fresh();
    await runner
      .execute(
        work('tenant-a', failed, 'separate', {
          run: async (tx) => {
            await outbox.enqueue(tx, { tenant: 'tenant-a', topic: 'receipt', payload: { key: failed } });
            throw new Error('declined');
          },
        }),
      )
      .catch(() => undefined);

    const relays = [outbox, new OutboxStore(await open(4), 'outbox_messages', { citus: true })];
    const tokens = [randomUUID(), randomUUID()];
    const batches = await Promise.all(relays.map((relay, i) => relay.claim(2, 30_000, tokens[i], 5)));
    const later = await Promise.all(relays.map((relay, i) => relay.claim(10, 30_000, tokens[i], 5)));
    const claimed = [...batches, ...later].flatMap((batch) => batch.messages.map((m) => (m.payload as { key: string }).key));
    expect(claimed.sort()).toEqual(keys.map(({ key }) => key).sort());
    // Locks renewed per tenant by the relay that holds them, not by the other one.
    for (const [i, batch] of [...batches, ...later].entries()) {
      const ids = batch.messages.map((m) => m.id);
      await expect(relays[i % 2].renewLocks(ids, tokens[i % 2], 30_000)).resolves.toEqual(expect.arrayContaining(ids));
      await expect(relays[(i + 1) % 2].renewLocks(ids, tokens[(i + 1) % 2], 30_000)).resolves.toEqual([]);
    }
    // Settled with the tenant: each by the relay that holds it, not by the other one.
    for (const [i, batch] of [...batches, ...later].entries()) {
      for (const message of batch.messages) {
        await expect(relays[(i + 1) % 2].markDelivered(message.id, tokens[(i + 1) % 2])).resolves.toBe(false);
        await expect(relays[i % 2].markDelivered(message.id, tokens[i % 2])).resolves.toBe(true);
      }
    }
    const { rows } = await db.query(`SELECT status, count(*)::int AS count FROM outbox_messages GROUP BY status`);
    expect(rows).toEqual([{ status: 'delivered', count: keys.length }]);
  });

  it("the board's views read every shard or the tenant's, and its release ends a held attempt's lease (fenced) on the tenant's worker", async () => {
    const source = await open(2);
    const board = new BoardQueries(source, 'idempotency_keys', 'outbox_messages');
    const store = new PostgresIdempotencyStore(source, 'idempotency_keys', { citus: true });
    const [holder, retry] = [await engine(), await engine()];
    const key = fresh();
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const holding = holder.execute(work('tenant-b', key, 'separate', { run: () => gate })).catch((error: unknown) => error);
    await sleep(300);

    const all = await board.keyCounts(null, 10);
    expect(all.tenants.map((t) => t.tenant)).toContain('tenant-b');
    expect(all.totals.inFlight).toBeGreaterThanOrEqual(1);
    const mine = await board.keyCounts('tenant-b', 10);
    expect(mine.tenants.map((t) => t.tenant)).toEqual(['tenant-b']);
    const stuck = (await board.stuckKeys('tenant-b', 50)).find((s) => s.key === boardKey(key));
    expect(stuck).toBeDefined();
    await expect(board.lookup('tenant-b', key, false)).resolves.toMatchObject({ state: 'in-flight', tenant: 'tenant-b' });
    await expect(board.outboxCounts(null)).resolves.toMatchObject({ dead: 0 });

    // The operator's release: the next retry runs at once, and the held attempt's completion is fenced.
    await expect(store.endLease('tenant-b', stuck!.ref)).resolves.toBe(key);
    await expect(store.endLease('tenant-b', stuck!.ref)).resolves.toBeUndefined();
    await expect(retry.execute(work('tenant-b', key, 'separate'))).resolves.toMatchObject({ kind: 'executed' });
    release();
    expect(await holding).toBeInstanceOf(LeaseLostError);
    expect(await charges('tenant-b', key)).toBe(1);
  });

  it('the sweeper deletes expired keys in batches on every shard, never a key whose lease is valid, and goes on past a batch a takeover made short', async () => {
    const store = new PostgresIdempotencyStore(await open(2), 'idempotency_keys', { citus: true });
    const live = fresh();
    await expect((await engine()).execute(work('tenant-a', live, 'separate', { run: async () => {} }))).resolves.toMatchObject({
      kind: 'executed',
    });
    // 300 expired keys over both tenants' shards (expired-300 the oldest), and one in flight whose lease is still
    // valid past its TTL.
    await db.query(
      `INSERT INTO idempotency_keys
         (tenant_id, key, fingerprint, status, owner_token, lease_expires_at, expires_at, created_at, expiry_floor)
       SELECT CASE WHEN i % 2 = 0 THEN 'tenant-a' ELSE 'tenant-b' END, 'expired-' || i, 'fp', 'completed', gen_random_uuid(),
              now() - interval '2 hours', now() - interval '1 hour' - i * interval '1 second', now() - interval '2 hours',
              now() - interval '1 hour' - i * interval '1 second'
         FROM generate_series(1, 300) i`,
    );
    await db.query(
      `INSERT INTO idempotency_keys
         (tenant_id, key, fingerprint, status, owner_token, lease_expires_at, expires_at, created_at, expiry_floor)
       VALUES ('tenant-b', 'leased', 'fp', 'in_flight', gen_random_uuid(), now() + interval '1 hour', now() - interval '1 minute', now(),
               now() - interval '1 minute')`,
    );
    // A takeover of expired-300 under way while the first batch runs: the batch waits for its row (no SKIP LOCKED on
    // Citus), finds it renewed, keeps it, and comes back one short; the run goes on to the rest.
    const taker = await citusClient(schema);
    await taker.query('BEGIN');
    await taker.query(
      `UPDATE idempotency_keys
          SET status = 'in_flight', lease_expires_at = $1::timestamptz, expires_at = $1::timestamptz, expiry_floor = $1::timestamptz
        WHERE tenant_id = 'tenant-a' AND key = 'expired-300'`,
      [new Date(Date.now() + 3_600_000)],
    );
    const sweeping = store.sweep({ batchSize: 100, maxDurationMs: 30_000 });
    await sleep(500);
    await taker.query('COMMIT');
    await taker.end();
    const result = await sweeping;
    expect(result).toMatchObject({ ran: true, deleted: 299 });
    expect(result.batches).toBeGreaterThanOrEqual(3);
    const { rows } = await db.query(
      `SELECT key FROM idempotency_keys WHERE key IN ('leased', 'expired-300', $1) OR key LIKE 'expired-%'`,
      [live],
    );
    expect(rows.map((row) => row.key).sort()).toEqual(['expired-300', 'leased', live].sort());
  });

  // Needs to stop and start a worker, so the cluster's data directories on this machine (cluster.sh's, as in CI).
  const crashTitle =
    'a worker crashed mid-storm: its tenants answer 503 while it is down, the other worker goes on, and after its restart every key has one effect';
  if (citusClusterDir() === undefined) {
    it(`${NOT_RUN_PREFIX}needs Citus, which runs elsewhere: no cluster.sh data directory here to stop a worker in (CITUS_CLUSTER_DIR)`, () => {
      if (process.env.REQUIRE_CITUS) throw new Error(`REQUIRE_CITUS is set: ${crashTitle} needs CITUS_CLUSTER_DIR`);
    });
  } else {
    it(crashTitle, async () => {
      const { rows } = await db.query<{ tenant: string; port: number }>(
        `SELECT t AS tenant, n.nodeport AS port FROM unnest($1::text[]) t
           JOIN pg_dist_placement p ON p.shardid = get_shard_id_for_distribution_column('charges', t)
           JOIN pg_dist_node n ON n.groupid = p.groupid`,
        [TENANTS],
      );
      const [down, up] = rows;
      const dir = workerDataDir(down.port);
      expect(dir).toBeDefined();
      const engines = [await engine(), await engine()];
      const storm = (tenant: string, keys: string[]) =>
        keys.flatMap((key) =>
          [0, 1, 2].map((i) =>
            engines[i % 2]
              // The lease is well past the handler's 400 ms: on a loaded machine the coordinator has been seen to stall
              // for about a second as the worker went down, and a 1 s lease then ran out under the other tenant's work.
              .execute({ ...work(tenant, key, 'separate', { leaseMs: 3_000, run: () => sleep(400) }), waitMs: 500 })
              .then(
                (outcome) => outcome.kind,
                (error: unknown) => error,
              ),
          ),
        );
      const downKeys = [fresh(), fresh(), fresh()];
      const upKeys = [fresh(), fresh(), fresh()];
      const first = Promise.all([...storm(down.tenant, downKeys), ...storm(up.tenant, upKeys)]);
      await sleep(200);
      controlWorker(dir!, 'crash');
      try {
        const outcomes = await first;
        // The crashed worker's tenant: nothing answered as a success (the claims and completions that could not reach
        // it are 503s; a handler's own INSERT that could not is the handler's failure, a 500). The other tenant's keys:
        // one execution each, the duplicates 409, or a replay when the original completed within their wait (a
        // loaded machine's timing).
        expect(outcomes.slice(0, 9).filter((outcome) => outcome === 'executed')).toEqual([]);
        expect(outcomes.slice(0, 9).some((outcome) => outcome instanceof StoreUnavailableError)).toBe(true);
        expect(outcomes.slice(9).filter((outcome) => outcome === 'executed')).toHaveLength(3);
        // Listed, not counted: a failure names what the other tenant's duplicate got instead.
        expect(
          outcomes
            .slice(9)
            .filter((outcome) => !(outcome === 'executed' || outcome === 'replayed' || outcome instanceof KeyInFlightError))
            .map(String),
        ).toEqual([]);
        // While it is down: a new key of its tenant is a 503 before any handler runs; the other worker's tenant runs.
        const refused = await engines[0].execute(work(down.tenant, fresh(), 'separate')).catch((error: unknown) => error);
        expect(refused).toBeInstanceOf(StoreUnavailableError);
        await expect(engines[1].execute(work(up.tenant, fresh(), 'separate'))).resolves.toMatchObject({ kind: 'executed' });
      } finally {
        controlWorker(dir!, 'start');
      }
      // After the restart and the leases: every key of the storm completes, each with one effect.
      await sleep(3_200);
      for (const [tenant, keys] of [
        [down.tenant, downKeys],
        [up.tenant, upKeys],
      ] as const) {
        for (const key of keys) {
          let outcome: unknown;
          for (let attempt = 0; attempt < 10; attempt++) {
            outcome = await engines[attempt % 2]
              .execute(work(tenant, key, 'separate', { leaseMs: 1_000 }))
              .catch((e: unknown) => e);
            if (outcome instanceof KeyInFlightError || outcome instanceof StoreUnavailableError) await sleep(500);
            else break;
          }
          expect(outcome).toMatchObject({ kind: expect.stringMatching(/^(executed|replayed)$/) });
          expect(await charges(tenant, key)).toBe(1);
        }
      }
    });
  }

  it("the key table's migration with citus: true runs again on the distributed layout, in one transaction, and keeps it", async () => {
    const source = await open(1);
    const Migration = createIdempotencyKeysMigration('idempotency_keys', { citus: true });
    const runner = source.createQueryRunner();
    try {
      await runner.startTransaction();
      await new Migration().up(runner);
      await runner.commitTransaction();
    } finally {
      await runner.release();
    }
    await expect(schemaCheck(source).onModuleInit()).resolves.toBeUndefined();
    const key = fresh();
    await expect((await engine()).execute(work('tenant-a', key, 'request-transaction'))).resolves.toMatchObject({
      kind: 'executed',
    });
    expect(await charges('tenant-a', key)).toBe(1);
  });

  it('the start-up check refuses a half-distributed layout with a fix-it message, and distributeIdempotencyTables fixes it', async () => {
    const admin = await open(1);
    // The ledger undistributed (as if distributed by hand, without it).
    await db.query(`SELECT undistribute_table('effect_ledger')`);
    const refused = await schemaCheck(admin).onModuleInit().then(accepted, refusedWith);
    expect(refused).toBeInstanceOf(Error);
    expect(refused.message).toContain('the table "effect_ledger" is not distributed');
    expect(refused.message).toContain('distributeIdempotencyTables(');
    // The key table's migration run again puts back the single-server texts, which the workers refuse.
    for (const statement of createTableStatements('idempotency_keys').filter((s) => /^\s*CREATE OR REPLACE FUNCTION/.test(s))) {
      await db.query(statement);
    }
    const stale = await schemaCheck(admin).onModuleInit().then(accepted, refusedWith);
    expect(stale.message).toContain('has the single-server text');
    // `citus: true` on a key table nothing distributed (the migration run, the step forgotten) names the step too.
    const plain = await freshCitusSchema('citus_contract_plain');
    const setup = await citusClient(plain);
    for (const statement of createTableStatements('idempotency_keys')) await setup.query(statement);
    await setup.end();
    const plainSource = await citusDataSource(plain, 1);
    sources.push(plainSource);
    const none = await schemaCheck(plainSource, { ledger: undefined, outbox: undefined })
      .onModuleInit()
      .then(accepted, refusedWith);
    expect(none.message).toContain('`citus: true` is set, but none of the tables "idempotency_keys" is distributed');
    expect(none.message).toContain('distributeIdempotencyTables(');

    await distributeIdempotencyTables(admin, LAYOUT);
    await expect(schemaCheck(admin).onModuleInit()).resolves.toBeUndefined();
    await expect((await engine()).execute(work('tenant-b', fresh(), 'separate'))).resolves.toMatchObject({ kind: 'executed' });
  });
});
