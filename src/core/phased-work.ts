import type { IdempotencyEngine } from './idempotency-engine.js';
import { observeExecution } from './engine-observation.js';
import type { EngineOutcome, PhasedWork } from './work.js';

/** Like the engine's `execute`, for work written as phases (see `Phases`); always claimed separately. */
export function executePhasedWork<Tx, R>(engine: IdempotencyEngine<Tx>, work: PhasedWork<Tx, R>): Promise<EngineOutcome<R>> {
  return (
    engine.fromMemory<R>(work) ??
    observeExecution(engine.observer, work, (trace) => engine.lifecycle(work, 'separate', work, trace))
  );
}
