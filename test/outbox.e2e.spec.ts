import { afterAll, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import { Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { TypeOrmModule } from '@nestjs/typeorm';
import { randomUUID } from 'node:crypto';
import { inspect } from 'node:util';
import type pg from 'pg';
import type { Logger as TypeOrmLogger } from 'typeorm';
import { ScheduleModule } from '@nestjs/schedule';
import { IdempotencyConfigurationError, IdempotencyModule } from '../src/index.js';
import { Outbox, OutboxRelay, type OutboxRelayOptions } from '../src/outbox/index.js';
import { resolveIdempotencyOptions } from '../src/resolve-options.js';
import { createOutboxTable, createTables, dataSourceOptions, freshSchema, sqlClient } from './support/database.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Everything TypeORM logs, rendered in full (errors with their properties). */
class CapturingTypeOrmLogger implements TypeOrmLogger {
  readonly lines: string[] = [];
  private capture(...args: unknown[]) {
    this.lines.push(inspect(args, { depth: Infinity, maxStringLength: Infinity, breakLength: Infinity }));
  }
  logQuery(...args: unknown[]) {
    this.capture(...args.slice(0, 2));
  }
  logQueryError(...args: unknown[]) {
    this.capture(...args.slice(0, 3));
  }
  logQuerySlow(...args: unknown[]) {
    this.capture(...args.slice(0, 3));
  }
  logSchemaBuild() {}
  logMigration() {}
  log() {}
}

const DELIVERY_TIMEOUT_MS = 300;
const MAX_ATTEMPTS = 3;

/** The relay's settings in these tests: a short deliveryTimeout, few attempts, one delivery at a time. */
const RELAY: OutboxRelayOptions = {
  // Rounds are run by the tests (relayOnce); the schedule never ticks during a test.
  interval: '1h',
  deliveryTimeout: DELIVERY_TIMEOUT_MS,
  lockTimeout: '5s',
  maxAttempts: MAX_ATTEMPTS,
  concurrency: 1,
};

async function startOutboxApp(schema: string, logger?: TypeOrmLogger) {
  @Module({
    imports: [
      ScheduleModule.forRoot(),
      TypeOrmModule.forRoot({ ...dataSourceOptions(schema, { logger, logging: logger ? 'all' : false }), retryAttempts: 0 }),
      IdempotencyModule.forRoot({ tenant: () => 't', sweep: false, outbox: { relay: RELAY } }),
    ],
  })
  class OutboxTestModule {}
  const app = await NestFactory.createApplicationContext(OutboxTestModule, { logger: false });
  return { app, outbox: app.get(Outbox), relay: app.get(OutboxRelay) };
}

describe('outbox relay: bounded deliveries and settlement failures', () => {
  let schema: string;
  let db: pg.Client;
  /** Deliveries each handler saw, by payload label. */
  const seen = new Map<string, number>();
  const signals: AbortSignal[] = [];
  const record = (label: string) => seen.set(label, (seen.get(label) ?? 0) + 1);
  const row = async (id: string) =>
    (
      await db.query(
        `SELECT status, attempts, last_error, available_at > now() AS later, locked_until > now() AS locked
           FROM outbox_messages WHERE id = $1`,
        [id],
      )
    ).rows[0];

  beforeAll(async () => {
    schema = await freshSchema('outbox_relay');
    await createTables(schema);
    await createOutboxTable(schema);
    db = await sqlClient(schema);
  });
  afterAll(async () => {
    await db?.end();
  });
  beforeEach(async () => {
    await db.query('DELETE FROM outbox_messages');
    seen.clear();
    signals.length = 0;
  });

  describe('one relay, rounds run by the test', () => {
    let timed: Awaited<ReturnType<typeof startOutboxApp>>;
    const lateResolvers: Array<() => void> = [];

    beforeAll(async () => {
      timed = await startOutboxApp(schema);
      timed.relay.handle<{ label: string }>('receipt', (m) => {
        record(m.payload.label);
      });
      timed.relay.handle<{ label: string }>('hang', (m, signal) => {
        record(m.payload.label);
        signals.push(signal);
        return new Promise<void>(() => undefined); // never settles, ignores the signal
      });
      timed.relay.handle<{ label: string }>('late', (m) => {
        record(m.payload.label);
        // Settles, successfully, but only after the timeout (first attempt only).
        if ((seen.get(m.payload.label) ?? 0) > 1) return;
        return new Promise<void>((resolve) => lateResolvers.push(resolve));
      });
    });
    afterAll(async () => {
      lateResolvers.forEach((resolve) => resolve());
      await timed?.app.close();
    });

    it('a hung handler: the round returns, the message is scheduled for retry, the next message is still delivered', async () => {
      const hung = await timed.outbox.enqueue('hang', { label: 'hung-1' });
      const next = await timed.outbox.enqueue('receipt', { label: 'after-hung-1' });
      const report = await timed.relay.relayOnce();
      expect(report).toMatchObject({ claimed: 2, delivered: 1, retried: 1, timedOut: 1, deadLettered: 0 });
      expect(seen.get('after-hung-1')).toBe(1);
      expect(await row(next)).toMatchObject({ status: 'delivered' });
      expect(await row(hung)).toMatchObject({ status: 'pending', attempts: 1, later: true, locked: null });
      expect((await row(hung)).last_error).toMatch(/deliveryTimeout/);
      // The handler was told to stop.
      expect(signals).toHaveLength(1);
      expect(signals[0].aborted).toBe(true);
      expect((signals[0].reason as DOMException).name).toBe('TimeoutError');
    });

    it('later rounds are not stalled by a handler that still hangs, and timeouts dead-letter after maxAttempts', async () => {
      const hung = await timed.outbox.enqueue('hang', { label: 'hung-2' });
      for (let round = 1; round <= MAX_ATTEMPTS; round++) {
        const fresh = await timed.outbox.enqueue('receipt', { label: `round-${round}` });
        await db.query('UPDATE outbox_messages SET available_at = now() WHERE id = $1', [hung]);
        const report = await timed.relay.relayOnce();
        expect(report).toMatchObject({ claimed: 2, delivered: 1, timedOut: 1 });
        expect(await row(fresh)).toMatchObject({ status: 'delivered' });
      }
      expect(seen.get('hung-2')).toBe(MAX_ATTEMPTS);
      expect(await row(hung)).toMatchObject({ status: 'dead', attempts: MAX_ATTEMPTS });
    });

    it('a message whose last attempt never settled and has no attempt left is dead-lettered undelivered, its last failure kept', async () => {
      const id = await timed.outbox.enqueue('receipt', { label: 'exhausted-1' });
      // Earlier failures were recorded, then the last attempt's relay died: every attempt spent, the lock run out.
      await db.query(`UPDATE outbox_messages SET attempts = $2, last_error = 'smtp timeout' WHERE id = $1`, [id, MAX_ATTEMPTS]);
      expect(await timed.relay.relayOnce()).toMatchObject({ claimed: 1, deadLettered: 1, delivered: 0, retried: 0 });
      expect(seen.get('exhausted-1')).toBeUndefined();
      const dead = await row(id);
      expect(dead).toMatchObject({ status: 'dead', attempts: MAX_ATTEMPTS, locked: null });
      expect(dead.last_error).toMatch(/attempted 3 times.*without a result.* Last recorded failure: smtp timeout$/);
    });

    it('a handler that finishes after its timeout never marks the message; a later round delivers it', async () => {
      const id = await timed.outbox.enqueue('late', { label: 'late-1' });
      expect(await timed.relay.relayOnce()).toMatchObject({ claimed: 1, retried: 1, timedOut: 1 });
      lateResolvers.splice(0).forEach((resolve) => resolve());
      await sleep(50);
      expect(await row(id)).toMatchObject({ status: 'pending', attempts: 1, later: true });
      // Another relay claims it meanwhile; the first relay's lock token can no longer settle it.
      await db.query('UPDATE outbox_messages SET available_at = now() WHERE id = $1', [id]);
      const other = await timed.outbox.store.claim(10, 5_000, randomUUID());
      expect(other.messages.map((m) => m.id)).toEqual([id]);
      expect(await timed.outbox.store.markDelivered(id, other.lockToken)).toBe(true);
      expect(await row(id)).toMatchObject({ status: 'delivered', attempts: 2 });
    });

    it('a failed "delivered" mark after a successful delivery is not a failed attempt, even on the last attempt', async () => {
      const id = await timed.outbox.enqueue('receipt', { label: 'unsettled-1' });
      await db.query('UPDATE outbox_messages SET attempts = $2 WHERE id = $1', [id, MAX_ATTEMPTS - 1]);
      await refuseDeliveredMarks(db);
      try {
        // Round 1 claims the last allowed attempt; the handler succeeds; the mark fails.
        expect(await timed.relay.relayOnce()).toMatchObject({
          claimed: 1,
          delivered: 0,
          unsettled: 1,
          retried: 0,
          deadLettered: 0,
        });
        expect(await row(id)).toMatchObject({ status: 'pending', attempts: MAX_ATTEMPTS, last_error: null, later: false });
        // Its lock expires while the database still refuses: round 2 claims it again (attempts past the maximum)
        // and, knowing the handler already succeeded, only retries the mark, which fails again.
        await db.query('UPDATE outbox_messages SET locked_until = now() WHERE id = $1', [id]);
        expect(await timed.relay.relayOnce()).toMatchObject({ claimed: 1, delivered: 0, unsettled: 1, deadLettered: 0 });
        expect(await row(id)).toMatchObject({ status: 'pending', last_error: null });
      } finally {
        await allowDeliveredMarks(db);
      }
      // Round 3: the database accepts the mark again.
      expect(await timed.relay.relayOnce()).toMatchObject({ claimed: 0, delivered: 1 });
      expect(await row(id)).toMatchObject({ status: 'delivered', last_error: null });
      expect(seen.get('unsettled-1')).toBe(1);
    });

    it('a late mark is fenced: once another relay has claimed the message again, it is refused and that relay delivers it', async () => {
      const id = await timed.outbox.enqueue('receipt', { label: 'unsettled-2' });
      await refuseDeliveredMarks(db);
      try {
        expect(await timed.relay.relayOnce()).toMatchObject({ claimed: 1, unsettled: 1 });
      } finally {
        await allowDeliveredMarks(db);
      }
      await db.query('UPDATE outbox_messages SET locked_until = now() WHERE id = $1', [id]);
      const other = await timed.outbox.store.claim(10, 5_000, randomUUID());
      expect(other.messages.map((m) => m.id)).toEqual([id]);
      expect(await timed.relay.relayOnce()).toMatchObject({ claimed: 0, delivered: 0, lostLocks: 1 });
      expect(await row(id)).toMatchObject({ status: 'pending' });
      expect(await timed.outbox.store.markDelivered(id, other.lockToken)).toBe(true);
    });
  });

  it('shutdown waits for a round with a hung handler only until its delivery times out', async () => {
    const app2 = await startOutboxApp(schema);
    app2.relay.handle('hang', () => new Promise<void>(() => undefined));
    const id = await app2.outbox.enqueue('hang', { label: 'shutdown' });
    const round = app2.relay.relayOnce();
    await app2.app.close();
    // close() returned, so the round it waited for is over.
    expect(await round).toMatchObject({ claimed: 1, timedOut: 1 });
    // The timed-out delivery was recorded before the data source closed.
    expect(await row(id)).toMatchObject({ status: 'pending', attempts: 1, later: true });
  });

  it('outbox statements are logged without their parameters, and their errors carry no payload', async () => {
    const logger = new CapturingTypeOrmLogger();
    const logged = await startOutboxApp(schema, logger);
    try {
      logged.relay.handle('receipt', () => undefined);
      const secret = `payload-marker-${randomUUID()}`;
      await logged.outbox.enqueue('receipt', { secret });
      expect(await logged.relay.drain()).toMatchObject({ delivered: 1 });
      await db.query(`ALTER TABLE outbox_messages ADD CONSTRAINT no_forbidden CHECK (payload NOT LIKE '%forbidden%')`);
      let error: unknown;
      try {
        await logged.outbox.enqueue('receipt', { secret: `${secret}-forbidden` });
      } catch (caught) {
        error = caught;
      } finally {
        await db.query('ALTER TABLE outbox_messages DROP CONSTRAINT no_forbidden');
      }
      expect(error).toMatchObject({ code: '23514' });
      expect(inspect(error, { depth: Infinity })).not.toContain(secret);
      const logs = logger.lines.join('\n');
      expect(logs).toContain('nest-idempotency:outbox-enqueue');
      expect(logs).toContain('nest-idempotency:outbox-delivered');
      expect(logs).toContain('23514');
      expect(logs).not.toContain(secret);
    } finally {
      await logged.app.close();
    }
  });

  describe('deliveryTimeout option', () => {
    const resolve = (relay: object) => resolveIdempotencyOptions({ tenant: () => 't', outbox: { relay } }).outbox;

    it('defaults to 30 s, or half of a shorter lockTimeout', () => {
      expect(resolve({}).deliveryTimeoutMs).toBe(30_000);
      expect(resolve({ lockTimeout: '10s' }).deliveryTimeoutMs).toBe(5_000);
      expect(resolve({ deliveryTimeout: '2s' }).deliveryTimeoutMs).toBe(2_000);
    });

    it('must be shorter than lockTimeout, with a message that says how to fix it', () => {
      expect(() => resolve({ deliveryTimeout: '60s' })).toThrow(IdempotencyConfigurationError);
      expect(() => resolve({ deliveryTimeout: '20s', lockTimeout: '10s' })).toThrow(
        /deliveryTimeout.*20000 ms.*shorter than.*lockTimeout.*10000 ms.*Lower deliveryTimeout or raise lockTimeout/s,
      );
      expect(() => resolve({ deliveryTimeout: '30' })).toThrow(IdempotencyConfigurationError);
    });
  });
});

/** Makes the outbox table refuse every "delivered" mark, as a database error would. */
async function refuseDeliveredMarks(db: pg.Client): Promise<void> {
  await db.query(`CREATE OR REPLACE FUNCTION refuse_delivered() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN RAISE EXCEPTION 'delivered marks are refused for this test'; END $$`);
  await db.query(`CREATE TRIGGER refuse_delivered BEFORE UPDATE ON outbox_messages
    FOR EACH ROW WHEN (NEW.status = 'delivered') EXECUTE FUNCTION refuse_delivered()`);
}

async function allowDeliveredMarks(db: pg.Client): Promise<void> {
  await db.query('DROP TRIGGER IF EXISTS refuse_delivered ON outbox_messages');
}
