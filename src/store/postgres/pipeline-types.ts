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

/** How one statement of a pipeline is answered. */
export type Answer = (error: unknown, result?: { rows: unknown[]; rowCount: number | null }) => void;
