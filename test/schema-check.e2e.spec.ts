import { afterAll, describe, expect, it } from '@jest/globals';
import { Module, type INestApplicationContext } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { TypeOrmModule, type TypeOrmModuleOptions } from '@nestjs/typeorm';
import { DataSource, type DataSourceOptions, type MigrationInterface, type QueryRunner } from 'typeorm';
import { fingerprintValue } from '../src/core/fingerprint-value.js';
import {
  CreateIdempotencyKeys1764460800000,
  IdempotencyConfigurationError,
  IdempotencyKeyEntity,
  IdempotencyModule,
  IdempotencyService,
  migratingDataSourceFactory,
  type IdempotencyModuleExtras,
  type IdempotencyModuleOptions,
} from '../src/index.js';
import { IdempotencyStore } from '../src/store/index.js';
import { CreateOutboxMessages1764547200000 } from '../src/outbox/index.js';
import { createOutboxStatements, createTableStatements, KEY_TABLE_COLUMNS, OUTBOX_TABLE_COLUMNS } from '../src/store/sql.js';
import { KEY_FUNCTIONS_VERSION } from '../src/store/key-function-parts.sql.js';
import {
  createOutboxTable,
  createTables,
  dataSourceOptions,
  DataSourceTracker,
  freshSchema,
  sqlClient,
} from './support/database.js';

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

/** The live columns of `table` in `schema`, in table order. */
async function columnsOf(schema: string, table: string): Promise<string[]> {
  const rows = await sql(
    schema,
    `SELECT attname FROM pg_attribute WHERE attrelid = '"${table}"'::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum`,
  );
  return rows.map((row) => row.attname as string);
}

/** What the upgrade changes on the key table: expiry_floor NOT NULL, its indexes, its storage options. */
async function layoutOf(schema: string): Promise<{ notNull: boolean; indexes: string[]; options: string[] }> {
  const [row] = await sql(
    schema,
    `SELECT (SELECT attnotnull FROM pg_attribute WHERE attrelid = c.oid AND attname = 'expiry_floor') AS "notNull",
            ARRAY(SELECT i.indexrelid::regclass::text FROM pg_index i WHERE i.indrelid = c.oid ORDER BY 1) AS indexes,
            coalesce(c.reloptions, '{}') AS options
       FROM pg_class c WHERE c.oid = 'idempotency_keys'::regclass`,
  );
  return row as { notNull: boolean; indexes: string[]; options: string[] };
}

describe('the expected columns', () => {
  it('are the key table columns the DDL creates, in order', async () => {
    const schema = await freshSchema('expected_key_columns');
    await sql(schema, ...createTableStatements('idempotency_keys'));
    expect(await columnsOf(schema, 'idempotency_keys')).toEqual(KEY_TABLE_COLUMNS);
  });

  it('are the outbox table columns the DDL creates, in order', async () => {
    const schema = await freshSchema('expected_outbox_columns');
    await sql(schema, ...createOutboxStatements('outbox_messages'));
    expect(await columnsOf(schema, 'outbox_messages')).toEqual(OUTBOX_TABLE_COLUMNS);
  });

  it('are the columns of the synchronize entity', () => {
    const columns = Object.entries(IdempotencyKeyEntity.options.columns).map(([property, column]) => column?.name ?? property);
    expect(columns).toEqual(KEY_TABLE_COLUMNS);
  });
});

describe('start-up schema check', () => {
  // A bootstrap that fails leaves no app to close, so the data sources it opened are closed here.
  const dataSources = new DataSourceTracker();
  const tracked = (factory?: (options?: DataSourceOptions) => Promise<DataSource>) => dataSources.factory(factory);
  afterAll(() => dataSources.closeAll());

  async function boot(
    schema: string,
    options: Partial<IdempotencyModuleOptions> & IdempotencyModuleExtras = {},
    typeorm: Partial<DataSourceOptions> = {},
    factory?: (options?: DataSourceOptions) => Promise<DataSource>,
  ): Promise<INestApplicationContext> {
    @Module({
      imports: [
        TypeOrmModule.forRootAsync({
          useFactory: () => ({ ...dataSourceOptions(schema), ...typeorm, retryAttempts: 0 }) as TypeOrmModuleOptions,
          dataSourceFactory: tracked(factory),
        }),
        IdempotencyModule.forRoot({ tenant: () => 't', sweep: false, ...options }),
      ],
    })
    class App {}
    return NestFactory.createApplicationContext(App, { logger: false, abortOnError: false });
  }

  /** The configuration error a start-up fails with. */
  async function startupError(...args: Parameters<typeof boot>): Promise<IdempotencyConfigurationError> {
    const error = await boot(...args).then(
      async (app) => {
        await app.close();
        throw new Error('the app started');
      },
      (error: unknown) => error,
    );
    expect(error).toBeInstanceOf(IdempotencyConfigurationError);
    return error as IdempotencyConfigurationError;
  }

  async function bootsAndWorks(...args: Parameters<typeof boot>): Promise<void> {
    const app = await boot(...args);
    try {
      const service = app.get(IdempotencyService);
      expect(await service.execute({ tenant: 't', key: 'k', payload: 1 }, () => 'once')).toBe('once');
      expect(await service.execute({ tenant: 't', key: 'k', payload: 1 }, () => 'twice')).toBe('once');
    } finally {
      await app.close();
    }
  }

  it('a missing key table stops the app, naming the table, where it looked, the migration and the entity', async () => {
    const schema = await freshSchema('check_no_key_table');
    const error = await startupError(schema);
    expect(error.message).toContain('the key table "idempotency_keys" does not exist');
    expect(error.message).toContain(`search_path "${schema}"`);
    expect(error.message).toContain('Run the migration CreateIdempotencyKeys1764460800000');
    expect(error.message).toContain('migratingDataSourceFactory()');
    expect(error.message).toContain('add IdempotencyKeyEntity to `entities` with `synchronize: true`');
    expect(error.message).toContain(
      "With a migration tool of your own (prisma migrate, drizzle-kit), add this version's sql/idempotency-keys.sql",
    );
  });

  it('a key table that lacks columns stops the app, naming the columns', async () => {
    const schema = await freshSchema('check_key_columns');
    await createTables(schema);
    await sql(schema, 'ALTER TABLE idempotency_keys DROP COLUMN recovery_point, DROP COLUMN phase_results');
    const error = await startupError(schema);
    expect(error.message).toContain('the key table "idempotency_keys" lacks the columns recovery_point, phase_results');
    expect(error.message).not.toContain('does not exist');
    expect(error.message).toContain('CreateIdempotencyKeys1764460800000');
    expect(error.message).toContain('`synchronize: true` with IdempotencyKeyEntity adds them');
  });

  it('a key table without its claim and completion functions stops the app, naming them and the migration', async () => {
    const schema = await freshSchema('check_key_functions');
    await createTables(schema);
    await sql(schema, 'DROP FUNCTION idempotency_keys_claim', 'DROP FUNCTION idempotency_keys_complete');
    const error = await startupError(schema);
    expect(error.message).toContain('"idempotency_keys_claim", "idempotency_keys_complete" of the key table "idempotency_keys"');
    expect(error.message).toContain('CreateIdempotencyKeys1764460800000 creates them');
  });

  it('a key table whose claim functions an older version created stops the app, naming them and the migration', async () => {
    const schema = await freshSchema('check_stale_functions');
    await createTables(schema);
    // The same functions without this version's marker, as the previous release created them.
    await sql(
      schema,
      `DO $$ DECLARE f text; BEGIN
         FOREACH f IN ARRAY ARRAY['idempotency_keys_claim', 'idempotency_keys_claim_in_transaction'] LOOP
           EXECUTE replace(pg_get_functiondef(f::regproc), '${KEY_FUNCTIONS_VERSION}', 'an older version');
         END LOOP; END $$`,
    );
    const error = await startupError(schema);
    expect(error.message).toContain(
      '"idempotency_keys_claim", "idempotency_keys_claim_in_transaction" of the key table "idempotency_keys" were created by an older version',
    );
    expect(error.message).toContain('CreateIdempotencyKeys1764460800000 replaces them in place');
    expect(error.message).toContain(`(it needs "${KEY_FUNCTIONS_VERSION}", marked in their source)`);
    expect(error.message).toContain("add this version's sql/idempotency-keys.sql");
    // With synchronize: true the module replaces them itself, and the store works.
    await bootsAndWorks(schema, {}, { entities: [IdempotencyKeyEntity], synchronize: true });
  });

  it('with synchronize: true the module creates the functions itself, and the store works', async () => {
    const schema = await freshSchema('check_sync_functions');
    await bootsAndWorks(schema, {}, { entities: [IdempotencyKeyEntity], synchronize: true });
    // And again on the table synchronize left: the functions exist now, nothing to create.
    await bootsAndWorks(schema, {}, { entities: [IdempotencyKeyEntity], synchronize: true });
  });

  describe('a key table an earlier version made', () => {
    /**
     * Turns the key table into what the previous release left: no expiry_floor, its index on expires_at, no
     * fillfactor, and claim functions without this version's marker.
     */
    const toEarlierLayout = (schema: string) =>
      sql(
        schema,
        `DO $$ DECLARE f text; BEGIN
           FOREACH f IN ARRAY ARRAY['idempotency_keys_claim', 'idempotency_keys_claim_in_transaction'] LOOP
             EXECUTE replace(pg_get_functiondef(f::regproc), '${KEY_FUNCTIONS_VERSION}', 'an older version');
           END LOOP; END $$`,
        'ALTER TABLE idempotency_keys DROP COLUMN expiry_floor',
        'CREATE INDEX idempotency_keys_expires_at_idx ON idempotency_keys (expires_at)',
        'ALTER TABLE idempotency_keys RESET (fillfactor)',
      );
    /** A key of each kind, written as the earlier version wrote them. */
    const earlierRows = (schema: string) =>
      sql(
        schema,
        `INSERT INTO idempotency_keys (tenant_id, key, fingerprint, status, owner_token, lease_expires_at, expires_at,
                                       response_status, response_headers, response_body)
         VALUES ('t', 'kept', '${fingerprintValue(1)}', 'completed', gen_random_uuid(), now() - interval '1 hour',
                 now() + interval '1 hour', 201, '[]', '"kept"'),
                ('t', 'expired', 'fp', 'completed', gen_random_uuid(), now() - interval '1 hour', now() - interval '1 second',
                 201, '[]', '"expired"'),
                ('t', 'leased', 'fp', 'in_flight', gen_random_uuid(), now() + interval '1 hour', now() - interval '1 second',
                 NULL, NULL, NULL)`,
      );
    /** An app's own migration that runs the key table's migration again, as docs/schema.md ("Upgrading") shows. */
    class UpgradeIdempotencyKeys1767225600000 implements MigrationInterface {
      name = 'UpgradeIdempotencyKeys1767225600000';
      up(queryRunner: QueryRunner): Promise<void> {
        return new CreateIdempotencyKeys1764460800000().up(queryRunner);
      }
      async down(): Promise<void> {}
    }

    it('stops the app, saying to run the migration again; run again from a migration of the app, it upgrades it in place', async () => {
      const schema = await freshSchema('check_earlier_layout');
      const migrations = [CreateIdempotencyKeys1764460800000];
      // Migrated by the earlier release: its migration is recorded as run.
      await bootsAndWorks(schema, {}, { migrations }, migratingDataSourceFactory());
      await sql(schema, 'TRUNCATE idempotency_keys');
      await toEarlierLayout(schema);
      await earlierRows(schema);

      const error = await startupError(schema, {}, { migrations }, migratingDataSourceFactory());
      expect(error.message).toContain(
        'the key table "idempotency_keys" has the layout of an earlier version of the module (no column expiry_floor)',
      );
      expect(error.message).toContain('CreateIdempotencyKeys1764460800000 upgrades the table in place: run its statements again');
      expect(error.message).toContain('docs/schema.md ("Upgrading")');

      const app = await boot(
        schema,
        {},
        { migrations: [...migrations, UpgradeIdempotencyKeys1767225600000] },
        migratingDataSourceFactory(),
      );
      try {
        const service = app.get(IdempotencyService);
        // Each earlier row's floor is its expiry: the live one replays, the expired one is swept, the leased one stays.
        expect(await service.execute({ tenant: 't', key: 'kept', payload: 1 }, () => 'again')).toBe('kept');
        expect(await service.sweep()).toMatchObject({ deleted: 1 });
        expect((await sql(schema, 'SELECT key FROM idempotency_keys ORDER BY key')).map((row) => row.key)).toEqual([
          'kept',
          'leased',
        ]);
      } finally {
        await app.close();
      }
      expect(
        await sql(schema, `SELECT count(*)::int AS n FROM idempotency_keys WHERE expiry_floor IS DISTINCT FROM expires_at`),
      ).toEqual([{ n: 0 }]);
      expect(await layoutOf(schema)).toEqual({
        notNull: true,
        indexes: ['idempotency_keys_expiry_floor_idx', 'idempotency_keys_pkey'],
        options: ['fillfactor=90'],
      });
    });

    it('with the column but the index on expires_at still there, stops the app naming the index', async () => {
      const schema = await freshSchema('check_earlier_index');
      await createTables(schema);
      await sql(schema, 'CREATE INDEX idempotency_keys_expires_at_idx ON idempotency_keys (expires_at)');
      const error = await startupError(schema);
      expect(error.message).toContain('(the index idempotency_keys_expires_at_idx)');
      await sql(schema, ...createTableStatements('idempotency_keys'));
      await bootsAndWorks(schema);
    });

    it('with synchronize: true, is upgraded by TypeORM and the module', async () => {
      const schema = await freshSchema('check_earlier_synchronize');
      const typeorm = { entities: [IdempotencyKeyEntity], synchronize: true };
      await bootsAndWorks(schema, {}, typeorm);
      await sql(schema, 'TRUNCATE idempotency_keys');
      await toEarlierLayout(schema);
      await earlierRows(schema);
      await bootsAndWorks(schema, {}, typeorm);
      // TypeORM adds the column (the entity's default lets it, over rows) and swaps the index; the module the rest.
      expect(await layoutOf(schema)).toEqual({
        notNull: true,
        indexes: [expect.stringMatching(/^"PK_/), 'idempotency_keys_expiry_floor_idx'],
        options: ['fillfactor=90'],
      });
      expect(await sql(schema, `SELECT count(*)::int AS n FROM idempotency_keys WHERE expiry_floor = '-infinity'`)).toEqual([
        { n: 3 },
      ]);
    });
  });

  it('a key entity registered with the data source is the table the store uses, in the schema TypeORM gives it', async () => {
    const schema = await freshSchema('check_entity_schema');
    const elsewhere = await freshSchema('check_entity_elsewhere');
    // search_path points elsewhere: only the entity's metadata says where TypeORM made the table.
    const typeorm = { entities: [IdempotencyKeyEntity], synchronize: true, extra: { options: `-c search_path=${elsewhere}` } };
    await bootsAndWorks(schema, {}, typeorm);
    const [row] = await sql(schema, `SELECT count(*)::int AS n FROM "${schema}".idempotency_keys`);
    expect(row.n).toBe(1);
    expect(await sql(elsewhere, `SELECT to_regclass('"${elsewhere}".idempotency_keys') AS t`)).toEqual([{ t: null }]);
  });

  it('a custom, schema-qualified table name is looked up in its schema, and the message names its own migration', async () => {
    const schema = await freshSchema('check_qualified');
    const elsewhere = await freshSchema('check_qualified_elsewhere');
    const tableName = `${elsewhere}.payment_keys`;
    const error = await startupError(schema, { tableName });
    expect(error.message).toContain(`the key table "${tableName}" does not exist (looked for it in schema "${elsewhere}")`);
    expect(error.message).toContain(`createIdempotencyKeysMigration('${tableName}')`);
    expect(error.message).toContain(`createIdempotencyKeyEntity('${tableName}')`);
    // The file makes the table under the default name only.
    expect(error.message).not.toContain('sql/idempotency-keys.sql');
    // Off the search_path, but qualified: found, and used.
    await sql(schema, ...createTableStatements(tableName));
    await bootsAndWorks(schema, { tableName });
  });

  it('resolves the name as the store quotes it: a table that differs in letter case is not the key table', async () => {
    const schema = await freshSchema('check_case');
    await sql(schema, ...createTableStatements('paymentkeys'));
    const error = await startupError(schema, { tableName: 'PaymentKeys' });
    expect(error.message).toContain('the key table "PaymentKeys" does not exist');
    await sql(schema, ...createTableStatements('PaymentKeys'));
    await bootsAndWorks(schema, { tableName: 'PaymentKeys' });
  });

  it('with the outbox option, a missing outbox table stops the app, naming its migration', async () => {
    const schema = await freshSchema('check_no_outbox');
    await createTables(schema);
    const error = await startupError(schema, { outbox: {} });
    expect(error.message).toContain('the outbox table "outbox_messages" does not exist');
    expect(error.message).toContain('Run the migration CreateOutboxMessages1764547200000');
    const custom = await startupError(schema, { outbox: { tableName: 'my_outbox' } });
    expect(custom.message).toContain(`createOutboxMigration('my_outbox')`);
    // Without the option the outbox is not in use, and its table is not required.
    await bootsAndWorks(schema);
  });

  it('an outbox table that lacks columns stops the app, naming the columns', async () => {
    const schema = await freshSchema('check_outbox_columns');
    await createTables(schema);
    await createOutboxTable(schema);
    await sql(schema, 'ALTER TABLE outbox_messages DROP COLUMN lock_token');
    const error = await startupError(schema, { outbox: { relay: false } });
    expect(error.message).toContain('the outbox table "outbox_messages" lacks the column lock_token');
  });

  it('reports every missing table at once', async () => {
    const schema = await freshSchema('check_both_missing');
    const error = await startupError(schema, { outbox: {} });
    expect(error.message).toContain('"idempotency_keys" does not exist');
    expect(error.message).toContain('"outbox_messages" does not exist');
  });

  it('a store of your own needs no key table', async () => {
    const schema = await freshSchema('check_own_store');
    const unused = () => Promise.reject(new Error('unused'));
    // Keeps its keys somewhere else entirely.
    class NoTableStore extends IdempotencyStore {
      claim = unused;
      transaction = unused;
      complete = unused;
      recordPhase = unused;
      release = unused;
      sweep = unused;
      isUnavailableError = () => false;
    }
    const app = await boot(schema, { store: NoTableStore });
    expect(app.get(IdempotencyStore)).toBeInstanceOf(NoTableStore);
    await app.close();
  });

  it('a complete schema boots, with the outbox', async () => {
    const schema = await freshSchema('check_complete');
    await createTables(schema);
    await createOutboxTable(schema);
    await bootsAndWorks(schema, { outbox: { relay: false } });
  });

  it('runs after the migrations of migrationsRun: true', async () => {
    const schema = await freshSchema('check_migrations_run');
    await bootsAndWorks(
      schema,
      { outbox: {} },
      { migrations: [CreateIdempotencyKeys1764460800000, CreateOutboxMessages1764547200000], migrationsRun: true },
    );
  });

  it('runs after the migrations of migratingDataSourceFactory (the Quick start shape)', async () => {
    const schema = await freshSchema('check_migrating_factory');
    await bootsAndWorks(
      schema,
      { outbox: {} },
      { migrations: [CreateIdempotencyKeys1764460800000, CreateOutboxMessages1764547200000] },
      migratingDataSourceFactory(),
    );
    const recorded = await sql(schema, 'SELECT name FROM migrations ORDER BY id');
    expect(recorded.map((row) => row.name)).toEqual(['CreateIdempotencyKeys1764460800000', 'CreateOutboxMessages1764547200000']);
  });
});
