import type { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * The fraud screen's `risk_score` on each charge. Nullable because charges
 * made before it existed were never scored; the app scores every new one.
 */
export class AddChargeRiskScore1764720000000 implements MigrationInterface {
  name = 'AddChargeRiskScore1764720000000';

  async up(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query('ALTER TABLE charges ADD COLUMN risk_score smallint CHECK (risk_score BETWEEN 0 AND 100)');
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query('ALTER TABLE charges DROP COLUMN risk_score');
  }
}
