import type { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * The fake payment provider's merchant accounts: each charge belongs to one,
 * and its idempotency keys are scoped to it (as a real provider scopes them
 * per account). Charges recorded before accounts existed belong to none ('').
 */
export class AddProviderAccounts1764720100000 implements MigrationInterface {
  name = 'AddProviderAccounts1764720100000';

  async up(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`ALTER TABLE provider_charges ADD COLUMN account text NOT NULL DEFAULT ''`);
    await queryRunner.query('ALTER TABLE provider_charges ALTER COLUMN account DROP DEFAULT');
    await queryRunner.query('ALTER TABLE provider_charges DROP CONSTRAINT provider_charges_idempotency_key_key');
    await queryRunner.query(
      'ALTER TABLE provider_charges ADD CONSTRAINT provider_charges_account_idempotency_key_key UNIQUE (account, idempotency_key)',
    );
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query('ALTER TABLE provider_charges DROP CONSTRAINT provider_charges_account_idempotency_key_key');
    await queryRunner.query(
      'ALTER TABLE provider_charges ADD CONSTRAINT provider_charges_idempotency_key_key UNIQUE (idempotency_key)',
    );
    await queryRunner.query('ALTER TABLE provider_charges DROP COLUMN account');
  }
}
