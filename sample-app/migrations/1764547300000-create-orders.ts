import type { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * The checkout flow's tables: orders, the fake payment provider's own ledger
 * (a stand-in for another company's system, which only shares our database
 * for convenience), and the receipts the outbox relay delivered.
 */
export class CreateOrders1764547300000 implements MigrationInterface {
  name = 'CreateOrders1764547300000';

  async up(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`
      CREATE TABLE orders (
        id text PRIMARY KEY,
        tenant_id text NOT NULL,
        amount integer NOT NULL CHECK (amount BETWEEN 1 AND 100000000),
        currency text NOT NULL,
        customer text NOT NULL,
        email text NOT NULL,
        status text NOT NULL CHECK (status IN ('pending', 'paid')),
        payment_id text,
        created timestamptz NOT NULL DEFAULT now()
      )`);
    await queryRunner.query(`
      CREATE TABLE provider_charges (
        id text PRIMARY KEY,
        idempotency_key text NOT NULL UNIQUE,
        amount integer NOT NULL,
        currency text NOT NULL,
        created timestamptz NOT NULL DEFAULT now()
      )`);
    await queryRunner.query(`
      CREATE TABLE receipt_deliveries (
        id bigserial PRIMARY KEY,
        message_id bigint NOT NULL,
        order_id text NOT NULL,
        email text NOT NULL,
        delivered_at timestamptz NOT NULL DEFAULT now()
      )`);
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query('DROP TABLE receipt_deliveries');
    await queryRunner.query('DROP TABLE provider_charges');
    await queryRunner.query('DROP TABLE orders');
  }
}
