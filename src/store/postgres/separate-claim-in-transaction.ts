import type { SourceDataSource, SourceQueryRunner } from '../connection.js';
import type { PipelinedResult, PipelinedStatement } from './pipeline-types.js';
import { exchange } from './exchange.js';
import type { PgClient } from './pools.js';
import { BEGIN_READ_COMMITTED } from './statements.js';

/** The separate claim inside its own READ COMMITTED transaction (see `SeparateClaim`), in one round trip. */
export async function claimInTransaction(
  client: PgClient,
  claim: PipelinedStatement,
  source: SourceDataSource,
  runner?: SourceQueryRunner,
): Promise<{ claimed: PipelinedResult; committed: PipelinedResult }> {
  const [, claimed, committed] = await exchange(
    client,
    [{ text: BEGIN_READ_COMMITTED }, claim, { text: 'COMMIT' }],
    source,
    runner,
  );
  return { claimed, committed };
}
