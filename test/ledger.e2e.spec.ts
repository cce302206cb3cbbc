import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Module, type INestApplicationContext } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { TypeOrmModule, type TypeOrmModuleOptions } from '@nestjs/typeorm';
import type pg from 'pg';
import { DataSource } from 'typeorm';
import {
  IdempotencyConfigurationError,
  IdempotencyModule,
  IdempotencyService,
  runMigrationsWithLock,
  type IdempotencyModuleOptions,
} from '../src/index.js';
import {
  CreateEffectLedger1764806400000,
  createEffectLedgerMigration,
  EffectLedger,
  EffectLedgerUsageError,
} from '../src/ledger/index.js';
import { createEffectLedgerStatements, LEDGER_TABLE_COLUMNS } from '../src/ledger/effect-ledger.sql.js';
import { createTables, dataSourceOptions, DataSourceTracker, freshSchema, sqlClient } from './support/database.js';

// A bootstrap that fails leaves no app to close, so the data sources it opened are closed at the end.
const dataSources = new DataSourceTracker();
afterAll(() => dataSources.closeAll());

async function boot(schema: string, options: Partial<IdempotencyModuleOptions> = {}): Promise<INestApplicationContext> {
  @Module({
    imports: [
      TypeOrmModule.forRootAsync({
        useFactory: () => ({ ...dataSourceOptions(schema), retryAttempts: 0 }) as TypeOrmModuleOptions,
        dataSourceFactory: dataSources.factory(),
      }),
      IdempotencyModule.forRoot({ tenant: () => 'unused', sweep: false, ...options }),
    ],
  })
  class LedgerTestModule {}
  return NestFactory.createApplicationContext(LedgerTestModule, { logger: false, abortOnError: false });
}

describe('EffectLedger', () => {
  let app: INestApplicationContext;
  let ledger: EffectLedger;
  let service: IdempotencyService;
  let dataSource: DataSource;
  let db: pg.Client;
  let n = 0;
  const fresh = () => `order:${Date.now()}-${++n}:capture`;
  const rows = async (key: string) =>
    (await db.query('SELECT tenant_id, scope FROM effect_ledger WHERE key = $1 ORDER BY tenant_id, scope', [key])).rows;

  beforeAll(async () => {
    const schema = await freshSchema('effect_ledger');
    await createTables(schema);
    db = await sqlClient(schema);
    for (const statement of createEffectLedgerStatements('effect_ledger')) await db.query(statement);
    app = await boot(schema, { ledger: {} });
    ledger = app.get(EffectLedger);
    service = app.get(IdempotencyService);
    dataSource = app.get(DataSource);
  });
  afterAll(async () => {
    await app?.close();
    await db?.end();
  });

  it('records a business key once: true the first time, false for every later transaction', async () => {
    const key = fresh();
    expect(await dataSource.transaction((tx) => ledger.once(tx, key, { tenant: 't1' }))).toBe(true);
    expect(await dataSource.transaction((tx) => ledger.once(tx, key, { tenant: 't1' }))).toBe(false);
    expect(await ledger.has(key, { tenant: 't1' })).toBe(true);
    expect(await rows(key)).toEqual([{ tenant_id: 't1', scope: 'default' }]);
  });

  it("writes in the caller's transaction: a rollback takes the record with it, and the key is free again", async () => {
    const key = fresh();
    await expect(
      dataSource.transaction(async (tx) => {
        expect(await ledger.once(tx, key, { tenant: 't1' })).toBe(true);
        throw new Error('the effect failed');
      }),
    ).rejects.toThrow('the effect failed');
    expect(await ledger.has(key, { tenant: 't1' })).toBe(false);
    expect(await dataSource.transaction((tx) => ledger.once(tx, key, { tenant: 't1' }))).toBe(true);
  });

  it('lets exactly one of two concurrent transactions record the key: the other waits for its commit, then gets false', async () => {
    const key = fresh();
    let releaseFirst!: () => void;
    const firstMayCommit = new Promise<void>((resolve) => (releaseFirst = resolve));
    let firstRecorded!: () => void;
    const recorded = new Promise<void>((resolve) => (firstRecorded = resolve));
    const first = dataSource.transaction(async (tx) => {
      const result = await ledger.once(tx, key, { tenant: 't1' });
      firstRecorded();
      await firstMayCommit;
      return result;
    });
    await recorded;
    const second = dataSource.transaction((tx) => ledger.once(tx, key, { tenant: 't1' }));
    // The second waits on the first's row lock; let the first commit.
    setTimeout(releaseFirst, 200);
    expect(await Promise.all([first, second])).toEqual([true, false]);
  });

  it('keeps tenants and scopes apart', async () => {
    const key = fresh();
    const record = (tenant: string, scope?: string) => dataSource.transaction((tx) => ledger.once(tx, key, { tenant, scope }));
    expect(await record('t1')).toBe(true);
    expect(await record('t2')).toBe(true);
    expect(await record('t1', 'payouts')).toBe(true);
    expect(await record('t1', 'payouts')).toBe(false);
    expect(await rows(key)).toEqual([
      { tenant_id: 't1', scope: 'default' },
      { tenant_id: 't1', scope: 'payouts' },
      { tenant_id: 't2', scope: 'default' },
    ]);
  });

  it("uses the idempotent execution's transaction and tenant when given neither", async () => {
    const key = fresh();
    const run = (messageKey: string) =>
      service.execute({ tenant: 'tenant-x', key: messageKey, payload: { key } }, async () => ({ first: await ledger.once(key) }));
    expect(await run(`m1-${key}`)).toEqual({ first: true });
    // Another idempotency key (a replay after the first expired, a new message id): the ledger still says no.
    expect(await run(`m2-${key}`)).toEqual({ first: false });
    expect(await rows(key)).toEqual([{ tenant_id: 'tenant-x', scope: 'default' }]);
  });

  it('refuses to record outside a transaction, without a tenant, or without a key', async () => {
    await expect(ledger.once(fresh())).rejects.toThrow(EffectLedgerUsageError);
    await expect(ledger.once(dataSource.manager, fresh(), { tenant: 't1' })).rejects.toThrow(/needs a transaction/);
    await expect(dataSource.transaction((tx) => ledger.once(tx, fresh()))).rejects.toThrow(/no tenant/);
    await expect(dataSource.transaction((tx) => ledger.once(tx, '', { tenant: 't1' }))).rejects.toThrow(/business key/);
  });
});

describe('the effect ledger table', () => {
  it('has the columns the start-up check expects, as the DDL creates them', async () => {
    const schema = await freshSchema('effect_ledger_columns');
    const client = await sqlClient(schema);
    try {
      for (const statement of createEffectLedgerStatements('effect_ledger')) await client.query(statement);
      const { rows } = await client.query(
        `SELECT attname FROM pg_attribute WHERE attrelid = 'effect_ledger'::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum`,
      );
      expect(rows.map((r) => r.attname)).toEqual(LEDGER_TABLE_COLUMNS);
    } finally {
      await client.end();
    }
  });

  it('is created by its locked migration, also under another name, next to the default one', async () => {
    const schema = await freshSchema('effect_ledger_migration');
    const migrations = [CreateEffectLedger1764806400000, createEffectLedgerMigration('billing_effects')];
    const dataSource = await new DataSource({ ...dataSourceOptions(schema), migrations }).initialize();
    try {
      const applied = await runMigrationsWithLock(dataSource);
      expect(applied.map((m) => m.name)).toEqual([
        'CreateEffectLedger1764806400000',
        'CreateEffectLedger_billing_effects_1764806400000',
      ]);
      const tables = (await dataSource.query(
        `SELECT table_name FROM information_schema.tables WHERE table_schema = $1 AND table_name <> 'migrations' ORDER BY 1`,
        [schema],
      )) as Array<{ table_name: string }>;
      expect(tables.map((t) => t.table_name)).toEqual(['billing_effects', 'effect_ledger']);
    } finally {
      await dataSource.destroy();
    }
  });

  it('stops the app at start-up when the ledger is configured and its table is missing, naming the migration', async () => {
    const schema = await freshSchema('effect_ledger_missing');
    await createTables(schema);
    const error = await boot(schema, { ledger: {} }).then(
      async (app) => {
        await app.close();
        return undefined;
      },
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(IdempotencyConfigurationError);
    expect((error as Error).message).toMatch(/ledger table "effect_ledger" does not exist/);
    expect((error as Error).message).toContain('CreateEffectLedger1764806400000');
    // Without the option the ledger's table is not required.
    const app = await boot(schema);
    await app.close();
  });

  it('names the migration of a custom ledger table', async () => {
    const schema = await freshSchema('effect_ledger_custom');
    await createTables(schema);
    await expect(boot(schema, { ledger: { tableName: 'billing_effects' } })).rejects.toThrow(
      "createEffectLedgerMigration('billing_effects')",
    );
  });
});

describe('options of message handlers', () => {
  it.each([
    [{ key: 42 }, /`key` must name a field/],
    [{ key: '' }, /`key` must name a field/],
    [{ maxDeliveries: 0 }, /maxDeliveries/],
    [{ maxDeliveries: 1.5 }, /maxDeliveries/],
    [{ ledger: { tableName: 'bad name' } }, /ledger\.tableName/],
  ])('refuses %j at start-up', async (options, message) => {
    const schema = await freshSchema('consumer_options');
    await createTables(schema);
    await expect(boot(schema, options as Partial<IdempotencyModuleOptions>)).rejects.toThrow(message);
  });
});
