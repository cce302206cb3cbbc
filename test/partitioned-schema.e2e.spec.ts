import { afterAll, describe, expect, it } from '@jest/globals';
import { Module, type INestApplicationContext } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { TypeOrmModule, type TypeOrmModuleOptions } from '@nestjs/typeorm';
import { DataSource, type DataSourceOptions } from 'typeorm';
import {
  createPartitionedIdempotencyKeysMigration,
  CreatePartitionedIdempotencyKeys1765152000000,
  IdempotencyConfigurationError,
  IdempotencyModule,
  IdempotencyService,
  runMigrationsWithLock,
  type IdempotencyModuleOptions,
} from '../src/index.js';
import { fingerprintValue } from '../src/core/fingerprint-value.js';
import { keyStoreStatements } from '../src/store/key-store.sql.js';
import { KEY_FUNCTIONS_VERSION } from '../src/store/key-function-parts.sql.js';
import { keyUpkeepStatements } from '../src/store/key-upkeep.sql.js';
import { resolveIdempotencyOptions } from '../src/resolve-options.js';
import {
  createPartitionedTableStatements,
  DEFAULT_PARTITION_LAYOUT,
  retainUntil,
} from '../src/store/partitioned/partitioned-key-table.sql.js';
import { createTableStatements, KEY_TABLE_COLUMNS, KEY_TABLE_FILLFACTOR } from '../src/store/sql.js';
import { dataSourceOptions, freshSchema, sqlClient } from './support/database.js';
import { useKeyTable } from './support/key-table.js';

useKeyTable('partitioned');

async function sql(schema: string, ...statements: string[]): Promise<Array<Record<string, unknown>>> {
  const client = await sqlClient(schema);
  try {
    let rows: Array<Record<string, unknown>> = [];
    for (const statement of statements) rows = (await client.query(statement)).rows;
    return rows;
  } finally {
    await client.end();
  }
}

const LAYOUTS = [
  ['plain', () => createTableStatements('idempotency_keys')],
  ['partitioned', () => createPartitionedTableStatements('idempotency_keys', DEFAULT_PARTITION_LAYOUT)],
] as const;

/**
 * Shard-friendly by construction: Citus distributes a table by a column that
 * every unique constraint must contain, and routes a statement (or delegates
 * a function call) to one shard when it filters on that column. The key
 * table's column is `tenant_id`; these fail if a unique index, a per-key
 * function or a per-key statement stops leading with it.
 */
describe.each(LAYOUTS)('the %s key table stores bodies', (layout, statements) => {
  it('compressed with lz4, on the table and on every partition, those made later too', async () => {
    const schema = await freshSchema(`body_storage_${layout}`);
    await sql(schema, ...statements());
    // A partition made after the table (the partitioned layout makes them ahead as time goes by).
    if (layout === 'partitioned') {
      await sql(
        schema,
        `CREATE TABLE idempotency_keys_later PARTITION OF idempotency_keys FOR VALUES FROM ('2999-01-01') TO ('2999-02-01')`,
      );
    }
    const rows = await sql(
      schema,
      `SELECT attstorage, attcompression FROM pg_attribute
        WHERE attname = 'response_body' AND attrelid IN (
          SELECT 'idempotency_keys'::regclass UNION ALL SELECT inhrelid FROM pg_inherits WHERE inhparent = 'idempotency_keys'::regclass)`,
    );
    expect(rows.length).toBeGreaterThanOrEqual(layout === 'partitioned' ? 3 : 1);
    for (const row of rows) expect(row).toEqual({ attstorage: 'x', attcompression: 'l' });
    // A ~0.9 MB JSON body stored as the store stores it takes a few kilobytes.
    const body = Buffer.from(JSON.stringify(Array.from({ length: 20_000 }, (_, i) => ({ sku: `sku-${i}`, quantity: 1 }))));
    const [stored] = await sql(
      schema,
      `INSERT INTO idempotency_keys (tenant_id, key, fingerprint, status, owner_token, lease_expires_at, expires_at, expiry_floor, response_body)
       VALUES ('t', 'k', 'f', 'completed', gen_random_uuid(), now(), now() + interval '1 day', now() + interval '1 day', decode('${body.toString('hex')}', 'hex'))`,
      `SELECT pg_column_size(response_body) AS size, length(response_body) AS length FROM idempotency_keys WHERE key = 'k'`,
    );
    expect(stored.length).toBe(body.length);
    expect(Number(stored.size)).toBeLessThan(body.length / 4);
  });
});

describe.each(LAYOUTS)('the %s key table leaves room on each page for the completed row', (layout, statements) => {
  /** The fillfactor of the table, or of each of its partitions, by name. */
  const fillfactors = async (schema: string) =>
    Object.fromEntries(
      (
        await sql(
          schema,
          `SELECT c.relname, (SELECT o FROM unnest(c.reloptions) o WHERE o LIKE 'fillfactor=%') AS fillfactor
             FROM pg_class c WHERE c.oid IN (
               SELECT 'idempotency_keys'::regclass WHERE NOT EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = 'idempotency_keys'::regclass)
               UNION ALL SELECT inhrelid FROM pg_inherits WHERE inhparent = 'idempotency_keys'::regclass)`,
        )
      ).map((row) => [row.relname as string, row.fillfactor as string | null]),
    );

  it(`fillfactor ${KEY_TABLE_FILLFACTOR}, on every partition, those an earlier version or pg_partman made too, an operator's own kept`, async () => {
    const schema = await freshSchema(`fillfactor_${layout}`);
    await sql(schema, ...statements());
    const made = await fillfactors(schema);
    expect(Object.keys(made).length).toBeGreaterThanOrEqual(layout === 'partitioned' ? 6 : 1);
    for (const fillfactor of Object.values(made)) expect(fillfactor).toBe(`fillfactor=${KEY_TABLE_FILLFACTOR}`);
    if (layout === 'partitioned') {
      // Made without it (as pg_partman and earlier versions made them), and one an operator tuned.
      await sql(
        schema,
        `CREATE TABLE idempotency_keys_later PARTITION OF idempotency_keys FOR VALUES FROM ('2999-01-01') TO ('2999-02-01')`,
        `CREATE TABLE idempotency_keys_tuned PARTITION OF idempotency_keys FOR VALUES FROM ('2999-02-01') TO ('2999-03-01')
           WITH (fillfactor = 70)`,
      );
    } else {
      await sql(schema, 'ALTER TABLE idempotency_keys SET (fillfactor = 70)');
    }
    await sql(schema, ...statements());
    const again = await fillfactors(schema);
    if (layout === 'partitioned') {
      expect(again).toMatchObject({
        idempotency_keys_later: `fillfactor=${KEY_TABLE_FILLFACTOR}`,
        idempotency_keys_tuned: 'fillfactor=70',
      });
    } else {
      expect(again).toEqual({ idempotency_keys: 'fillfactor=70' });
    }
  });
});

describe.each(LAYOUTS)('the %s key table leads with the tenant', (layout, statements) => {
  let schema: string;

  it('every unique index, on the table and on each partition, starts with tenant_id', async () => {
    schema = await freshSchema(`shape_${layout}`);
    await sql(schema, ...statements());
    const rows = await sql(
      schema,
      `SELECT i.indexrelid::regclass::text AS index, a.attname AS first_column
         FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
        WHERE i.indisunique AND i.indrelid IN (
          SELECT 'idempotency_keys'::regclass UNION ALL SELECT inhrelid FROM pg_inherits WHERE inhparent = 'idempotency_keys'::regclass)`,
    );
    expect(rows.length).toBeGreaterThanOrEqual(layout === 'partitioned' ? 3 : 1);
    for (const row of rows) expect(row).toEqual({ index: row.index, first_column: 'tenant_id' });
  });

  it('every function that takes a key takes the tenant first, and looks rows up by tenant first', async () => {
    const rows = await sql(
      schema,
      `SELECT proname, proargnames, prosrc FROM pg_proc
        WHERE pronamespace = '${schema}'::regnamespace AND proname LIKE 'idempotency\\_keys\\_%'`,
    );
    const perKey = rows.filter((row) => (row.proargnames as string[] | null)?.includes('p_key'));
    expect(perKey.map((row) => row.proname).sort()).toEqual([
      'idempotency_keys_claim',
      'idempotency_keys_claim_in_transaction',
      'idempotency_keys_complete',
      'idempotency_keys_complete_in_transaction',
      'idempotency_keys_complete_or_raise',
    ]);
    for (const row of perKey) {
      const source = row.prosrc as string;
      expect({ name: row.proname, first: (row.proargnames as string[])[0] }).toEqual({ name: row.proname, first: 'p_tenant' });
      // Each lookup of the key is `tenant_id = p_tenant AND key = p_key`, in that order; a conflict target likewise.
      const lookups = source.match(/(\w+\.)?key = p_key/g) ?? [];
      const tenantFirst = source.match(/(\w+\.)?tenant_id = p_tenant AND (\w+\.)?key = p_key/g) ?? [];
      // The two that call another function or only insert (their conflict target is checked below) look nothing up.
      const looksUp = !['idempotency_keys_complete_or_raise', 'idempotency_keys_complete_in_transaction'].includes(
        row.proname as string,
      );
      if (looksUp) expect(lookups.length).toBeGreaterThan(0);
      expect({ name: row.proname, lookups: tenantFirst.length }).toEqual({ name: row.proname, lookups: lookups.length });
      for (const target of source.match(/ON CONFLICT \(([^)]*)\)/g) ?? []) expect(target).toMatch(/^ON CONFLICT \(tenant_id,/);
    }
  });
});

describe("the store's per-key statements", () => {
  it('filter by tenant first', () => {
    const statements = {
      ...keyStoreStatements('"idempotency_keys"', 'idempotency_keys'),
      ...keyUpkeepStatements('"idempotency_keys"'),
    };
    for (const name of ['renewLease', 'recordPhase', 'release'] as const) {
      expect({ name, where: /WHERE tenant_id = \$1 AND key = \$2 /.test(statements[name]) }).toEqual({ name, where: true });
    }
    for (const name of ['claim', 'complete', 'completeOrRaise'] as const) {
      expect(statements[name]).toMatch(/_(claim|complete|complete_or_raise)"\(\$1, \$2, \$3/);
    }
  });
});

describe('the partitioned table', () => {
  it('has the plain table columns, in order, and is range partitioned by created_at', async () => {
    const schema = await freshSchema('partitioned_columns');
    await sql(schema, ...createPartitionedTableStatements('idempotency_keys', DEFAULT_PARTITION_LAYOUT));
    const columns = await sql(
      schema,
      `SELECT attname FROM pg_attribute WHERE attrelid = 'idempotency_keys'::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum`,
    );
    expect(columns.map((row) => row.attname)).toEqual(KEY_TABLE_COLUMNS);
    expect(await sql(schema, `SELECT pg_get_partkeydef('idempotency_keys'::regclass) AS key`)).toEqual([
      { key: 'RANGE (created_at)' },
    ]);
  });

  it('its migration runs from three instances at once, once; its down removes the table and pg_partman record', async () => {
    const schema = await freshSchema('partitioned_migration');
    const sources = await Promise.all(
      [0, 1, 2].map(() =>
        new DataSource({
          ...dataSourceOptions(schema),
          migrations: [CreatePartitionedIdempotencyKeys1765152000000],
        }).initialize(),
      ),
    );
    try {
      const applied = await Promise.all(sources.map((s) => runMigrationsWithLock(s)));
      expect(applied.map((a) => a.length).sort()).toEqual([0, 0, 1]);
      const [{ partitions }] = await sql(
        schema,
        `SELECT count(*)::int AS partitions FROM pg_inherits WHERE inhparent = 'idempotency_keys'::regclass`,
      );
      // Today and four ahead (or pg_partman's count of them), and the default partition.
      expect(partitions).toBeGreaterThanOrEqual(6);
      await sources[0].undoLastMigration();
      expect(await sql(schema, `SELECT to_regclass('idempotency_keys') AS found`)).toEqual([{ found: null }]);
      const [{ partman }] = await sql(
        schema,
        `SELECT (SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'pg_partman') AS partman`,
      );
      if (partman) {
        expect(
          await sql(schema, `SELECT parent_table FROM ${partman as string}.part_config WHERE parent_table LIKE '${schema}.%'`),
        ).toEqual([]);
      }
    } finally {
      await Promise.all(sources.map((s) => s.destroy()));
    }
  });

  it('the module option is a boolean, off by default: the embedded default keeps the plain table', () => {
    expect(resolveIdempotencyOptions({ tenant: () => 't' }).partitioned).toBe(false);
    expect(resolveIdempotencyOptions({ tenant: () => 't', partitioned: true }).partitioned).toBe(true);
    expect(() => resolveIdempotencyOptions({ tenant: () => 't', partitioned: 'yes' as never })).toThrow(/partitioned/);
  });

  it('refuses a layout it cannot make', () => {
    expect(() => createPartitionedIdempotencyKeysMigration({ interval: '1 month' })).toThrow(IdempotencyConfigurationError);
    expect(() => createPartitionedIdempotencyKeysMigration({ interval: "1 day'; DROP TABLE x; --" })).toThrow(/interval/);
    expect(() => createPartitionedIdempotencyKeysMigration({ premake: 0 })).toThrow(/premake/);
    expect(() => createPartitionedIdempotencyKeysMigration({ partman: 'yes' as never })).toThrow(/partman/);
  });

  it('with a table name and six-hour partitions, names the partitions after the table', async () => {
    const schema = await freshSchema('partitioned_named');
    const migration = createPartitionedIdempotencyKeysMigration({
      tableName: 'payment_keys',
      interval: '6 hours',
      premake: 2,
      partman: false,
    });
    const source = await new DataSource({ ...dataSourceOptions(schema), migrations: [migration] }).initialize();
    try {
      expect((await runMigrationsWithLock(source)).map((m) => m.name)).toEqual([
        'CreatePartitionedIdempotencyKeys_payment_keys_1765152000000',
      ]);
      const rows = await sql(
        schema,
        `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'payment_keys'::regclass ORDER BY 1`,
      );
      const names = rows.map((row) => row.relname as string);
      expect(names).toContain('payment_keys_default');
      expect(names.filter((name) => /^payment_keys_p\d{4}_\d\d_\d\d_\d{4}$/.test(name)).length).toBeGreaterThanOrEqual(2);
    } finally {
      await source.destroy();
    }
  });
});

describe('the start-up check of a partitioned key table', () => {
  const opened: INestApplicationContext[] = [];
  afterAll(async () => {
    await Promise.all(opened.map((app) => app.close()));
  });

  async function boot(schema: string, options: Partial<IdempotencyModuleOptions>): Promise<INestApplicationContext> {
    @Module({
      imports: [
        TypeOrmModule.forRootAsync({
          useFactory: () => ({ ...dataSourceOptions(schema), retryAttempts: 0 }) as TypeOrmModuleOptions,
          dataSourceFactory: async (o?: DataSourceOptions) => new DataSource(o!).initialize(),
        }),
        IdempotencyModule.forRoot({ tenant: () => 't', sweep: false, ...options }),
      ],
    })
    class App {}
    return NestFactory.createApplicationContext(App, { logger: false, abortOnError: false });
  }
  const startupError = async (schema: string, options: Partial<IdempotencyModuleOptions>) => {
    const outcome = await boot(schema, options).then(
      (app) => {
        opened.push(app);
        return new Error('the app started');
      },
      (error: unknown) => error,
    );
    expect(outcome).toBeInstanceOf(IdempotencyConfigurationError);
    return (outcome as Error).message;
  };

  it('boots and works with `partitioned: true`', async () => {
    const schema = await freshSchema('check_partitioned_ok');
    await sql(schema, ...createPartitionedTableStatements('idempotency_keys', DEFAULT_PARTITION_LAYOUT));
    const app = await boot(schema, { partitioned: true });
    opened.push(app);
    const service = app.get(IdempotencyService);
    expect(await service.execute({ tenant: 't', key: 'k', payload: 1 }, () => 'once')).toBe('once');
    expect(await service.execute({ tenant: 't', key: 'k', payload: 1 }, () => 'twice')).toBe('once');
  });

  it('`partitioned: true` on a plain table stops the app, naming the partitioned migration', async () => {
    const schema = await freshSchema('check_partitioned_on_plain');
    await sql(schema, ...createTableStatements('idempotency_keys'));
    const message = await startupError(schema, { partitioned: true });
    expect(message).toContain('is not partitioned');
    expect(message).toContain('CreatePartitionedIdempotencyKeys1765152000000');
  });

  it('a partitioned table without `partitioned: true` stops the app: nobody would retire its partitions', async () => {
    const schema = await freshSchema('check_plain_on_partitioned');
    await sql(schema, ...createPartitionedTableStatements('idempotency_keys', DEFAULT_PARTITION_LAYOUT));
    expect(await startupError(schema, {})).toContain('set `partitioned: true`');
  });

  it('a partitioned table an earlier version made stops the app; its migration run again upgrades it in place', async () => {
    const schema = await freshSchema('check_partitioned_earlier');
    const statements = () => createPartitionedTableStatements('idempotency_keys', DEFAULT_PARTITION_LAYOUT);
    await sql(schema, ...statements());
    // As the previous release left it: no expiry_floor, its retention index on status and expires_at, partitions
    // without a fillfactor, claim functions without this version's marker; and a key of each kind.
    await sql(
      schema,
      `DO $$ DECLARE f text; BEGIN
         FOREACH f IN ARRAY ARRAY['idempotency_keys_claim', 'idempotency_keys_claim_in_transaction'] LOOP
           EXECUTE replace(pg_get_functiondef(f::regproc), '${KEY_FUNCTIONS_VERSION}', 'an older version');
         END LOOP; END $$`,
      'ALTER TABLE idempotency_keys DROP COLUMN expiry_floor',
      `CREATE INDEX idempotency_keys_retain_until_idx ON idempotency_keys (${retainUntil('idempotency_keys')})`,
      `DO $$ DECLARE p regclass; BEGIN
         FOR p IN SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = 'idempotency_keys'::regclass LOOP
           EXECUTE format('ALTER TABLE %s RESET (fillfactor)', p);
         END LOOP; END $$`,
      `INSERT INTO idempotency_keys (tenant_id, key, fingerprint, status, owner_token, lease_expires_at, expires_at,
                                     response_status, response_headers, response_body)
       VALUES ('t', 'kept', '${fingerprintValue(1)}', 'completed', gen_random_uuid(), now() - interval '1 hour',
               now() + interval '1 hour', 201, '[]', '"kept"'),
              ('t', 'leased', 'fp', 'in_flight', gen_random_uuid(), now() + interval '1 hour', now() - interval '1 second',
               NULL, NULL, NULL)`,
    );
    const message = await startupError(schema, { partitioned: true });
    expect(message).toContain('has the layout of an earlier version of the module (no column expiry_floor)');
    expect(message).toContain('CreatePartitionedIdempotencyKeys1765152000000 upgrades the table in place');
    // sql/idempotency-keys.sql makes the plain table: no use here.
    expect(message).not.toContain('sql/idempotency-keys.sql');

    await sql(schema, ...statements());
    const [upgraded] = await sql(
      schema,
      `SELECT (SELECT attnotnull FROM pg_attribute WHERE attrelid = 'idempotency_keys'::regclass AND attname = 'expiry_floor') AS "notNull",
              (SELECT count(*)::int FROM idempotency_keys WHERE expiry_floor IS DISTINCT FROM expires_at) AS "floorsOff",
              ARRAY(SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = 'idempotency_keys'::regclass ORDER BY 1) AS indexes,
              (SELECT count(*)::int FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                WHERE i.inhparent = 'idempotency_keys'::regclass
                  AND NOT coalesce(c.reloptions, '{}') @> ARRAY['fillfactor=${KEY_TABLE_FILLFACTOR}']) AS "withoutFillfactor"`,
    );
    expect(upgraded).toEqual({
      notNull: true,
      floorsOff: 0,
      indexes: ['idempotency_keys_pkey', 'idempotency_keys_retention_bound_idx'],
      withoutFillfactor: 0,
    });
    const app = await boot(schema, { partitioned: true });
    opened.push(app);
    const service = app.get(IdempotencyService);
    expect(await service.execute({ tenant: 't', key: 'kept', payload: 1 }, () => 'again')).toBe('kept');
  });

  it("a partitioned table whose claim function is the plain table's stops the app, naming the migration to run again", async () => {
    const schema = await freshSchema('check_partitioned_stale_claim');
    await sql(schema, ...createPartitionedTableStatements('idempotency_keys', DEFAULT_PARTITION_LAYOUT));
    // The plain migration's function statements, as if CreateIdempotencyKeys had been run on it.
    await sql(schema, ...createTableStatements('idempotency_keys').filter((s) => s.startsWith('CREATE OR REPLACE FUNCTION')));
    const message = await startupError(schema, { partitioned: true });
    expect(message).toContain("is not the partitioned table's");
    expect(message).toContain('CreatePartitionedIdempotencyKeys1765152000000');
  });
});
