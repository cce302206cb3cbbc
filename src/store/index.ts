/**
 * `nest-idempotency-pg/store`: the store contract, for a store of your own. Extend
 * `IdempotencyStore` (it is also the DI token) and give the class to the module's
 * `store` extra; the module's own store, `PostgresIdempotencyStore`, comes from the root.
 */
export {
  IdempotencyStore,
  type BeginResult,
  type ClaimMode,
  type ClaimRef,
  type ClaimRequest,
  type ClaimResult,
  type OpenAttempt,
  type PhaseState,
  type StoredResponse,
  type SweepOptions,
  type SweepResult,
} from '../core/idempotency-store.js';
export { beginAttempt } from '../core/begin-attempt.js';
