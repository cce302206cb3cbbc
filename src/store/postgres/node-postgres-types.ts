/** What a statement of the work answered, as node-postgres's callback gets it. */
type Callback = (error: Error | null, result?: unknown) => void;

/** node-postgres's `Query` (a submittable), as far as the deferred BEGIN drives it. */
export interface PgQuery {
  text?: string;
  name?: string;
  callback?: Callback;
  submit(connection: PgConnection): Error | null | undefined;
  requiresPreparation(): boolean;
  hasBeenParsed(connection: PgConnection): boolean;
  handleCommandComplete(message: unknown, connection: PgConnection): void;
  handleError(error: Error, connection: PgConnection): void;
  handleReadyForQuery(connection: PgConnection): void;
}

/** node-postgres's connection: the protocol messages the deferred BEGIN writes ahead of a statement. */
export interface PgConnection {
  parse(query: { text: string; name?: string }): void;
  bind(config: { portal?: string; statement?: string; values?: unknown[] }): void;
  execute(config: { portal?: string; rows?: number }): void;
  parsedStatements: Record<string, string | undefined>;
  stream: { cork?: () => void; uncork?: () => void };
}

export type QueryClass = new (config: unknown, values?: unknown, callback?: unknown) => PgQuery;
