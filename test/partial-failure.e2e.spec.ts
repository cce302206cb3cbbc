import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Injectable, Module, type INestApplicationContext } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { TypeOrmModule } from '@nestjs/typeorm';
import type pg from 'pg';
import type { EntityManager } from 'typeorm';
import {
  DownstreamKeys,
  IdempotencyModule,
  IdempotencyService,
  KeyInFlightError,
  LeaseLostError,
  TransactionHost,
} from '../src/index.js';
import { Outbox, OutboxRelay, type OutboxMessage } from '../src/outbox/index.js';
import { createOutboxTable, createTables, dataSourceOptions, freshSchema, sqlClient } from './support/database.js';
import { keyTableOptions } from './support/key-table.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A stand-in for another system: it honours its own idempotency keys, and counts real charges. */
class FakeProvider {
  charges = new Map<string, { id: string; amount: number }>();
  calls = 0;
  charge(amount: number, idempotencyKey: string) {
    this.calls++;
    const existing = this.charges.get(idempotencyKey);
    if (existing) return existing;
    const created = { id: `pay_${this.charges.size + 1}`, amount };
    this.charges.set(idempotencyKey, created);
    return created;
  }
}

@Injectable()
class Orders {
  constructor(private readonly tx: TransactionHost) {}
  async create(label: string): Promise<string> {
    const [row] = (await this.tx.manager.query('INSERT INTO effects (tenant, label) VALUES ($1, $2) RETURNING id', [
      'order',
      label,
    ])) as Array<{ id: string }>;
    return row.id;
  }
}

describe('partial failure: phases, derived keys and the outbox', () => {
  let app: INestApplicationContext;
  let service: IdempotencyService;
  let orders: Orders;
  let outbox: Outbox;
  let relay: OutboxRelay;
  let keys: DownstreamKeys;
  let db: pg.Client;
  let n = 0;
  const fresh = () => `pf-${Date.now()}-${++n}`;
  const count = async (sql: string, params: unknown[] = []) => Number((await db.query(sql, params)).rows[0].count);
  const effects = (label: string, tenant = 'order') =>
    count('SELECT count(*) FROM effects WHERE label = $1 AND tenant = $2', [label, tenant]);

  beforeAll(async () => {
    const schema = await freshSchema('partial_failure');
    await createTables(schema);
    await createOutboxTable(schema);
    @Module({
      imports: [
        TypeOrmModule.forRoot({ ...dataSourceOptions(schema), retryAttempts: 0 }),
        IdempotencyModule.forRoot({
          tenant: () => 't',
          sweep: false,
          lease: 600,
          // These tests outrun leases on purpose (as a stalled process would); a heartbeat would keep them.
          heartbeat: false,
          outbox: { relay: false },
          ...keyTableOptions(),
        }),
      ],
      providers: [Orders],
    })
    class PartialFailureModule {}
    app = await NestFactory.createApplicationContext(PartialFailureModule, { logger: false });
    service = app.get(IdempotencyService);
    orders = app.get(Orders);
    outbox = app.get(Outbox);
    relay = app.get(OutboxRelay);
    keys = app.get(DownstreamKeys);
    db = await sqlClient(schema);
  });
  afterAll(async () => {
    await app?.close();
    await db?.end();
  });

  /** A checkout written as phases: order (local write), charge (foreign call with a derived key), receipt (outbox). */
  function checkout(label: string, provider: FakeProvider, crashAfter?: string, ran: string[] = []) {
    return service.executePhased({ tenant: 't', key: `checkout-${label}`, payload: { label } }, async (phases) => {
      const orderId = await phases.run('create-order', async () => {
        ran.push('create-order');
        return orders.create(label);
      });
      if (crashAfter === 'create-order') throw new Error('crash after create-order');
      const payment = await phases.run('charge', () => {
        ran.push('charge');
        return provider.charge(100, phases.key('charge'));
      });
      if (crashAfter === 'charge') throw new Error('crash after charge');
      await phases.run('receipt', async (tx: EntityManager) => {
        ran.push('receipt');
        await outbox.enqueue('receipt', { orderId, paymentId: payment.id, label }, { manager: tx });
      });
      if (crashAfter === 'receipt') throw new Error('crash after receipt');
      return { orderId, paymentId: payment.id, resumed: phases.resumed };
    });
  }

  const expireLease = (label: string) =>
    db.query(`UPDATE idempotency_keys SET lease_expires_at = now() - interval '1 second' WHERE key = $1`, [`checkout-${label}`]);

  it.each(['create-order', 'charge', 'receipt'])(
    'a crash after %s: the retry resumes there; one order, one provider charge, one receipt',
    async (crashAfter) => {
      const label = fresh();
      const provider = new FakeProvider();
      await expect(checkout(label, provider, crashAfter)).rejects.toThrow(`crash after ${crashAfter}`);
      const point = (await db.query('SELECT recovery_point FROM idempotency_keys WHERE key = $1', [`checkout-${label}`])).rows[0];
      expect(point.recovery_point).toBe(crashAfter);
      // Within the lease the key is still held by the crashed attempt.
      await expect(checkout(label, provider)).rejects.toBeInstanceOf(KeyInFlightError);
      await expireLease(label);
      const ran: string[] = [];
      const result = await checkout(label, provider, undefined, ran);
      const phasesInOrder = ['create-order', 'charge', 'receipt'];
      expect(ran).toEqual(phasesInOrder.slice(phasesInOrder.indexOf(crashAfter) + 1));
      expect(result).toMatchObject({ paymentId: 'pay_1', resumed: true });
      expect(await effects(label)).toBe(1);
      expect(provider.charges.size).toBe(1);
      expect(await count(`SELECT count(*) FROM outbox_messages WHERE payload LIKE $1`, [`%"label":"${label}"%`])).toBe(1);
      // And a later call replays the stored result without running anything.
      const again: string[] = [];
      expect(await checkout(label, provider, undefined, again)).toEqual(result);
      expect(again).toEqual([]);
    },
  );

  it('a foreign call repeated after a crash inside its phase reuses the derived key, so the provider charges once', async () => {
    const label = fresh();
    const provider = new FakeProvider();
    // The provider call succeeds but the phase never records it (the process "dies" before commit).
    await expect(
      service.executePhased({ tenant: 't', key: `checkout-${label}`, payload: { label } }, async (phases) => {
        await phases.run('create-order', () => orders.create(label));
        await phases.run('charge', () => {
          provider.charge(100, phases.key('charge'));
          throw new Error('died before the phase committed');
        });
      }),
    ).rejects.toThrow('died before');
    await expireLease(label);
    const result = await checkout(label, provider);
    expect(provider.calls).toBe(2);
    expect(provider.charges.size).toBe(1);
    expect(result.paymentId).toBe('pay_1');
    expect(await effects(label)).toBe(1);
  });

  it('a takeover while the original still runs: the original loses its fence, its phase writes are rolled back', async () => {
    const label = fresh();
    const slowOriginal = service
      .executePhased({ tenant: 't', key: `takeover-${label}`, payload: 1 }, async (phases) => {
        await phases.run('one', () => orders.create(`${label}-one`));
        await phases.run('two', async () => {
          await orders.create(`${label}-two`);
          await sleep(1500); // far past the 600 ms lease
        });
        return 'original';
      })
      .catch((error: unknown) => error);
    await sleep(900);
    const ran: string[] = [];
    const takeover = await service.executePhased({ tenant: 't', key: `takeover-${label}`, payload: 1 }, async (phases) => {
      await phases.run('one', () => {
        ran.push('one');
        return orders.create(`${label}-one`);
      });
      await phases.run('two', () => {
        ran.push('two');
        return orders.create(`${label}-two`);
      });
      return 'takeover';
    });
    expect(takeover).toBe('takeover');
    expect(ran).toEqual(['two']);
    expect(await slowOriginal).toBeInstanceOf(LeaseLostError);
    expect(await effects(`${label}-one`)).toBe(1);
    expect(await effects(`${label}-two`)).toBe(1);
  });

  it('each recorded phase renews the lease, so a long handler that keeps progressing keeps its key', async () => {
    const label = fresh();
    const running = service.executePhased({ tenant: 't', key: `renew-${label}`, payload: 1 }, async (phases) => {
      for (const step of ['a', 'b', 'c', 'd', 'e']) await phases.run(step, () => sleep(250));
      return 'done';
    });
    await sleep(1000); // beyond one 600 ms lease, but phases keep renewing it
    await expect(
      service.executePhased({ tenant: 't', key: `renew-${label}`, payload: 1 }, () => 'intruder'),
    ).rejects.toBeInstanceOf(KeyInFlightError);
    expect(await running).toBe('done');
  });

  it("onError: 'release' keeps a key whose phases are recorded, so a retry cannot redo them", async () => {
    const label = fresh();
    const provider = new FakeProvider();
    const input = { tenant: 't', key: `checkout-${label}`, payload: { label }, onError: 'release' as const };
    await expect(
      service.executePhased(input, async (phases) => {
        await phases.run('create-order', () => orders.create(label));
        throw new Error('boom');
      }),
    ).rejects.toThrow('boom');
    expect(await count('SELECT count(*) FROM idempotency_keys WHERE key = $1', [`checkout-${label}`])).toBe(1);
    await expireLease(label);
    await checkout(label, provider);
    expect(await effects(label)).toBe(1);
  });

  it('DownstreamKeys: the same key for every attempt of one use of a key (takeovers too), a new one once it expired', async () => {
    const key = `derive-${fresh()}`;
    const input = { tenant: 't', key, payload: 1 };
    const seen: string[] = [];
    const lapse = (column: 'lease_expires_at' | 'expires_at') =>
      db.query(`UPDATE idempotency_keys SET ${column} = now() - interval '1 second' WHERE key = $1`, [key]);
    // Attempt 1 fails with its outcome unknown (onError 'keep'); attempt 2 takes the key over once the lease lapsed.
    await expect(
      service.execute(input, () => {
        seen.push(keys.derive('charge'));
        throw new Error('provider timed out');
      }),
    ).rejects.toThrow('provider timed out');
    await lapse('lease_expires_at');
    await service.execute(input, () => seen.push(keys.derive('charge')));
    expect(seen[1]).toBe(seen[0]);
    // The key is reused for new work after it expired (swept or not): a provider must not see a retry of the old charge.
    await lapse('expires_at');
    await service.execute(input, () => seen.push(keys.derive('charge')));
    expect(seen[2]).not.toBe(seen[0]);
    await db.query('DELETE FROM idempotency_keys WHERE key = $1', [key]);
    await service.execute(input, () => seen.push(keys.derive('charge')));
    expect(new Set(seen).size).toBe(3);
    expect(() => keys.derive('charge')).toThrow(/outside an idempotent request/);
  });

  describe('outbox', () => {
    const delivered: Array<OutboxMessage<{ label: string }>> = [];
    let failuresLeft = new Map<string, number>();

    beforeAll(() => {
      relay.handle<{ label: string }>('receipt', (message) => {
        delivered.push(message);
      });
      relay.handle<{ label: string }>('flaky', (message) => {
        const left = failuresLeft.get(message.payload.label) ?? 0;
        if (left > 0) {
          failuresLeft.set(message.payload.label, left - 1);
          throw new Error('smtp timeout');
        }
        delivered.push(message);
      });
    });

    const pending = async () => count(`SELECT count(*) FROM outbox_messages WHERE status = 'pending'`);

    it('a message is written with the business change and rolled back with it', async () => {
      const label = fresh();
      await expect(
        service.execute({ tenant: 't', key: `ob-${label}`, payload: 1 }, async () => {
          await outbox.enqueue('receipt', { label });
          throw new Error('business change failed');
        }),
      ).rejects.toThrow();
      await service.execute({ tenant: 't', key: `ob-ok-${label}`, payload: 1 }, () => outbox.enqueue('receipt', { label }));
      const rows = await db.query(`SELECT tenant_id, status FROM outbox_messages WHERE payload = $1`, [
        JSON.stringify({ label }),
      ]);
      expect(rows.rows).toEqual([{ tenant_id: 't', status: 'pending' }]);
      await relay.drain();
      expect(delivered.filter((m) => m.payload.label === label)).toHaveLength(1);
      expect(await pending()).toBe(0);
    });

    it('retries with backoff, then dead-letters after maxAttempts; redrive puts it back', async () => {
      const label = fresh();
      failuresLeft = new Map([[label, 100]]);
      const id = await outbox.enqueue('flaky', { label }, { manager: undefined });
      // The module's default is 10 attempts; make attempts due at once instead of waiting for the backoff.
      for (let i = 0; i < 12; i++) {
        await db.query(`UPDATE outbox_messages SET available_at = now() WHERE id = $1`, [id]);
        await relay.relayOnce();
      }
      const row = (
        await db.query('SELECT status, attempts, last_error, available_at > now() AS later FROM outbox_messages WHERE id = $1', [
          id,
        ])
      ).rows[0];
      expect(row).toMatchObject({ status: 'dead', attempts: 10, last_error: 'smtp timeout' });
      failuresLeft.set(label, 0);
      expect(await outbox.store.redrive([id])).toBe(1);
      await relay.drain();
      expect(delivered.filter((m) => m.payload.label === label)).toHaveLength(1);
    });

    it('a failed delivery is not retried before its backoff', async () => {
      const label = fresh();
      failuresLeft = new Map([[label, 1]]);
      const id = await outbox.enqueue('flaky', { label });
      expect(await relay.relayOnce()).toMatchObject({ claimed: 1, retried: 1 });
      expect(await relay.relayOnce()).toMatchObject({ claimed: 0 });
      const row = (await db.query('SELECT attempts, available_at > now() AS later FROM outbox_messages WHERE id = $1', [id]))
        .rows[0];
      expect(row).toEqual({ attempts: 1, later: true });
      // Its retry falls due within a second: it must not land in a later test's batch.
      await db.query('DELETE FROM outbox_messages WHERE id = $1', [id]);
    });

    it('several relays in parallel never claim the same message', async () => {
      const label = fresh();
      await service.execute({ tenant: 't', key: `bulk-${label}`, payload: 1 }, async () => {
        for (let i = 0; i < 300; i++) await outbox.enqueue('receipt', { label, i });
      });
      const lockers = Array.from({ length: 4 }, () => outbox.store);
      const claimedIds: string[] = [];
      await Promise.all(
        lockers.map(async (store) => {
          for (;;) {
            const batch = await store.claim(7, 60_000, crypto.randomUUID());
            if (batch.messages.length === 0) return;
            for (const m of batch.messages) {
              claimedIds.push(m.id);
              await store.markDelivered(m.id, batch.lockToken);
            }
          }
        }),
      );
      const mine = await count(`SELECT count(*) FROM outbox_messages WHERE payload LIKE $1`, [`%"label":"${label}"%`]);
      expect(mine).toBe(300);
      expect(claimedIds).toHaveLength(300);
      expect(new Set(claimedIds).size).toBe(300);
      expect(
        await count(`SELECT count(*) FROM outbox_messages WHERE payload LIKE $1 AND status = 'pending'`, [
          `%"label":"${label}"%`,
        ]),
      ).toBe(0);
    });

    it('a relay that dies mid-delivery: the message is delivered again once its lock times out (at least once)', async () => {
      const label = fresh();
      await outbox.enqueue('receipt', { label });
      const dead = await outbox.store.claim(10, 300, crypto.randomUUID());
      expect(dead.messages.map((m) => m.payload)).toContainEqual({ label });
      // The dead relay never settles; another relay finds nothing until the lock times out.
      expect((await relay.relayOnce()).claimed).toBe(0);
      await sleep(400);
      await relay.drain();
      const copies = delivered.filter((m) => m.payload.label === label);
      expect(copies).toHaveLength(1);
      expect(copies[0].attempt).toBe(2);
      // The dead relay's late settlement is refused: the message was settled by the other one.
      expect(await outbox.store.markDelivered(copies[0].id, dead.lockToken)).toBe(false);
    });
  });
});
