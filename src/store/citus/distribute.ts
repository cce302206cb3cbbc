import type { DataSource, MigrationInterface, QueryRunner } from 'typeorm';
import { distributeIdempotencyTablesStatements, type CitusLayout } from './citus.sql.js';

export type { CitusLayout } from './citus.sql.js';

/**
 * Distributes the module's tables on a Citus cluster, sharded by tenant (docs/scaling.md, "Past one server"): run it
 * once on the coordinator, after the module's migrations and after distributing `layout.colocateWith` (a business
 * table) by its tenant column. Then start the app with `citus: true`.
 *
 * It puts the Citus texts of the key table's functions in place (and the five it adds), distributes the key table
 * (and the outbox and ledger tables named in `layout`) by `tenant_id`, co-located with the business table, and
 * delegates the functions to the worker that holds the tenant's shard. Running it again changes nothing that is
 * already in place, and restores the Citus function texts a re-run of the key table's migration replaced.
 *
 * The statements run one by one on one connection of `dataSource`, outside a transaction (Citus refuses to
 * distribute a table in a transaction block that wrote before it), and with the data source's `search_path`,
 * which the delegated functions keep: on the workers they find the tables where the app does.
 */
export async function distributeIdempotencyTables(dataSource: DataSource, layout: CitusLayout): Promise<void> {
  const runner = dataSource.createQueryRunner();
  try {
    for (const statement of distributeIdempotencyTablesStatements(layout)) await runner.query(statement);
  } finally {
    await runner.release();
  }
}

/**
 * The same as a migration class, to list after the module's own migrations (and after the migration that
 * distributes `layout.colocateWith`). It runs outside TypeORM's migration transaction (`transaction = false`).
 * `down` leaves the cluster as it is: undistributing tables is an operator's decision, not a rollback's.
 */
export function createDistributeIdempotencyTablesMigration(layout: CitusLayout): new () => MigrationInterface {
  const statements = distributeIdempotencyTablesStatements(layout);
  return class implements MigrationInterface {
    name = `DistributeIdempotencyTables_${(layout.tableName ?? 'idempotency_keys').replace(/[^A-Za-z0-9]/g, '_')}_1767225600000`;
    transaction = false;

    async up(queryRunner: QueryRunner): Promise<void> {
      for (const statement of statements) await queryRunner.query(statement);
    }

    async down(): Promise<void> {}
  };
}
