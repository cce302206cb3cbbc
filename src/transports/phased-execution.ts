import type { EntityManager } from 'typeorm';
import type { Phases } from '../core/phases.js';
import type { ClaimInfo, EngineOutcome, PhasedWork, WorkScope } from '../core/work.js';
import { idempotencyContext, type IdempotencyExecutionContext } from '../transaction/idempotency-context.js';
import type { IdempotencyRuntime } from './run-idempotent.js';
import type { Done } from './transport.js';

/** Runs `work` as phases: no transaction around it, one per phase, each visible through `TransactionHost`. */
export function executePhased<R>(
  runtime: IdempotencyRuntime,
  work: WorkScope,
  context: IdempotencyExecutionContext,
  body: (claim: ClaimInfo, phases: Phases<EntityManager>) => Promise<Done<R>>,
): Promise<EngineOutcome<R>> {
  const { appTransactions } = runtime;
  const phased: PhasedWork<EntityManager, R> = {
    ...work,
    run: (phases, claim) => {
      context.phases = phases;
      context.scope = { tenant: work.tenant, key: work.key, generation: claim.generation };
      return idempotencyContext.run(context, () => body(claim, phases));
    },
    enterPhase: (manager, fn, ended) =>
      idempotencyContext.run({ ...context, manager, transactional: true }, () =>
        appTransactions ? appTransactions.join(manager, fn, ended) : fn(),
      ),
  };
  return runtime.engine.executePhased(phased);
}
