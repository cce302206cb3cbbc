/**
 * One app instance's start-up migration step, in an OS process of its own,
 * driven by test/locked-migrations.e2e.spec.ts over stdin/stdout (started
 * through run-typescript.mjs; env DATABASE_URL and MIGRATION_INSTANCE, a name).
 * Per round:
 * - `prepare <schema> <mode>`: with mode `all` or `each`, connects a data
 *   source to `schema` (runMigrationsWithLock then runs with that transaction
 *   mode); with `factory`, nothing yet (migratingDataSourceFactory connects as
 *   part of its work). Answers `ready`.
 * - `go`: migrates, answers `applied <JSON list of migration names>` or
 *   `failed <message>`, and disconnects.
 * The two steps let every instance start migrating at the same moment.
 */
import { createInterface } from 'node:readline';
import { DataSource, type DataSourceOptions, type MigrationInterface, type QueryRunner } from 'typeorm';
import { CreateOutboxMessages1764547200000 } from '../../src/outbox/outbox.migration.js';
import { CreateIdempotencyKeys1764460800000 } from '../../src/store/idempotency-keys.migration.js';
import { migratingDataSourceFactory, runMigrationsWithLock } from '../../src/store/run-migrations.js';

const instance = process.env.MIGRATION_INSTANCE ?? String(process.pid);

/** Not idempotent on purpose: a second run fails (no IF NOT EXISTS), and the pause makes unlocked runs overlap. */
class CreateMigrationLog1764600000000 implements MigrationInterface {
  name = 'CreateMigrationLog1764600000000';
  async up(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(
      'CREATE TABLE migration_log (id serial PRIMARY KEY, migration text NOT NULL, instance text NOT NULL)',
    );
    await queryRunner.query('SELECT pg_sleep(0.3)');
    await queryRunner.query('INSERT INTO migration_log (migration, instance) VALUES ($1, $2)', [this.name, instance]);
  }
  async down(): Promise<void> {}
}

/** Leaves a row on every run, so a second run shows. */
class LogAgain1764600000001 implements MigrationInterface {
  name = 'LogAgain1764600000001';
  async up(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query('INSERT INTO migration_log (migration, instance) VALUES ($1, $2)', [this.name, instance]);
  }
  async down(): Promise<void> {}
}

function dataSourceOptions(schema: string): DataSourceOptions {
  return {
    type: 'postgres',
    url: process.env.DATABASE_URL,
    schema,
    extra: { options: `-c search_path=${schema}`, max: 4 },
    migrations: [
      CreateIdempotencyKeys1764460800000,
      CreateOutboxMessages1764547200000,
      CreateMigrationLog1764600000000,
      LogAgain1764600000001,
    ],
  };
}

async function migrate(schema: string, mode: string, dataSource: DataSource | undefined): Promise<string[]> {
  if (mode !== 'factory') {
    return (await runMigrationsWithLock(dataSource!, { transaction: mode as 'all' | 'each' })).map((m) => m.name);
  }
  const migrated = await migratingDataSourceFactory()(dataSourceOptions(schema));
  try {
    // The factory returns the data source only: what this instance applied is in the log it wrote.
    const rows = (await migrated.query('SELECT migration FROM migration_log WHERE instance = $1 ORDER BY id', [
      instance,
    ])) as Array<{ migration: string }>;
    return rows.map((row) => row.migration);
  } finally {
    await migrated.destroy();
  }
}

async function main(): Promise<void> {
  const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
  for (let next = await lines.next(); !next.done; next = await lines.next()) {
    const [command, schema, mode] = String(next.value).split(' ');
    if (command !== 'prepare') throw new Error(`expected "prepare <schema> <mode>", got ${String(next.value)}`);
    const dataSource = mode === 'factory' ? undefined : await new DataSource(dataSourceOptions(schema)).initialize();
    try {
      process.stdout.write('ready\n');
      if ((await lines.next()).value !== 'go') throw new Error('expected "go"');
      process.stdout.write(`applied ${JSON.stringify(await migrate(schema, mode, dataSource))}\n`);
    } catch (error) {
      process.stdout.write(`failed ${error instanceof Error ? error.message : String(error)}\n`);
    } finally {
      await dataSource?.destroy();
    }
  }
}

main().catch((error: unknown) => {
  process.stdout.write(`failed ${error instanceof Error ? error.message : String(error)}\n`);
  process.exitCode = 1;
});
