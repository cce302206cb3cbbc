import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { drizzle } from 'drizzle-orm/node-postgres';
import { migrate } from 'drizzle-orm/node-postgres/migrator';
import type pg from 'pg';
import { DataSource } from 'typeorm';
import { CreateIdempotencyKeys1764460800000, runMigrationsWithLock } from '../src/index.js';
import { KEY_FUNCTIONS_VERSION } from '../src/store/key-function-parts.sql.js';
import { KEY_TABLE_SQL_FILE } from '../scripts/render-key-table-sql.js';
import { dataSourceOptions, freshSchema, sqlClient } from './support/database.js';
import { post } from './support/http.js';
import { ADAPTERS, startTestApp, type TestApp } from './support/test-app.js';

/**
 * What the key table's objects are, read from the catalog of `schema`: every table, index, sequence and function in
 * it (the migration tools' own bookkeeping tables left out), each column with its type, default, nullability and
 * storage (in table order), the constraints, the storage options, and each function's full definition. The schema's
 * name is written `<schema>`, so that two schemas built alike compare equal.
 */
async function keyTableCatalog(client: pg.Client, schema: string): Promise<unknown> {
  const bookkeeping = ['migrations', 'migrations_id_seq', '__drizzle_migrations', '__drizzle_migrations_id_seq'];
  const { rows } = await client.query(
    `SELECT
       ARRAY(SELECT format('%s %s %s %s', c.relname, c.relkind, c.relpersistence, coalesce(c.reloptions, '{}'))
               FROM pg_class c LEFT JOIN pg_index i ON i.indexrelid = c.oid LEFT JOIN pg_class t ON t.oid = i.indrelid
              WHERE c.relnamespace = $1::regnamespace AND c.relkind <> 'c' AND coalesce(t.relname, c.relname) <> ALL ($2)
              ORDER BY c.relname) AS relations,
       ARRAY(SELECT format('%s %s %s notnull=%s default=%s storage=%s compression=%s', c.relname, a.attname,
                           format_type(a.atttypid, a.atttypmod), a.attnotnull, pg_get_expr(d.adbin, d.adrelid),
                           a.attstorage, a.attcompression)
               FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
               LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
              WHERE c.relnamespace = $1::regnamespace AND c.relkind IN ('r', 'p') AND c.relname <> ALL ($2)
                AND a.attnum > 0 AND NOT a.attisdropped
              ORDER BY c.relname, a.attnum) AS columns,
       ARRAY(SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid
               JOIN pg_class c ON c.oid = i.indexrelid
              WHERE t.relnamespace = $1::regnamespace AND t.relname <> ALL ($2) ORDER BY c.relname) AS indexes,
       ARRAY(SELECT format('%s %s %s', t.relname, k.conname, pg_get_constraintdef(k.oid))
               FROM pg_constraint k JOIN pg_class t ON t.oid = k.conrelid
              WHERE k.connamespace = $1::regnamespace AND t.relname <> ALL ($2) ORDER BY k.conname) AS constraints,
       ARRAY(SELECT pg_get_functiondef(p.oid) FROM pg_proc p WHERE p.pronamespace = $1::regnamespace
              ORDER BY p.proname, pg_get_function_identity_arguments(p.oid)) AS functions`,
    [`"${schema}"`, bookkeeping],
  );
  return JSON.parse(JSON.stringify(rows[0]).split(schema).join('<schema>'));
}

/**
 * The file sent whole, as one simple-protocol query: PostgreSQL runs its statements in order, in one implicit
 * transaction, as for a tool that sends a migration.sql as it is.
 */
async function runAsOneScript(schema: string, text: string): Promise<void> {
  const client = await sqlClient(schema);
  try {
    await client.query(text);
  } finally {
    await client.end();
  }
}

/**
 * The file as a custom migration of drizzle-kit (`drizzle-kit generate --custom` writes the folder's journal and an
 * empty .sql file, which the user fills), run by drizzle-orm's migrator, which `drizzle-kit migrate` runs: split at
 * the breakpoints, every part in one transaction.
 */
async function runAsDrizzleMigration(schema: string, text: string): Promise<void> {
  const folder = await mkdtemp(join(tmpdir(), 'drizzle-migrations-'));
  const client = await sqlClient(schema);
  try {
    await mkdir(join(folder, 'meta'));
    const tag = '0000_idempotency_keys';
    const journal = {
      version: '7',
      dialect: 'postgresql',
      entries: [{ idx: 0, version: '7', when: 1764460800000, tag, breakpoints: true }],
    };
    await writeFile(join(folder, 'meta', '_journal.json'), JSON.stringify(journal));
    await writeFile(join(folder, `${tag}.sql`), text);
    await migrate(drizzle(client), { migrationsFolder: folder, migrationsSchema: schema });
  } finally {
    await client.end();
    await rm(folder, { recursive: true, force: true });
  }
}

/** The key table made by the module's migration, run as an app runs it (`runMigrationsWithLock`). */
async function runModuleMigration(schema: string): Promise<void> {
  const dataSource = await new DataSource({
    ...dataSourceOptions(schema),
    migrations: [CreateIdempotencyKeys1764460800000],
  }).initialize();
  try {
    const applied = await runMigrationsWithLock(dataSource);
    expect(applied.map((migration) => migration.name)).toEqual(['CreateIdempotencyKeys1764460800000']);
  } finally {
    await dataSource.destroy();
  }
}

async function catalogOf(schema: string): Promise<unknown> {
  const client = await sqlClient(schema);
  try {
    return await keyTableCatalog(client, schema);
  } finally {
    await client.end();
  }
}

const fileText = () => readFile(KEY_TABLE_SQL_FILE, 'utf8');

describe('sql/idempotency-keys.sql against the migration', () => {
  let byMigration: unknown;

  beforeAll(async () => {
    const schema = await freshSchema('key_sql_migration');
    await runModuleMigration(schema);
    byMigration = await catalogOf(schema);
  });

  it('the catalog compared is the key table, its indexes, constraints and functions', () => {
    const catalog = byMigration as Record<string, string[]>;
    expect(catalog.relations).toEqual([
      'idempotency_keys r p {fillfactor=90}',
      'idempotency_keys_expiry_floor_idx i p {}',
      'idempotency_keys_pkey i p {}',
    ]);
    expect(catalog.columns).toHaveLength(17);
    // How the bodies are kept (lz4, or out of line where the server lacks it) is compared too.
    expect(catalog.columns).toContainEqual(
      expect.stringMatching(/ response_body bytea .* storage=(x compression=l|e compression=)$/),
    );
    expect(catalog.constraints).toHaveLength(2);
    expect(catalog.functions).toHaveLength(5);
    expect(catalog.functions.join('\n')).toContain('nest-idempotency-pg key functions');
  });

  it('run as one script makes the catalog the migration makes; run again, changes nothing', async () => {
    const schema = await freshSchema('key_sql_script');
    await runAsOneScript(schema, await fileText());
    expect(await catalogOf(schema)).toEqual(byMigration);
    await runAsOneScript(schema, await fileText());
    expect(await catalogOf(schema)).toEqual(byMigration);
  });

  it('run on a key table an earlier version made, upgrades it to the catalog the migration makes', async () => {
    const schema = await freshSchema('key_sql_upgrade');
    await runModuleMigration(schema);
    const client = await sqlClient(schema);
    try {
      // As an earlier release left it: claim functions of an older version, no expiry_floor, the index on
      // expires_at, no fillfactor.
      await client.query(`DO $$ DECLARE f text; BEGIN
        FOREACH f IN ARRAY ARRAY['idempotency_keys_claim', 'idempotency_keys_claim_in_transaction'] LOOP
          EXECUTE replace(pg_get_functiondef(f::regproc), '${KEY_FUNCTIONS_VERSION}', 'an older version');
        END LOOP; END $$`);
      await client.query('ALTER TABLE idempotency_keys DROP COLUMN expiry_floor');
      await client.query('CREATE INDEX idempotency_keys_expires_at_idx ON idempotency_keys (expires_at)');
      await client.query('ALTER TABLE idempotency_keys RESET (fillfactor)');
      await client.query(`INSERT INTO idempotency_keys (tenant_id, key, fingerprint, status, owner_token, lease_expires_at, expires_at)
                          VALUES ('t', 'kept', 'fp', 'in_flight', gen_random_uuid(), now(), now() + interval '1 hour')`);
      expect(await catalogOf(schema)).not.toEqual(byMigration);
    } finally {
      await client.end();
    }
    await runAsOneScript(schema, await fileText());
    expect(await catalogOf(schema)).toEqual(byMigration);
  });

  it("run as a drizzle-kit custom migration by drizzle-orm's migrator makes the catalog the migration makes", async () => {
    const schema = await freshSchema('key_sql_drizzle');
    await runAsDrizzleMigration(schema, await fileText());
    expect(await catalogOf(schema)).toEqual(byMigration);
    const client = await sqlClient(schema);
    try {
      expect((await client.query('SELECT count(*)::int AS n FROM __drizzle_migrations')).rows).toEqual([{ n: 1 }]);
    } finally {
      await client.end();
    }
  });
});

describe.each(ADAPTERS)('the module over %s on a key table made only from sql/idempotency-keys.sql', (adapter) => {
  let api: TestApp;
  let db: pg.Client;
  const run = `${adapter}-${Date.now()}`;

  beforeAll(async () => {
    const schema = await freshSchema(`key_sql_app_${adapter}`);
    await runAsOneScript(schema, await fileText());
    db = await sqlClient(schema);
    await db.query(`CREATE TABLE effects (
      id bigserial PRIMARY KEY, tenant text NOT NULL, label text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`);
    // A data source with no migrations: the start-up schema check sees only what the file made.
    api = await startTestApp(adapter, schema);
  });

  afterAll(async () => {
    await api?.close();
    await db?.end();
  });

  const effects = async (label: string) =>
    (await db.query('SELECT count(*)::int AS n FROM effects WHERE label = $1', [label])).rows[0].n as number;

  it.each([
    ['separate', '/items'],
    ['request-transaction', '/in-tx'],
  ])('claim mode %s: claims, completes with the handler write, replays, refuses another body', async (_mode, path) => {
    const label = `${run}${path.replace('/', '-')}`;
    const first = await post(api.url, path, { label }, `k-${label}`);
    expect(first.status).toBe(201);
    expect(first.headers['idempotent-replayed']).toBeUndefined();
    const { rows } = await db.query('SELECT status, response_status FROM idempotency_keys WHERE key = $1', [`k-${label}`]);
    expect(rows).toEqual([{ status: 'completed', response_status: 201 }]);

    const replay = await post(api.url, path, { label }, `k-${label}`);
    expect(replay.status).toBe(201);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(Buffer.compare(replay.body, first.body)).toBe(0);

    const other = await post(api.url, path, { label, other: true }, `k-${label}`);
    expect(other.status).toBe(422);
    expect(api.probe.count(label)).toBe(1);
    expect(await effects(label)).toBe(1);
  });
});
