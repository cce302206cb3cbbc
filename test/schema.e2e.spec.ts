import { afterAll, describe, expect, it } from '@jest/globals';
import { Injectable, Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { TypeOrmModule } from '@nestjs/typeorm';
import { DataSource } from 'typeorm';
import {
  createIdempotencyKeysMigration,
  CreateIdempotencyKeys1764460800000,
  IdempotencyConfigurationError,
  IdempotencyKeyEntity,
  IdempotencyModule,
  IdempotencyService,
  TransactionHost,
} from '../src/index.js';
import { createTables, dataSourceOptions, DataSourceTracker, freshSchema, sqlClient } from './support/database.js';

async function columnsOf(schema: string, table: string): Promise<string[]> {
  const client = await sqlClient(schema);
  try {
    const res = await client.query(
      'SELECT column_name FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2 ORDER BY column_name',
      [schema, table],
    );
    return res.rows.map((r) => r.column_name as string);
  } finally {
    await client.end();
  }
}

describe('schema', () => {
  it('the migration is safe when several instances run it at once, and creates the sweeper index', async () => {
    const schema = await freshSchema('migration');
    const instances = Array.from(
      { length: 4 },
      () =>
        new DataSource({
          ...dataSourceOptions(schema),
          migrations: [CreateIdempotencyKeys1764460800000],
          migrationsTableName: 'migrations',
        }),
    );
    await Promise.all(instances.map((d) => d.initialize()));
    try {
      // Each instance runs the migration's own `up` in its own transaction, at the same moment.
      const results = await Promise.allSettled(
        instances.map(async (d) => {
          const runner = d.createQueryRunner();
          try {
            await runner.startTransaction();
            await new CreateIdempotencyKeys1764460800000().up(runner);
            await runner.commitTransaction();
          } finally {
            await runner.release();
          }
        }),
      );
      expect(results.filter((r) => r.status === 'rejected')).toEqual([]);
      const client = await sqlClient(schema);
      // The sweeper's index is on expiry_floor, which the completion leaves alone: none is on expires_at.
      const index = await client.query(
        `SELECT indexdef FROM pg_indexes WHERE schemaname = $1 AND tablename = 'idempotency_keys' AND indexdef LIKE '%(expiry_floor)%'`,
        [schema],
      );
      const onExpiresAt = await client.query(
        `SELECT indexdef FROM pg_indexes WHERE schemaname = $1 AND tablename = 'idempotency_keys' AND indexdef LIKE '%expires_at%'`,
        [schema],
      );
      const options = await client.query(`SELECT reloptions FROM pg_class WHERE oid = to_regclass($1)`, [
        `"${schema}".idempotency_keys`,
      ]);
      // Stored bodies compressed with lz4 (this server has it), out of line once large.
      const storage = await client.query(
        `SELECT attstorage, attcompression FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = 'response_body'`,
        [`"${schema}".idempotency_keys`],
      );
      await client.end();
      expect(index.rowCount).toBe(1);
      expect(onExpiresAt.rowCount).toBe(0);
      expect(options.rows).toEqual([{ reloptions: ['fillfactor=90'] }]);
      expect(storage.rows).toEqual([{ attstorage: 'x', attcompression: 'l' }]);
      expect(await columnsOf(schema, 'idempotency_keys')).toContain('response_body');
    } finally {
      await Promise.all(instances.map((d) => d.destroy()));
    }
  });

  it('a migration for a custom table name creates that table', async () => {
    const schema = await freshSchema('migration_custom');
    const ds = new DataSource({ ...dataSourceOptions(schema), migrations: [createIdempotencyKeysMigration('payment_keys')] });
    await ds.initialize();
    try {
      await ds.runMigrations();
      expect(await columnsOf(schema, 'payment_keys')).toContain('fingerprint');
    } finally {
      await ds.destroy();
    }
  });

  it('synchronize with IdempotencyKeyEntity creates a table the store can use', async () => {
    const schema = await freshSchema('synchronize');
    @Module({
      imports: [
        TypeOrmModule.forRoot({
          ...dataSourceOptions(schema),
          entities: [IdempotencyKeyEntity],
          synchronize: true,
          retryAttempts: 0,
        }),
        IdempotencyModule.forRoot({ tenant: () => 'single', sweep: false }),
      ],
    })
    class QuickStart {}
    const app = await NestFactory.createApplicationContext(QuickStart, { logger: false });
    try {
      const service = app.get(IdempotencyService);
      expect(await service.execute({ tenant: 'single', key: 'k', payload: 1 }, () => 'once')).toBe('once');
      expect(await service.execute({ tenant: 'single', key: 'k', payload: 1 }, () => 'twice')).toBe('once');
    } finally {
      await app.close();
    }
  });
});

describe('a named data source', () => {
  it('is used for keys and for the request transaction when the module names it', async () => {
    const schema = await freshSchema('named_data_source');
    await createTables(schema);
    @Injectable()
    class Writer {
      constructor(private readonly tx: TransactionHost) {}
      write(label: string) {
        return this.tx.manager.query('INSERT INTO effects (tenant, label) VALUES ($1, $2)', ['named', label]);
      }
    }
    @Module({
      imports: [
        // The default data source points at another schema, so using it by mistake would fail.
        TypeOrmModule.forRoot({ ...dataSourceOptions(`${schema}_missing`), retryAttempts: 0 }),
        TypeOrmModule.forRoot({ ...dataSourceOptions(schema), name: 'payments', retryAttempts: 0 }),
        IdempotencyModule.forRoot({ tenant: () => 't', sweep: false, dataSource: 'payments' }),
      ],
      providers: [Writer],
    })
    class Named {}
    const app = await NestFactory.createApplicationContext(Named, { logger: false });
    try {
      const writer = app.get(Writer);
      await app.get(IdempotencyService).execute({ tenant: 't', key: 'named', payload: 1 }, () => writer.write('named'));
      const db = await sqlClient(schema);
      try {
        expect((await db.query(`SELECT count(*) FROM effects WHERE label = 'named'`)).rows[0].count).toBe('1');
        expect((await db.query(`SELECT status FROM idempotency_keys WHERE key = 'named'`)).rows).toEqual([
          { status: 'completed' },
        ]);
      } finally {
        await db.end();
      }
    } finally {
      await app.close();
    }
  });
});

describe('module configuration errors surface at start-up', () => {
  // A bootstrap that fails leaves no app to close, so the data sources it opened are closed here.
  const dataSources = new DataSourceTracker();
  const trackedTypeOrm = (schema: string) =>
    TypeOrmModule.forRootAsync({
      useFactory: () => ({ ...dataSourceOptions(schema), retryAttempts: 0 }),
      dataSourceFactory: dataSources.factory(),
    });
  afterAll(() => dataSources.closeAll());

  it('a missing tenant resolver fails with a message that says how to fix it', async () => {
    const schema = await freshSchema('config_errors');
    @Module({ imports: [trackedTypeOrm(schema), IdempotencyModule.forRoot({ sweep: false } as never)] })
    class Broken {}
    const attempt = NestFactory.createApplicationContext(Broken, { logger: false, abortOnError: false });
    await expect(attempt).rejects.toThrow(IdempotencyConfigurationError);
    await expect(NestFactory.createApplicationContext(Broken, { logger: false, abortOnError: false })).rejects.toThrow(
      /single-tenant app says so explicitly/,
    );
  });

  it('an enabled sweeper without ScheduleModule says to import it or pass sweep: false', async () => {
    const schema = await freshSchema('config_schedule');
    await createTables(schema);
    @Module({ imports: [trackedTypeOrm(schema), IdempotencyModule.forRoot({ tenant: () => 't' })] })
    class NoSchedule {}
    await expect(NestFactory.createApplicationContext(NoSchedule, { logger: false, abortOnError: false })).rejects.toThrow(
      /ScheduleModule.forRoot\(\)/,
    );
    expect(dataSources.count).toBeGreaterThan(0);
  });
});
