import { oneByOne } from './one-by-one.js';

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
  query(
    text: string,
    values: unknown[] | undefined,
    callback: (error: Error | null, result: { rows: unknown[]; rowCount: number | null }) => void,
  ): void;
  query(
    config: PipelinedStatement,
    callback: (error: Error | null, result: { rows: unknown[]; rowCount: number | null }) => void,
  ): void;
  /** node-postgres 8.23+: send queries without waiting for the previous answer. */
  pipeline?: boolean;
  /** Present on clients that can pipeline (8.23+); older clients queue one query at a time. */
  _sentQueryQueue?: unknown[];
  connection?: { stream?: { cork?: () => void; uncork?: () => void } };
}

/**
 * Sends `statements` on `client` (held by the caller, nothing else in flight) in one round trip and one corked
 * write: node-postgres 8.23's pipelining, a Sync after each statement, values always as parameters (PostgreSQL logs a
 * failing statement's text, its parameters only with `log_parameter_max_length_on_error` above 0). Every statement
 * runs whatever the one before answered, as PostgreSQL runs them: after an error in a transaction block the later
 * ones fail and a COMMIT answers ROLLBACK. Before 8.23: `oneByOne`, the same results, a round trip each.
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
      // Every statement has answered (or failed with the connection): nothing is left in flight that would be read
      // in pipeline mode, and the client goes back to the pool as the pool lent it.
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

export type Answer = (error: unknown, result?: { rows: unknown[]; rowCount: number | null }) => void;

/**
 * One statement, answered through `callback`. A statement with values and no
 * name goes as text and values: node-postgres copies a config object
 * property by property, a measurable part of a short query's CPU.
 */
export function send(client: PipelineClient, statement: PipelinedStatement, callback: Answer): void {
  try {
    if (statement.name === undefined) client.query(statement.text, statement.values, callback);
    else client.query(statement, callback);
  } catch (error) {
    // Thrown synchronously (e.g. a client already ended): answered like any failure, after this turn.
    process.nextTick(callback, error);
  }
}
