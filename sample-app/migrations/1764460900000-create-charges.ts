import type { MigrationInterface, QueryRunner } from 'typeorm';

/** The `charges` table. Table names are unqualified: they resolve through the connection's search_path. */
export class CreateCharges1764460900000 implements MigrationInterface {
  name = 'CreateCharges1764460900000';

  async up(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`
      CREATE TABLE charges (
        id text PRIMARY KEY,
        tenant_id text NOT NULL,
        amount integer NOT NULL CHECK (amount BETWEEN 1 AND 100000000),
        currency text NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
        customer text NOT NULL,
        description text,
        metadata jsonb NOT NULL DEFAULT '{}',
        status text NOT NULL,
        created timestamptz NOT NULL DEFAULT now()
      )`);
    await queryRunner.query('CREATE INDEX charges_tenant_created_idx ON charges (tenant_id, created, id)');
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query('DROP TABLE charges');
  }
}
