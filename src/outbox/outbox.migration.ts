import type { MigrationInterface, QueryRunner } from 'typeorm';
import { DEFAULT_OUTBOX_TABLE_NAME } from '../idempotency.constants.js';
import { createOutboxStatements, quoteTableName } from '../store/sql.js';

/**
 * A migration class for the outbox table, to add to your own `migrations`.
 * Safe when several instances run it at once (advisory lock, `IF NOT EXISTS`).
 */
export function createOutboxMigration(tableName: string = DEFAULT_OUTBOX_TABLE_NAME): new () => MigrationInterface {
  const migrationName =
    tableName === DEFAULT_OUTBOX_TABLE_NAME
      ? 'CreateOutboxMessages1764547200000'
      : `CreateOutboxMessages_${tableName.replace(/[^A-Za-z0-9]/g, '_')}_1764547200000`;
  return class implements MigrationInterface {
    name = migrationName;

    async up(queryRunner: QueryRunner): Promise<void> {
      await queryRunner.query('SELECT pg_advisory_xact_lock(hashtextextended($1, 0))', [`nest-idempotency:migrate:${tableName}`]);
      for (const statement of createOutboxStatements(tableName)) await queryRunner.query(statement);
    }

    async down(queryRunner: QueryRunner): Promise<void> {
      await queryRunner.query(`DROP TABLE IF EXISTS ${quoteTableName(tableName)}`);
    }
  };
}

/** The outbox migration for the default table name `outbox_messages`. */
export const CreateOutboxMessages1764547200000 = createOutboxMigration();
