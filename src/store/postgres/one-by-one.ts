import { send } from './pipelined.js';
import type { PipelineClient, PipelinedResult, PipelinedStatement } from './pipeline-types.js';

/** With node-postgres before 8.23: one statement after another, each after the previous answer. */
export async function oneByOne(client: PipelineClient, statements: readonly PipelinedStatement[]): Promise<PipelinedResult[]> {
  const results: PipelinedResult[] = [];
  for (const statement of statements) {
    results.push(
      await new Promise<PipelinedResult>((resolve) =>
        send(client, statement, (error, result) =>
          resolve(error ? { ok: false, error } : { ok: true, rows: result!.rows, rowCount: result!.rowCount }),
        ),
      ),
    );
  }
  return results;
}
