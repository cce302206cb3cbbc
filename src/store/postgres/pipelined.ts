import { oneByOne } from './one-by-one.js';
import type { Answer, PipelineClient, PipelinedResult, PipelinedStatement } from './pipeline-types.js';

/**
 * Sends `statements` on `client` (held by the caller, nothing else in flight) in one round trip and one corked write
 * (node-postgres 8.23's pipelining, a Sync after each), values always as parameters, which PostgreSQL's log of a
 * failing statement leaves out. Each runs whatever the one before answered: after an error in a transaction block
 * the later ones fail and a COMMIT answers ROLLBACK. Before 8.23: `oneByOne`, a round trip each.
 */
export function pipelined(client: PipelineClient, statements: readonly PipelinedStatement[]): Promise<PipelinedResult[]> {
  if (!Array.isArray(client._sentQueryQueue)) return oneByOne(client, statements);
  return new Promise((resolve) => {
    const results = new Array<PipelinedResult>(statements.length);
    let left = statements.length;
    // A callback per statement, not a promise: node-postgres makes two promises for a query without one.
    const answer = (i: number) => (error: unknown, result?: { rows: unknown[]; rowCount: number | null }) => {
      results[i] = error ? { ok: false, error } : { ok: true, rows: result!.rows, rowCount: result!.rowCount };
      if (--left > 0) return;
      // Nothing is left in flight: the client goes back to the pool as the pool lent it.
      client.pipeline = false;
      resolve(results);
    };
    const stream = client.connection?.stream;
    client.pipeline = true;
    stream?.cork?.();
    try {
      for (let i = 0; i < statements.length; i++) send(client, statements[i], answer(i));
    } finally {
      stream?.uncork?.();
    }
  });
}

/** One statement, answered through `callback`; unnamed, as text and values (node-postgres copies a config object). */
export function send(client: PipelineClient, statement: PipelinedStatement, callback: Answer): void {
  try {
    if (statement.name === undefined) client.query(statement.text, statement.values, callback);
    else client.query(statement, callback);
  } catch (error) {
    // Thrown synchronously (e.g. a client already ended): answered like any failure, after this turn.
    process.nextTick(callback, error);
  }
}
