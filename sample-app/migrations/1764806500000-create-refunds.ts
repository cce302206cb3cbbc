import type { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * Refunds of charges, requested over RabbitMQ (`refund.requested`) or the
 * GraphQL mutation `requestRefund`. `refund_id` is the requester's business
 * id: the effect ledger records `refund:<refund_id>` with each row, so a
 * request replayed long after its idempotency key expired refunds nothing.
 */
export class CreateRefunds1764806500000 implements MigrationInterface {
  name = 'CreateRefunds1764806500000';

  async up(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`
      CREATE TABLE refunds (
        id text PRIMARY KEY,
        tenant_id text NOT NULL,
        refund_id text NOT NULL,
        charge_id text NOT NULL,
        amount integer NOT NULL CHECK (amount > 0),
        source text NOT NULL CHECK (source IN ('message', 'graphql')),
        created timestamptz NOT NULL DEFAULT now()
      )`);
    await queryRunner.query('CREATE INDEX refunds_tenant_charge_idx ON refunds (tenant_id, charge_id)');
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query('DROP TABLE refunds');
  }
}
