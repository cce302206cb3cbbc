import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import { Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ScheduleModule } from '@nestjs/schedule';
import { TypeOrmModule } from '@nestjs/typeorm';
import { randomUUID } from 'node:crypto';
import type pg from 'pg';
import { IdempotencyModule } from '../src/index.js';
import { Outbox, OutboxRelay, type OutboxRelayOptions } from '../src/outbox/index.js';
import { RoundLock } from '../src/outbox/round-lock.js';
import { waitFor } from './support/brokers.js';
import { createOutboxTable, createTables, dataSourceOptions, freshSchema, sqlClient } from './support/database.js';
import { sleep } from './support/http.js';

const LOCK_MS = 3_000;
const DELIVERY_TIMEOUT_MS = 1_500;
/** A slow provider: each delivery takes this long, well within deliveryTimeout. */
const DELIVERY_MS = 500;
const BATCH = 8;

/** One delivery at a time: a round of BATCH slow deliveries lasts longer than the lock its claim took. */
const RELAY: OutboxRelayOptions = {
  interval: '1h',
  batchSize: BATCH,
  concurrency: 1,
  lockTimeout: LOCK_MS,
  deliveryTimeout: DELIVERY_TIMEOUT_MS,
};

async function startRelay(schema: string) {
  @Module({
    imports: [
      ScheduleModule.forRoot(),
      TypeOrmModule.forRoot({ ...dataSourceOptions(schema), retryAttempts: 0 }),
      IdempotencyModule.forRoot({ tenant: () => 't', sweep: false, outbox: { relay: RELAY } }),
    ],
  })
  class RelayModule {}
  const app = await NestFactory.createApplicationContext(RelayModule, { logger: false });
  return { app, outbox: app.get(Outbox), relay: app.get(OutboxRelay) };
}

/** Deliveries per message id across every relay of the test: how many so far, how many at once at most. */
class DeliveryLog {
  readonly count = new Map<string, number>();
  readonly maxAtOnce = new Map<string, number>();
  private readonly running = new Map<string, number>();
  firstStarted!: Promise<void>;
  private started!: () => void;

  constructor() {
    this.firstStarted = new Promise((resolve) => (this.started = resolve));
  }

  async deliver(id: string): Promise<void> {
    const now = (this.running.get(id) ?? 0) + 1;
    this.running.set(id, now);
    this.maxAtOnce.set(id, Math.max(now, this.maxAtOnce.get(id) ?? 0));
    this.count.set(id, (this.count.get(id) ?? 0) + 1);
    this.started();
    try {
      await sleep(DELIVERY_MS);
    } finally {
      this.running.set(id, (this.running.get(id) ?? 1) - 1);
    }
  }
}

/**
 * The relay's lock covers its whole round. A round locks its batch once but
 * delivers it in turn; with slow deliveries the round outlasts `lockTimeout`,
 * and without renewal a second relay would claim the end of the batch and
 * send those messages while the first still does.
 */
describe('outbox relay: a round longer than its lock', () => {
  let schema: string;
  let db: pg.Client;
  let relays: Array<Awaited<ReturnType<typeof startRelay>>>;

  beforeAll(async () => {
    schema = await freshSchema('outbox_round_lock');
    await createTables(schema);
    await createOutboxTable(schema);
    db = await sqlClient(schema);
  });
  beforeEach(async () => {
    await db.query('DELETE FROM outbox_messages');
  });
  afterEach(async () => {
    await Promise.all(relays?.splice(0).map(({ app }) => app.close()) ?? []);
  });
  afterAll(async () => {
    await db?.end();
  });

  it('two relays and slow deliveries: no message is ever delivered by both at once, each is delivered once', async () => {
    const log = new DeliveryLog();
    relays = [await startRelay(schema), await startRelay(schema)];
    for (const { relay } of relays) relay.handle('email', (message) => log.deliver(message.id));
    const [a, b] = relays;
    const ids: string[] = [];
    for (let i = 0; i < BATCH; i++) ids.push(await a.outbox.enqueue('email', { i }));

    // Relay A claims the whole batch (BATCH × DELIVERY_MS = 4 s of deliveries, against a 3 s lock)...
    const roundA = a.relay.relayOnce();
    await log.firstStarted;
    // ...while relay B keeps looking for due messages, as a second instance on its schedule would.
    const delivered = async () =>
      Number((await db.query(`SELECT count(*) FROM outbox_messages WHERE status = 'delivered'`)).rows[0].count) === BATCH;
    const claimedByB: number[] = [];
    expect(
      await waitFor(async () => {
        claimedByB.push((await b.relay.relayOnce()).claimed);
        return delivered();
      }, 30_000),
    ).toBe(true);
    const reportA = await roundA;

    expect(ids.filter((id) => log.maxAtOnce.get(id) !== 1)).toEqual([]);
    expect(ids.map((id) => log.count.get(id))).toEqual(ids.map(() => 1));
    expect(reportA).toMatchObject({ claimed: BATCH, delivered: BATCH, lostLocks: 0, skipped: 0 });
    expect(claimedByB.filter((n) => n > 0)).toEqual([]);
  });

  describe('RoundLock', () => {
    const lockedUntil = async (id: string) =>
      (await db.query('SELECT lock_token, locked_until > now() AS locked FROM outbox_messages WHERE id = $1', [id])).rows[0];

    it('a lapsed lock that no other relay took is renewed before the delivery: the message is still held', async () => {
      relays = [await startRelay(schema)];
      const [{ outbox }] = relays;
      const id = await outbox.enqueue('email', {});
      const claim = await outbox.store.claim(10, LOCK_MS, randomUUID());
      await db.query('UPDATE outbox_messages SET locked_until = now() WHERE id = $1', [id]);
      // Claimed a whole lock ago, as a round that ran past its lock (a stalled process) would be.
      const lock = new RoundLock(outbox.store, claim.lockToken, LOCK_MS, DELIVERY_TIMEOUT_MS, [id], RoundLock.now() - LOCK_MS);
      expect(await lock.hold(id)).toBe('held');
      expect(await lockedUntil(id)).toEqual({ lock_token: claim.lockToken, locked: true });
    });

    it('a lapsed lock another relay took meanwhile is lost: the message is not delivered by this round', async () => {
      relays = [await startRelay(schema)];
      const [{ outbox }] = relays;
      const id = await outbox.enqueue('email', {});
      const first = await outbox.store.claim(10, LOCK_MS, randomUUID());
      await db.query('UPDATE outbox_messages SET locked_until = now() WHERE id = $1', [id]);
      const second = await outbox.store.claim(10, LOCK_MS, randomUUID());
      expect(second.messages.map((m) => m.id)).toEqual([id]);
      const lock = new RoundLock(outbox.store, first.lockToken, LOCK_MS, DELIVERY_TIMEOUT_MS, [id], RoundLock.now() - LOCK_MS);
      expect(await lock.hold(id)).toBe('lost');
      expect(await lockedUntil(id)).toEqual({ lock_token: second.lockToken, locked: true });
    });

    it('a message settled in the round is not locked again by a later renewal', async () => {
      relays = [await startRelay(schema)];
      const [{ outbox }] = relays;
      const settled = await outbox.enqueue('email', { n: 1 });
      const next = await outbox.enqueue('email', { n: 2 });
      const claim = await outbox.store.claim(10, LOCK_MS, randomUUID());
      // Its delivery failed and a retry is scheduled: the row has no lock, and must keep none until the retry's claim.
      expect(await outbox.store.markFailed(settled, claim.lockToken, 'smtp timeout', 60_000)).toBe(true);
      // A renewal is due (the lock was set long ago) and, as far as this lock knows, both are still the round's.
      const lock = new RoundLock(
        outbox.store,
        claim.lockToken,
        LOCK_MS,
        DELIVERY_TIMEOUT_MS,
        [settled, next],
        RoundLock.now() - LOCK_MS,
      );
      expect(await lock.hold(next)).toBe('held');
      expect(await lockedUntil(next)).toEqual({ lock_token: claim.lockToken, locked: true });
      expect(await lockedUntil(settled)).toEqual({ lock_token: claim.lockToken, locked: null });
      expect(await lock.hold(settled)).toBe('lost');
    });
  });
});
