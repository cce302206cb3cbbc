import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Test } from '@nestjs/testing';
import { Injectable, Module } from '@nestjs/common';
import { TypeOrmModule } from '@nestjs/typeorm';
import type pg from 'pg';
import {
  FingerprintMismatchError,
  IdempotencyInputError,
  IdempotencyModule,
  IdempotencyService,
  KeyInFlightError,
  TransactionHost,
} from '../src/index.js';
import { createTables, dataSourceOptions, freshSchema, QueryCounter, sqlClient } from './support/database.js';
import { post } from './support/http.js';
import { ADAPTERS, startTestApp } from './support/test-app.js';

@Injectable()
class Mailer {
  constructor(private readonly tx: TransactionHost) {}
  async record(label: string): Promise<void> {
    await this.tx.manager.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', ['service', label]);
  }
}

describe('IdempotencyService.execute without HTTP', () => {
  let service: IdempotencyService;
  let mailer: Mailer;
  let db: pg.Client;
  let close: () => Promise<void>;
  let n = 0;
  const fresh = () => `svc-${Date.now()}-${++n}`;

  beforeAll(async () => {
    const schema = await freshSchema('service');
    await createTables(schema);
    @Module({
      imports: [
        TypeOrmModule.forRoot({ ...dataSourceOptions(schema), retryAttempts: 0 }),
        // forRootAsync, as an app reading its configuration would use it.
        IdempotencyModule.forRootAsync({
          useFactory: async () => ({ tenant: () => 'unused-for-execute', lease: '1s', ttl: '1h', sweep: false }),
        }),
      ],
      providers: [Mailer],
    })
    class ConsumerModule {}
    const moduleRef = await Test.createTestingModule({ imports: [ConsumerModule] }).compile();
    await moduleRef.init();
    service = moduleRef.get(IdempotencyService);
    mailer = moduleRef.get(Mailer);
    db = await sqlClient(schema);
    close = () => moduleRef.close();
  });
  afterAll(async () => {
    await close?.();
    await db?.end();
  });

  const effects = async (label: string) =>
    Number((await db.query('SELECT count(*) FROM effects WHERE label = $1', [label])).rows[0].count);

  it('runs the work once for concurrent deliveries of one message; the others conflict or get the same result', async () => {
    const label = fresh();
    let runs = 0;
    const deliveries = await Promise.allSettled(
      Array.from({ length: 20 }, () =>
        service.execute({ tenant: 'tenant-a', key: `msg-${label}`, payload: { label, n: 1 } }, async (manager) => {
          runs++;
          await manager.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', ['service', label]);
          await new Promise((r) => setTimeout(r, 100));
          return { sent: label, at: new Date(0) };
        }),
      ),
    );
    expect(runs).toBe(1);
    expect(await effects(label)).toBe(1);
    for (const d of deliveries) {
      if (d.status === 'fulfilled') expect(d.value).toEqual({ sent: label, at: '1970-01-01T00:00:00.000Z' });
      else expect(d.reason).toBeInstanceOf(KeyInFlightError);
    }
    const later = await service.execute({ tenant: 'tenant-a', key: `msg-${label}`, payload: { n: 1, label } }, () => {
      runs++;
      return null;
    });
    expect(later).toEqual({ sent: label, at: '1970-01-01T00:00:00.000Z' });
    expect(runs).toBe(1);
  });

  it('writes made through TransactionHost commit or roll back with the key', async () => {
    const label = fresh();
    await expect(
      service.execute({ tenant: 't', key: `k-${label}`, payload: 1 }, async () => {
        await mailer.record(label);
        throw new Error('downstream failed');
      }),
    ).rejects.toThrow('downstream failed');
    expect(await effects(label)).toBe(0);
    // Kept in flight (the default policy), so a redelivery within the lease conflicts.
    await expect(service.execute({ tenant: 't', key: `k-${label}`, payload: 1 }, () => 'x')).rejects.toBeInstanceOf(
      KeyInFlightError,
    );

    await service.execute({ tenant: 't', key: `ok-${label}`, payload: 1 }, () => mailer.record(label));
    expect(await effects(label)).toBe(1);
  });

  it("onError: 'release' lets a redelivery run at once", async () => {
    const label = fresh();
    let runs = 0;
    const work = () => {
      runs++;
      if (runs === 1) throw new Error('first try fails');
      return 'done';
    };
    await expect(service.execute({ tenant: 't', key: `r-${label}`, payload: 1, onError: 'release' }, work)).rejects.toThrow();
    await expect(service.execute({ tenant: 't', key: `r-${label}`, payload: 1, onError: 'release' }, work)).resolves.toBe('done');
    expect(runs).toBe(2);
  });

  it('a different payload under a used key is a mismatch; tenants do not share keys', async () => {
    const label = fresh();
    await service.execute({ tenant: 'a', key: `m-${label}`, payload: { v: 1 } }, () => 1);
    await expect(service.execute({ tenant: 'a', key: `m-${label}`, payload: { v: 2 } }, () => 2)).rejects.toBeInstanceOf(
      FingerprintMismatchError,
    );
    await expect(service.execute({ tenant: 'b', key: `m-${label}`, payload: { v: 2 } }, () => 2)).resolves.toBe(2);
  });

  describe('a tenant or key the store cannot hold as it is: a clear error, nothing claimed or run (CONTRACT A5.12b)', () => {
    /** Key rows that name `label` in their key or tenant, however the store converted them. */
    const rowsNaming = async (label: string) =>
      Number(
        (await db.query('SELECT count(*) FROM idempotency_keys WHERE key LIKE $1 OR tenant_id LIKE $1', [`%${label}%`])).rows[0]
          .count,
      );
    /** `execute()` and `executePhased()`, each called with `input` in turn. */
    const entries: Array<(input: { tenant: unknown; key: unknown }, ran: () => void) => Promise<unknown>> = [
      (input, ran) => service.execute({ ...(input as { tenant: string; key: string }), payload: 1 }, () => ran()),
      (input, ran) => service.executePhased({ ...(input as { tenant: string; key: string }), payload: 1 }, () => ran()),
    ];

    it.each<[string, 'tenant' | 'key', (label: string) => { tenant: unknown; key: unknown }]>([
      ['a Buffer tenant', 'tenant', (l) => ({ tenant: Buffer.from(`t-${l}`), key: `k-${l}` })],
      ['a Buffer key', 'key', (l) => ({ tenant: `t-${l}`, key: Buffer.from(`k-${l}`) })],
      ['an empty tenant', 'tenant', (l) => ({ tenant: '', key: `k-${l}` })],
      ['an empty key', 'key', (l) => ({ tenant: `t-${l}`, key: '' })],
      ['a missing tenant', 'tenant', (l) => ({ tenant: undefined, key: `k-${l}` })],
      ['a number as the key', 'key', (l) => ({ tenant: `t-${l}`, key: 42 })],
      ['a lone high surrogate in the key', 'key', (l) => ({ tenant: `t-${l}`, key: `k-${l}\ud800` })],
      ['a lone low surrogate in the tenant', 'tenant', (l) => ({ tenant: `t-${l}\udc00`, key: `k-${l}` })],
      ['a NUL in the key', 'key', (l) => ({ tenant: `t-${l}`, key: `k-${l}\u0000x` })],
      ['a NUL in the tenant', 'tenant', (l) => ({ tenant: `t-${l}\u0000`, key: `k-${l}` })],
    ])('%s', async (_case, field, input) => {
      const label = fresh();
      let runs = 0;
      for (const entry of entries) {
        const error = await entry(input(label), () => void runs++).then(
          () => undefined,
          (e: unknown) => e,
        );
        expect(error).toBeInstanceOf(IdempotencyInputError);
        expect(error).toBeInstanceOf(TypeError);
        expect(error).toMatchObject({ name: 'IdempotencyInputError', field });
        expect((error as Error).message).not.toContain(label);
      }
      expect(runs).toBe(0);
      expect(await rowsNaming(label)).toBe(0);
    });

    it("two tenants given as Buffers never meet: neither runs, neither gets the other's result", async () => {
      const label = fresh();
      const ran: string[] = [];
      for (const tenant of ['tenant-a', 'tenant-b']) {
        await expect(
          service.execute({ tenant: Buffer.from(tenant) as never, key: `k-${label}`, payload: 1 }, () => {
            ran.push(tenant);
            return tenant;
          }),
        ).rejects.toBeInstanceOf(IdempotencyInputError);
      }
      expect(ran).toEqual([]);
      expect(await rowsNaming(label)).toBe(0);
    });

    it('keys that differ only in lone surrogates never meet; well-formed non-ASCII keys are kept exactly', async () => {
      const label = fresh();
      // Each of these would be stored as `k-<label>\ufffd`.
      for (const [n, key] of [`k-${label}\ud800`, `k-${label}\udbff`, `k-${label}\udfff`].entries()) {
        await expect(service.execute({ tenant: 't', key, payload: n }, () => key)).rejects.toBeInstanceOf(IdempotencyInputError);
      }
      expect(await rowsNaming(label)).toBe(0);
      // U+FFFD itself and a surrogate pair are well-formed: two keys of their own, stored as given.
      const replacement = `k-${label}\ufffd`;
      const pair = `k-${label}\ud83d\ude00`;
      await expect(service.execute({ tenant: 't', key: replacement, payload: 1 }, () => 'replacement')).resolves.toBe(
        'replacement',
      );
      await expect(service.execute({ tenant: 't', key: pair, payload: 2 }, () => 'pair')).resolves.toBe('pair');
      const { rows } = await db.query('SELECT key FROM idempotency_keys WHERE key LIKE $1', [`%${label}%`]);
      expect(rows.map((row: { key: string }) => row.key).sort()).toEqual([replacement, pair].sort());
    });
  });

  it('TransactionHost falls back to the plain manager outside an execution', async () => {
    const label = fresh();
    await mailer.record(label);
    expect(await effects(label)).toBe(1);
  });
});

describe.each(ADAPTERS)('database round trips per path over %s', (adapter) => {
  it("new key in the bare handler's three round trips (claim, BEGIN + handler write, completion + COMMIT); replay and 422 in one, no transaction opened", async () => {
    const schema = await freshSchema(`roundtrips_${adapter}`);
    await createTables(schema);
    const counter = new QueryCounter();
    const api = await startTestApp(adapter, schema, {}, { logger: counter });
    /** The answer went out after one round trip, and nothing follows it: no transaction was opened, none rolled back. */
    const answeredInOne = async () => {
      await new Promise((r) => setTimeout(r, 100));
      expect(counter.roundTrips).toEqual([[expect.stringMatching(/^\/\* nest-idempotency:claim \*\//)]]);
    };
    try {
      counter.reset();
      const label = `rt-${adapter}`;
      expect((await post(api.url, '/items', { label }, 'k1')).status).toBe(201);
      // The claim commits on its own, alone (its function writes only at READ COMMITTED: see separate-claim.ts); the
      // work's transaction opens with its first statement: one batch, one round trip.
      expect(counter.roundTrips).toEqual([
        ['/* nest-idempotency:claim */ SELECT * FROM "idempotency_keys_claim"($1, $2, $3, $4::uuid, $5, $6, $7)'],
        ['START TRANSACTION', expect.stringMatching(/^INSERT INTO effects/)],
        [
          '/* nest-idempotency:complete */ SELECT "idempotency_keys_complete_or_raise"($1, $2, $3::uuid, $4, $5::jsonb, $6, $7) AS completed',
          'COMMIT',
        ],
      ]);

      // A replay is a read: it takes no row lock (which would stamp the row's xmax) and so writes no WAL.
      const db = await sqlClient(schema);
      const xmax = async () => (await db.query(`SELECT xmax::text FROM idempotency_keys WHERE key = 'k1'`)).rows[0].xmax;
      const before = await xmax();
      counter.reset();
      expect((await post(api.url, '/items', { label }, 'k1')).headers['idempotent-replayed']).toBe('true');
      await answeredInOne();
      expect(await xmax()).toBe(before);
      await db.end();

      counter.reset();
      expect((await post(api.url, '/items', { label, changed: true }, 'k1')).status).toBe(422);
      await answeredInOne();

      // A handler that sends no statement: its transaction opens in the completion's message.
      counter.reset();
      expect((await post(api.url, '/text', { label: 'no-statement' }, 'k3')).status).toBe(201);
      expect(counter.roundTrips).toEqual([
        [expect.stringMatching(/^\/\* nest-idempotency:claim \*\//)],
        ['START TRANSACTION', expect.stringMatching(/^\/\* nest-idempotency:complete \*\//), 'COMMIT'],
      ]);

      api.probe.delays.set('slow-rt', [800]);
      const slow = post(api.url, '/slow', { label: 'slow-rt' }, 'k2');
      await new Promise((r) => setTimeout(r, 300));
      counter.reset();
      // A duplicate of an execution running in this process is answered from it, without a round trip.
      expect((await post(api.url, '/slow', { label: 'slow-rt' }, 'k2')).status).toBe(409);
      expect(counter.queries).toHaveLength(0);
      await slow;
    } finally {
      await api.close();
    }
  });
});

describe.each(ADAPTERS)('preparedStatements over %s', (adapter) => {
  it('claims and completes with named prepared statements, with the same answers and round trips', async () => {
    const schema = await freshSchema(`prepared_${adapter}`);
    await createTables(schema);
    const counter = new QueryCounter();
    // A pool of one, shared with the claims: the handler runs on the connection the claim used.
    const api = await startTestApp(
      adapter,
      schema,
      { preparedStatements: true, reservedConnections: 0 },
      { logger: counter, poolSize: 1 },
    );
    try {
      counter.reset();
      const first = await post(api.url, '/items', { label: 'p' }, 'p1');
      expect(first.status).toBe(201);
      expect(counter.roundTrips).toHaveLength(3);
      const names = (await post(api.url, '/prepared-statements', {}, 'p2')).json() as string[];
      expect(names.some((name) => name.startsWith('nest_idem_claim_'))).toBe(true);
      expect(names.some((name) => name.startsWith('nest_idem_complete_'))).toBe(true);
      const replay = await post(api.url, '/items', { label: 'p' }, 'p1');
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(Buffer.compare(replay.body, first.body)).toBe(0);
      expect((await post(api.url, '/items', { label: 'other' }, 'p1')).status).toBe(422);
      expect(api.probe.count('p')).toBe(1);
      // A handler with no statement: its BEGIN goes with the named completion, in two round trips.
      counter.reset();
      const text = await post(api.url, '/text', { label: 'p-text' }, 'p3');
      expect(text.status).toBe(201);
      expect(counter.roundTrips).toHaveLength(2);
      expect((await post(api.url, '/text', { label: 'p-text' }, 'p3')).headers['idempotent-replayed']).toBe('true');
    } finally {
      await api.close();
    }
  });
});
