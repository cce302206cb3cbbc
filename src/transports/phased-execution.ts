import type { EntityManager } from 'typeorm';
import type { IdempotencyEngine } from '../core/idempotency-engine.js';
import type { Phases } from '../core/phases.js';
import type { ClaimInfo, EngineOutcome, PhasedWork, WorkScope } from '../core/work.js';
import type { AppTransactionManager } from '../transaction/app-transaction-manager.js';
import { idempotencyContext, type IdempotencyExecutionContext } from '../transaction/idempotency-context.js';
import type { Done } from './transport.js';

/** Runs `work` as phases: no transaction around it, one per phase, each visible through `TransactionHost`. */
export function executePhased<R>(
  engine: IdempotencyEngine<EntityManager>,
  appTransactions: AppTransactionManager | undefined,
  work: WorkScope,
  context: IdempotencyExecutionContext,
  body: (claim: ClaimInfo, phases: Phases<EntityManager>) => Promise<Done<R>>,
): Promise<EngineOutcome<R>> {
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
  return engine.executePhased(phased);
}
