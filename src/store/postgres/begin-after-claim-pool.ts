import type { EntityManager } from 'typeorm';
import { performance } from 'node:perf_hooks';
import type { SourceQueryRunner } from '../connection.js';
import type { BeginResult, ClaimRequest } from '../../core/idempotency-store.js';
import { openAttempt } from './attempt.js';
import { endAndRelease } from './end-and-release.js';
import { giveBackClaim } from './begin-failed.js';
import type { ClaimAndBegin } from './claim-and-begin.js';
import type { DeferredBegin } from './deferred-begin.js';

/** What the separate claim's other ways to begin use of `ClaimAndBegin`. */
export type SeparateBegin = Pick<ClaimAndBegin, 'store' | 'parts' | 'businessReadCommitted' | 'deferBegin'>;

/**
 * A separate claim on the claim pool, then the work's BEGIN once the main
 * pool lends a connection. That wait has no heartbeat: when it outlasted a
 * third of the lease, the lease is renewed, fenced, before the work starts
 * (the engine's heartbeat then beats within the lease). A claim taken over
 * meanwhile is not run: its key is another attempt's now, in flight.
 */
export async function beginAfterClaimPool(begin: SeparateBegin, request: ClaimRequest): Promise<BeginResult<EntityManager>> {
  const { pools, statements, routing } = begin.parts;
  const claimedAt = performance.now();
  const claim = await begin.store.claim(request);
  routing.noteClaim(claim);
  if (claim.state !== 'claimed') return { claim };
  const runner = pools.main.createQueryRunner();
  let stillOurs = true;
  let holdsKeyLock: boolean;
  let deferred: DeferredBegin | undefined;
  try {
    holdsKeyLock = !(await begin.businessReadCommitted());
    if (holdsKeyLock) await runner.startTransaction();
    else deferred = await begin.deferBegin(runner);
    if (performance.now() - claimedAt > request.leaseMs / 3) stillOurs = await begin.store.renewLease(request, request.leaseMs);
    if (stillOurs && holdsKeyLock) {
      const { rows } = await pools.run(statements.holdKeyLock(request), { tx: runner.manager });
      if (!(rows as Array<{ locked: boolean }>)[0]?.locked) return await notRun(begin, runner, request);
    }
  } catch (error) {
    return giveBackClaim(begin.store, runner, request, error);
  }
  if (!stillOurs) {
    void endAndRelease(runner);
    return { claim: { state: 'in-flight', retryAfterSeconds: Math.max(1, Math.ceil(request.leaseMs / 1000)) } };
  }
  return { claim, attempt: openAttempt(begin.parts, runner, request, { holdsKeyLock, deferredBegin: deferred }) };
}

/** The claim is this attempt's, but its transaction could not hold the key's lock: give it back, run nothing. */
export async function notRun(
  begin: SeparateBegin,
  runner: SourceQueryRunner,
  request: ClaimRequest,
): Promise<BeginResult<EntityManager>> {
  await endAndRelease(runner);
  await begin.store.release(request).catch(() => false);
  return { claim: { state: 'in-flight', retryAfterSeconds: Math.max(1, Math.ceil(request.leaseMs / 1000)) } };
}
