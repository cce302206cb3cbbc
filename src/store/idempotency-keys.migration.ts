import type { MigrationInterface, QueryRunner } from 'typeorm';
import { DEFAULT_TABLE_NAME } from '../idempotency.constants.js';
import { createTableStatements, quoteTableName } from './sql.js';

/**
 * A migration class for the key table, to add to your own `migrations` list.
 * Safe when several app instances run it at once: a transaction-level
 * advisory lock serialises them and every statement is `IF NOT EXISTS`.
 *
 * @param tableName the same `tableName` given to the module (default `idempotency_keys`).
 */
export function createIdempotencyKeysMigration(tableName: string = DEFAULT_TABLE_NAME): new () => MigrationInterface {
  // TypeORM reads the timestamp off the end of the name; a custom table gets its own name so both can coexist.
  const migrationName =
    tableName === DEFAULT_TABLE_NAME
      ? 'CreateIdempotencyKeys1764460800000'
      : `CreateIdempotencyKeys_${tableName.replace(/[^A-Za-z0-9]/g, '_')}_1764460800000`;
  return class implements MigrationInterface {
    name = migrationName;

    async up(queryRunner: QueryRunner): Promise<void> {
      await queryRunner.query('SELECT pg_advisory_xact_lock(hashtextextended($1, 0))', [`nest-idempotency:migrate:${tableName}`]);
      for (const statement of createTableStatements(tableName)) await queryRunner.query(statement);
    }

    async down(queryRunner: QueryRunner): Promise<void> {
      await queryRunner.query(`DROP TABLE IF EXISTS ${quoteTableName(tableName)}`);
    }
  };
}

/** The migration for the default table name `idempotency_keys`. */
export const CreateIdempotencyKeys1764460800000 = createIdempotencyKeysMigration();
