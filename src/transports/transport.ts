import type { StoredResponse } from '../core/idempotency-store.js';
import type { FailurePolicy, FailureReading } from '../core/outcomes.js';
import type { ClaimInfo, EngineOutcome } from '../core/work.js';

/** What the handler's run gives the engine: the response to store, and the value to pass on. */
export type Done<R> = { response: StoredResponse; result: R };

/** One request of one transport (HTTP, GraphQL, messages): what it supplies to `runIdempotent`. */
export interface Transport<R = unknown> {
  /** The request's key, or undefined when it carries none. Throws when the key is malformed. */
  readKey(): string | undefined;
  /** The fingerprint of the request when the route sets no `fingerprint` of its own. */
  fingerprint(): string;
  /** Runs the handler once the key is claimed. */
  invoke(claim: ClaimInfo): Promise<Done<R>>;
  /** Reads a failure of the handler, once its writes rolled back. */
  readFailure(error: unknown): FailureReading | Promise<FailureReading>;
  /** Told which policy decided a failure (`'rejected'`: the handler's body never started). */
  decided?(policy: FailurePolicy | 'rejected'): void;
  /** Runs the handler with no idempotency: a route whose key is optional, called without one. */
  runWithoutKey(): void;
  /** Sends the outcome on: the handler's result, a replay, or a stored failure. */
  answer(outcome: EngineOutcome<R>): void | Promise<void>;
  /** Answers an error of the engine (409, 422, 503, ...), or the app's own. */
  fail(error: unknown, key: string): void | Promise<void>;
  /** Answers a request refused before anything was claimed, at `step`; without it, as `fail` does (a problem). */
  refuse?(error: unknown, step: 'key' | 'tenant' | 'fingerprint'): void | Promise<void>;
  /** Something the path did not expect (a bug); without it, the error goes on to the app's filters. */
  unexpected?(error: unknown): void;
}
