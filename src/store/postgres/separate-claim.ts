import type { SourceDataSource, SourceQueryRunner } from '../connection.js';
import type { ClaimRequest } from '../../core/idempotency-store.js';
import { READ_COMMITTED_NEEDED } from '../key-store.sql.js';
import type { PipelinedResult } from './pipeline-types.js';
import { exchange } from './exchange.js';
import type { PgClient } from './pools.js';
import type { ClaimRow } from './claim-row.js';
import type { KeyStatements } from './statements.js';
import { claimInTransaction } from './separate-claim-in-transaction.js';

/**
 * A claim committed on its own (claim mode `separate`), in one round trip: on one server's plain table sent alone,
 * its own implicit transaction. Its function writes only at READ COMMITTED: answered READ_COMMITTED_NEEDED, it is
 * sent again inside `BEGIN ISOLATION LEVEL READ COMMITTED` and `COMMIT`, as it then always is on this pool (and on
 * the partitioned table and Citus).
 */
export class SeparateClaim {
  /** A connection of this pool refused the claim alone: its connections default to another isolation level. */
  private alwaysInTransaction: boolean;

  constructor(private readonly statements: KeyStatements) {
    this.alwaysInTransaction = !statements.claimCommitsAlone;
  }

  /** The claim's answer and its commit's (the same result when it went alone), in the order they were sent. */
  async send(
    client: PgClient,
    request: ClaimRequest,
    source: SourceDataSource,
    runner?: SourceQueryRunner,
  ): Promise<{ claimed: PipelinedResult; committed: PipelinedResult }> {
    const claim = this.statements.claims.claim(request, 'claim', null);
    if (this.alwaysInTransaction) return claimInTransaction(client, claim, source, runner);
    const [claimed] = await exchange(client, [claim], source, runner);
    if (!claimed.ok || (claimed.rows[0] as ClaimRow | undefined)?.state !== READ_COMMITTED_NEEDED) {
      return { claimed, committed: claimed };
    }
    this.alwaysInTransaction = true;
    return claimInTransaction(client, claim, source, runner);
  }
}
