import type { MigrationInterface, QueryRunner } from 'typeorm';
import { CreateIdempotencyKeys1764460800000 } from '../../src/index.js';

/**
 * The key table's migration run again, as docs/schema.md ("Upgrading") shows:
 * its statements are idempotent, and they upgrade a table an earlier version
 * of the module made (here: `expiry_floor`, its index, the fillfactor). A
 * database made since has nothing left to change.
 */
export class UpgradeIdempotencyKeys1767225600000 implements MigrationInterface {
  name = 'UpgradeIdempotencyKeys1767225600000';

  up(queryRunner: QueryRunner): Promise<void> {
    return new CreateIdempotencyKeys1764460800000().up(queryRunner);
  }

  // Going back is the earlier version's business (docs/schema.md, "Upgrading"): its own migration's statements again.
  async down(): Promise<void> {}
}
