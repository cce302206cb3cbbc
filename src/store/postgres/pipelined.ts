/** One statement of a pipeline: parameterised (extended protocol) when it has values, else a simple query. */
export interface PipelinedStatement {
  text: string;
  values?: unknown[];
  /** A named prepared statement (the store's `preparedStatements` option). */
  name?: string;
}

/** What one statement of a pipeline answered. */
export type PipelinedResult = { ok: true; rows: unknown[]; rowCount: number | null } | { ok: false; error: unknown };

/** node-postgres's client, as far as pipelining it goes. */
export interface PipelineClient {
  query(config: PipelinedStatement): Promise<{ rows: unknown[]; rowCount: number | null }>;
  /** node-postgres 8.23+: send queries without waiting for the previous answer. */
  pipeline?: boolean;
  /** Present on clients that can pipeline (8.23+); older clients queue one query at a time. */
  _sentQueryQueue?: unknown[];
  connection?: { stream?: { cork?: () => void; uncork?: () => void } };
}

/**
 * Sends `statements` on `client` in one round trip, with their values as
 * parameters, never as literals in the text: node-postgres 8.23's pipelining
 * (a Sync after each statement), switched on for this exchange only, on a
 * client the caller holds and that has nothing else in flight. The socket is
 * corked meanwhile, so the whole exchange is one write.
 *
 * Every statement runs, whatever the one before it answered, as PostgreSQL
 * runs them: after an error inside a transaction block the later ones fail
 * ("current transaction is aborted") and a COMMIT answers ROLLBACK. Each
 * result says what its own statement answered; read them in order.
 *
 * A statement's values never reach the server's log: PostgreSQL logs a failing
 * statement's text, and its parameters only with
 * `log_parameter_max_length_on_error` above its default 0.
 *
 * With node-postgres before 8.23 the statements go one after another, each
 * after the previous answer: the same results, one round trip each.
 */
export async function pipelined(client: PipelineClient, statements: readonly PipelinedStatement[]): Promise<PipelinedResult[]> {
  const settle = (statement: PipelinedStatement) =>
    client.query(statement).then(
      (result): PipelinedResult => ({ ok: true, rows: result.rows, rowCount: result.rowCount }),
      (error: unknown): PipelinedResult => ({ ok: false, error }),
    );
  if (!Array.isArray(client._sentQueryQueue)) {
    const results: PipelinedResult[] = [];
    for (const statement of statements) results.push(await settle(statement));
    return results;
  }
  const stream = client.connection?.stream;
  client.pipeline = true;
  stream?.cork?.();
  let answers: Array<Promise<PipelinedResult>>;
  try {
    answers = statements.map(settle);
  } finally {
    stream?.uncork?.();
  }
  try {
    return await Promise.all(answers);
  } finally {
    // Every statement has answered (or failed with the connection): nothing is left in flight that would be read in
    // pipeline mode, and the client goes back to the pool as the pool lent it.
    client.pipeline = false;
  }
}
