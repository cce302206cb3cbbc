import type { SourceDataSource, SourceManager } from '../connection.js';
import { exchange } from './exchange.js';
import type { PipelineClient, PipelinedResult, PipelinedStatement } from './pipeline-types.js';
import { BEGIN_READ_COMMITTED } from './statements.js';
import { isUnavailableError } from './unavailable.js';

/** node-postgres's client, as far as the store uses it. */
export type PgClient = PipelineClient & {
  query(text: string): Promise<unknown>;
  escapeLiteral(value: string): string;
  /** The transaction status of the last ReadyForQuery: `I` idle, `T` in a transaction, `E` in a failed one. */
  getTransactionStatus?(): string | null;
};

/** The part of TypeORM's postgres driver the store uses: a connection of its pool. */
interface PgDriver {
  obtainMasterConnection(): Promise<[unknown, (error?: unknown) => void]>;
}

/**
 * The two pools the store's statements run on: the main data source's, which
 * the work's transactions use, and the claim pool (`claimDataSource`, the main
 * one again when there is none), for the short statements outside them.
 */
export class Pools {
  constructor(
    readonly main: SourceDataSource,
    readonly claimPool: SourceDataSource,
  ) {}

  /**
   * Runs one of the module's statements on the pg client underneath: in
   * `tx`'s transaction when given, else on a connection of `source` taken for
   * this one statement (by default the claim pool). A `write` outside a
   * transaction runs in one of its own at READ COMMITTED, in the same round
   * trip: on its own it would inherit the server's default isolation level,
   * and under REPEATABLE READ a row another connection just changed is a
   * serialization failure instead of the latest version to decide on.
   * TypeORM's query path is skipped, since for these short statements it
   * costs more app CPU than the statement does; each is still logged through
   * the data source's logger, and its parameters (keys, tenants, bodies)
   * reach neither a log nor the error it throws (see redacting-logger.ts and
   * redacted-query-error.ts).
   */
  async run(
    statement: PipelinedStatement,
    options: { tx?: SourceManager; source?: SourceDataSource; write?: boolean } = {},
  ): Promise<{ rows: unknown[]; affected: number }> {
    const runner = options.tx?.queryRunner;
    const source = options.source ?? (runner ? this.main : this.claimPool);
    const [client, release] = runner ? [(await runner.connect()) as PgClient, undefined] : await lendConnection(source);
    let failure: unknown;
    try {
      const statements = !runner && options.write ? [{ text: BEGIN_READ_COMMITTED }, statement, { text: 'COMMIT' }] : [statement];
      const results = await exchange(client, statements, source, runner);
      const answered = answerOf(results[statements.indexOf(statement)]);
      answerOf(results[statements.length - 1]);
      return { rows: answered.rows, affected: answered.rowCount ?? 0 };
    } catch (error) {
      failure = error;
      throw error;
    } finally {
      // A connection that failed is dropped from the pool rather than handed to the next caller.
      release?.(failure !== undefined && isUnavailableError(failure) ? failure : undefined);
    }
  }
}

/** A connection of `source`'s pool, and how to give it back (with the error that killed it, to drop it). */
export async function lendConnection(source: SourceDataSource): Promise<[PgClient, (error?: unknown) => void]> {
  return (await (source.driver as unknown as PgDriver).obtainMasterConnection()) as [PgClient, (error?: unknown) => void];
}

/** The statement's answer; its error, thrown, when it failed. */
export function answerOf(result: PipelinedResult): { rows: unknown[]; rowCount: number | null } {
  if (!result.ok) throw result.error;
  return result;
}
