import type { ClaimMode, StoredResponse } from './idempotency-store.js';
import type { FailureDecision } from './outcomes.js';
import type { Phases, TransactionOutcome } from './phases.js';

/*
 * What the engine is given to run and what it answers: the types a
 * transport (HTTP, GraphQL, messages) or `IdempotencyService.execute` fills.
 */

/** What identifies one idempotent unit of work, and how long it may hold and keep its key. */
export interface WorkScope {
  tenant: string;
  key: string;
  fingerprint: string;
  leaseMs: number;
  ttlMs: number;
  /**
   * Classifies an error thrown by the work, or a `CommitRefusedError` when
   * the database refused to commit it (never a failure to reach the store),
   * once the work's writes have rolled back. May wait, e.g. for the response
   * an HTTP exception filter renders.
   */
  onFailure: (error: unknown) => FailureDecision | Promise<FailureDecision>;
  /**
   * How long a duplicate may wait for the attempt in flight to finish, then
   * replay its response, instead of an immediate `KeyInFlightError`. 0 (the
   * default) does not wait.
   */
  waitMs?: number;
  /** Renew the lease while the work runs, so a slow but live attempt is never taken over. */
  heartbeat?: boolean;
  /**
   * The longest the heartbeat keeps the key, from the claim: then it stops,
   * the lease runs out and the attempt can be taken over (and fenced) like
   * a dead one. Default ten leases.
   */
  maxHoldMs?: number;
  /** Told once when the heartbeat stops at `maxHoldMs`. */
  onHoldExceeded?: () => void;
  /**
   * `'separate'` (default): the claim commits on its own before the work's
   * transaction. `'request-transaction'`: the claim is the first statement of
   * the work's transaction; a duplicate waits on its row lock (at most
   * `waitMs`), and a failure rolls the claim back with everything else.
   */
  claimMode?: ClaimMode;
  /** Names the work in spans, metrics and events (e.g. the controller method); never the key. */
  label?: string;
  /** Keep the answer once committed, and answer retries of it, from memory (the engine's `CompletedAnswers`). */
  replayFromMemory?: boolean;
}

/** The claim an execution holds while its work runs. */
export interface ClaimInfo {
  /** 1 for a fresh claim, then one more for each takeover. */
  attempt: number;
  /** The same for every attempt of one use of the key, new once it expired: derived downstream keys hang off it. */
  generation: string;
}

export interface IdempotentWork<Tx, R> extends WorkScope {
  /**
   * Runs inside the business transaction; `response` is stored in that same
   * transaction. `ended` settles once the transaction has ended (committed,
   * rolled back, or unknown), for the app's own transaction manager.
   */
  run: (tx: Tx, claim: ClaimInfo, ended: Promise<TransactionOutcome>) => Promise<{ response: StoredResponse; result: R }>;
}

export interface PhasedWork<Tx, R> extends WorkScope {
  /** Runs with no surrounding transaction: each phase opens its own. `response` is stored once it returns. */
  run: (phases: Phases<Tx>, claim: ClaimInfo) => Promise<{ response: StoredResponse; result: R }>;
  /**
   * Wraps each phase's work, e.g. to expose its transaction through
   * AsyncLocalStorage; `ended` settles once the phase's transaction has ended.
   */
  enterPhase?: <T>(tx: Tx, fn: () => Promise<T>, ended: Promise<TransactionOutcome>) => Promise<T>;
}

export type EngineOutcome<R> =
  | { kind: 'executed'; response: StoredResponse; result: R }
  | { kind: 'replayed'; response: StoredResponse }
  /** The work failed and the policy stored `response`; `error` is what it threw. */
  | { kind: 'failure-stored'; response: StoredResponse; error: unknown };
