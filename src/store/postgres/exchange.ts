import type { SourceDataSource, SourceQueryRunner } from '../connection.js';
import { redactQueryError } from '../redacted-query-error.js';
import { installRedactingLogger } from '../redacting-logger.js';
import { pipelined } from './pipelined.js';
import type { PipelinedResult, PipelinedStatement } from './pipeline-types.js';
import type { PgClient } from './pools.js';

/** Sends `statements` in one round trip, each logged (redacted); a failure is logged once, without text or values. */
export async function exchange(
  client: PgClient,
  statements: readonly PipelinedStatement[],
  source: SourceDataSource,
  runner?: SourceQueryRunner,
): Promise<PipelinedResult[]> {
  installRedactingLogger(source);
  for (const statement of statements) source.logger.logQuery(statement.text, statement.values, runner);
  const results = await pipelined(client, statements);
  return results.map((result, i) => {
    if (result.ok) return result;
    const { text, values = [] } = statements[i];
    source.logger.logQueryError(result.error as Error, text, values, runner);
    return { ok: false, error: redactQueryError(result.error, values) };
  });
}
