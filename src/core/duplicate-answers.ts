import { setTimeout as sleep } from 'node:timers/promises';
import type { CompletedAnswers } from './completed-answers.js';
import { FingerprintMismatchError, KeyInFlightError } from './errors.js';
import { leaseSecondsLeft, type Claimed, type LocalExecution } from './held.js';
import type { HeldKeys } from './held-keys.js';
import type { ClaimMode, ClaimResult, StoredResponse } from './idempotency-store.js';
import type { EngineObserver } from './observer.js';
import type { EngineOutcome, WorkScope } from './work.js';

/*
 * How the engine answers a duplicate, which a new key never is: from memory, from an execution or a claim of
 * this process, or as the store's claim found the key.
 */

export type Replayed = { kind: 'replayed'; response: StoredResponse };

/**
 * The answer to a key this process completed or replayed, kept in memory (`replayFromMemory`), compared by
 * fingerprint as the store would. It does no I/O, so it gets its outcome event and no span; and it is decided
 * with no promise chain of the lifecycle's around it (a retry storm is when replays must cost least).
 */
export function replayRemembered<R>(
  observer: EngineObserver,
  work: WorkScope,
  remembered: { fingerprint: string; response: StoredResponse },
): Promise<EngineOutcome<R>> {
  const same = remembered.fingerprint === work.fingerprint;
  observer.emit(
    { type: 'outcome', outcome: same ? 'replayed' : 'mismatch', route: work.label ?? 'execute', durationMs: 0 },
    work.tenant,
  );
  return same
    ? Promise.resolve({ kind: 'replayed', response: remembered.response })
    : Promise.reject(new FingerprintMismatchError());
}

/** A duplicate of `running`, answered from it: 422 for another request, 409 when it may not wait, else its response once committed. */
export async function answeredBy(running: LocalExecution, work: WorkScope, deadline: number): Promise<Replayed | undefined> {
  if (running.fingerprint !== work.fingerprint) throw new FingerprintMismatchError();
  if (!work.waitMs) throw new KeyInFlightError(leaseSecondsLeft(running.held));
  const response = await settled(running, deadline);
  return response ? { kind: 'replayed', response } : undefined;
}

/** Waits for `running` to settle until `deadline`; undefined when it ended without a response or time ran out. */
async function settled(running: LocalExecution, deadline: number): Promise<StoredResponse | undefined> {
  const timeout = new AbortController();
  const response = await Promise.race([
    running.settled,
    sleep(Math.max(0, deadline - Date.now()), undefined, { signal: timeout.signal }).catch(() => undefined),
  ]);
  timeout.abort();
  return response;
}

/**
 * A duplicate of a claim this process has on its way (see claims-on-their-way.ts), answered by it: the same
 * replay, or the execution it started, found running here. Undefined when it failed, found the key held elsewhere
 * (perhaps completed since), or its execution ended with no answer: the duplicate then claims for itself.
 */
export async function answeredByClaim<Tx>(
  joined: Promise<Replayed | Claimed<Tx>>,
  held: HeldKeys<Tx>,
  work: WorkScope,
  deadline: number,
): Promise<Replayed | undefined> {
  const answer = await joined.catch(() => undefined);
  if (answer && 'kind' in answer) return answer;
  const started = answer && held.running(work);
  return (started && (await answeredBy(started, work, deadline))) || undefined;
}

/**
 * A claim that found the key not free, answered as the state table says: the stored response (remembered, as a
 * completion is, for no longer than the store says the record lives), 422, or 409 once the duplicate may wait
 * no longer. Undefined after a pause of up to `pause` ms: look again. In request-transaction mode the claim
 * already waited on the row lock.
 */
export async function answerNotFree(
  claim: Exclude<ClaimResult, { state: 'claimed' }>,
  work: WorkScope,
  mode: ClaimMode,
  deadline: number,
  pause: number,
  answers: CompletedAnswers | undefined,
  sentAt: number,
): Promise<Replayed | undefined> {
  switch (claim.state) {
    case 'completed':
      if (work.replayFromMemory && claim.recordExpiresInSeconds !== undefined)
        answers?.remember(work.tenant, work.key, work.fingerprint, claim.response, claim.recordExpiresInSeconds * 1000, sentAt);
      return { kind: 'replayed', response: claim.response };
    case 'mismatch':
      throw new FingerprintMismatchError();
    case 'in-flight': {
      const left = deadline - Date.now();
      if (mode === 'request-transaction' || left <= 0) throw new KeyInFlightError(claim.retryAfterSeconds);
      await sleep(Math.min(pause, left, claim.retryAfterSeconds * 1000));
      return undefined;
    }
  }
}
