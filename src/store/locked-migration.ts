import type { MigrationInterface, QueryRunner } from 'typeorm';
import { quoteTableName } from './identifiers.js';

/**
 * A migration that creates one table with `IF NOT EXISTS` statements under a
 * transaction-level advisory lock, so several app instances can run it at
 * the same time. A non-default table gets its own name, so both can coexist
 * in one migrations table; TypeORM reads the timestamp off the end.
 */
export function lockedTableMigration(options: {
  baseName: string;
  timestamp: number;
  tableName: string;
  defaultTableName: string;
  statements: (tableName: string) => string[];
  /** What `down` runs; default `DROP TABLE IF EXISTS`. */
  downStatements?: (tableName: string) => string[];
}): new () => MigrationInterface {
  const { baseName, timestamp, tableName, defaultTableName, statements, downStatements } = options;
  const migrationName =
    tableName === defaultTableName
      ? `${baseName}${timestamp}`
      : `${baseName}_${tableName.replace(/[^A-Za-z0-9]/g, '_')}_${timestamp}`;
  return class implements MigrationInterface {
    name = migrationName;

    async up(queryRunner: QueryRunner): Promise<void> {
      await queryRunner.query('SELECT pg_advisory_xact_lock(hashtextextended($1, 0))', [`nest-idempotency:migrate:${tableName}`]);
      for (const statement of statements(tableName)) await queryRunner.query(statement);
    }

    async down(queryRunner: QueryRunner): Promise<void> {
      for (const statement of downStatements?.(tableName) ?? [`DROP TABLE IF EXISTS ${quoteTableName(tableName)}`]) {
        await queryRunner.query(statement);
      }
    }
  };
}
