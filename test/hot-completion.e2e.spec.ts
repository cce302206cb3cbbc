import { describe, expect, it } from '@jest/globals';
import { Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { TypeOrmModule } from '@nestjs/typeorm';
import type pg from 'pg';
import { IdempotencyModule, IdempotencyService } from '../src/index.js';
import { createTableStatements } from '../src/store/sql.js';
import {
  createPartitionedTableStatements,
  DEFAULT_PARTITION_LAYOUT,
} from '../src/store/partitioned/partitioned-key-table.sql.js';
import { dataSourceOptions, freshSchema, sqlClient } from './support/database.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** What a payment API answers: about 300 bytes of JSON. */
const charge = (i: number) => ({
  id: `ch_${i.toString(16).padStart(24, '0')}`,
  object: 'charge',
  amount: 1000 + i,
  currency: 'usd',
  customer: `cus_${i % 97}`,
  description: null,
  metadata: { order: `ord_${i}` },
  status: 'succeeded',
  created: new Date(1_765_000_000_000 + i).toISOString(),
});

/**
 * Updates of the key table (all its partitions) and how many were HOT, as
 * the statistics say once every backend that wrote has reported. Backends
 * report when idle, at most once a second, and when they exit: the app's
 * pool is closed before this is read, and it waits for `expected` updates.
 */
async function updatesOf(db: pg.Client, expected: number): Promise<{ updates: number; hot: number }> {
  const read = async () => {
    await db.query('SELECT pg_stat_force_next_flush()');
    const { rows } = await db.query<{ updates: string; hot: string }>(
      `SELECT coalesce(sum(n_tup_upd), 0) AS updates, coalesce(sum(n_tup_hot_upd), 0) AS hot FROM pg_stat_user_tables
        WHERE relid = 'idempotency_keys'::regclass
           OR relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'idempotency_keys'::regclass)`,
    );
    return { updates: Number(rows[0].updates), hot: Number(rows[0].hot) };
  };
  let counted = await read();
  for (let i = 0; i < 100 && counted.updates < expected; i++) {
    await sleep(100);
    counted = await read();
  }
  return counted;
}

/** Runs `keys` new keys through IdempotencyService.execute, `concurrency` at a time, against the key table in `schema`. */
async function completeNewKeys(schema: string, keys: number, concurrency: number, partitioned: boolean): Promise<void> {
  @Module({
    imports: [
      TypeOrmModule.forRoot({ ...dataSourceOptions(schema), retryAttempts: 0 }),
      IdempotencyModule.forRoot({ tenant: () => 'tenant-a', sweep: false, partitioned }),
    ],
  })
  class App {}
  const app = await NestFactory.createApplicationContext(App, { logger: false });
  try {
    const service = app.get(IdempotencyService);
    let next = 0;
    const worker = async () => {
      for (let i = next++; i < keys; i = next++) {
        await service.execute({ tenant: 'tenant-a', key: `hot-${i}`, payload: { amount: i } }, () => charge(i));
      }
    };
    await Promise.all(Array.from({ length: concurrency }, worker));
  } finally {
    // Its connections end, and with them every backend reports its statistics.
    await app.close();
  }
}

describe.each([
  ['plain', false, () => createTableStatements('idempotency_keys')],
  ['partitioned', true, () => createPartitionedTableStatements('idempotency_keys', DEFAULT_PARTITION_LAYOUT)],
] as const)('completions on the %s key table', (layout, partitioned, statements) => {
  const freshTable = async (name: string, ...after: string[]) => {
    const schema = await freshSchema(`hot_${name}_${layout}`);
    const db = await sqlClient(schema);
    for (const statement of [...statements(), ...after]) await db.query(statement);
    return { schema, db };
  };

  it('are HOT updates: a new key writes no index entry at its completion', async () => {
    const keys = 200;
    const { schema, db } = await freshTable('one_by_one');
    try {
      await completeNewKeys(schema, keys, 1, partitioned);
      const { updates, hot } = await updatesOf(db, keys);
      console.log(`${layout}, one key at a time: ${hot} HOT of ${updates} updates for ${keys} new keys`);
      expect(updates).toBe(keys);
      expect(hot).toBe(keys);
    } finally {
      await db.end();
    }
  });

  it('stay HOT when new keys are completed concurrently', async () => {
    const keys = 400;
    const { schema, db } = await freshTable('concurrent');
    try {
      await completeNewKeys(schema, keys, 8, partitioned);
      const { updates, hot } = await updatesOf(db, keys);
      console.log(`${layout}, 8 keys at a time: ${hot} HOT of ${updates} updates for ${keys} new keys`);
      expect(updates).toBe(keys);
      expect(hot / updates).toBeGreaterThanOrEqual(0.9);
    } finally {
      await db.end();
    }
  });

  it('are not HOT with an index on expires_at, as earlier versions had (what the measure above tells apart)', async () => {
    const keys = 50;
    const { schema, db } = await freshTable(
      'expires_at_index',
      'CREATE INDEX earlier_expires_at_idx ON idempotency_keys (expires_at)',
    );
    try {
      await completeNewKeys(schema, keys, 1, partitioned);
      const { updates, hot } = await updatesOf(db, keys);
      expect(updates).toBe(keys);
      expect(hot).toBe(0);
    } finally {
      await db.end();
    }
  });
});
