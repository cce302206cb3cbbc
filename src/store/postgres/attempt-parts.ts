import type { ClaimRequest } from '../../core/idempotency-store.js';
import type { SourceQueryRunner } from '../connection.js';
import type { AnsweredShareRouting } from './claim-routing-answered.js';
import type { ClaimKeeper } from './request-transaction.js';
import type { DeferredBegin } from './deferred-begin.js';
import type { SeparateClaim } from './separate-claim.js';
import type { Pools } from './pools.js';
import type { PostgresIdempotencyStore } from './postgres-idempotency.store.js';
import type { KeyStatements } from './statements.js';

/** The store's own calls `begin` goes through (a subclass's overrides included). */
export type KeyCalls = Pick<PostgresIdempotencyStore, 'claim' | 'release' | 'renewLease'>;

/** What an open attempt uses of its store. */
export interface AttemptParts {
  pools: Pools;
  statements: KeyStatements;
  routing: AnsweredShareRouting;
  /** Owner tokens of open attempts whose transaction holds the key's lock (see `KeyStatements.holdKeyLock`). */
  keyLockHolders: Set<string>;
  /** How a claim committed on its own is sent. */
  separateClaim: SeparateClaim;
}

/** How an attempt was begun (see `openAttempt`). */
export interface AttemptShape {
  /** A request-transaction claim: how it keeps its claim (see `ClaimKeeper`, request-transaction.ts). */
  keeper?: ClaimKeeper;
  /** The claim wrote no row (`claim_in_transaction`): the completion writes it. */
  writesRow?: boolean;
  /** The transaction holds the key's lock (see `KeyStatements.holdKeyLock`): its lease needs no renewal. */
  holdsKeyLock?: boolean;
  /** The transaction's BEGIN waits for the work's first statement; the completion's message takes it when none came. */
  deferredBegin?: DeferredBegin;
}

/** An open attempt's state, shared by its commit (attempt.ts), rollback and abort (attempt-rollback.ts). */
export interface AttemptLife {
  parts: AttemptParts;
  runner: SourceQueryRunner;
  request: ClaimRequest;
  how: AttemptShape;
  ended: boolean;
  /** The completion is on its way: too late to abort. */
  committing: boolean;
  aborted: boolean;
  /** Counts the attempt's end (its connection given back) into the routing, once the key lock is no longer held. */
  recordEnd: () => void;
}
