/**
 * `nest-idempotency-pg/client`: the client side, with no Nest dependency
 * (plain `fetch`), for any Node service that calls an idempotent API.
 */
export { IdempotentClient, type IntentRequest } from './idempotent-client.js';
export { IdempotentResponse } from './idempotent-response.js';
export { OutcomeUnknownError, type GiveUpReason } from './errors.js';
export { RetryBudget, type RetryBudgetOptions } from './retry-budget.js';
export {
  CLIENT_DEFAULTS,
  type FetchFunction,
  type HeadersInput,
  type IdempotentClientOptions,
  type RedirectMode,
} from './client-options.js';
export { systemClock, type ClientClock } from './clock.js';
export { fullJitterDelay, retryAfterMs, type BackoffOptions } from './backoff.js';
export { businessKey, businessKeyWithin, deriveKey, type DerivationScope, type DeriveKeyOptions } from '../core/derived-keys.js';
export { IdempotencyConfigurationError } from '../core/configuration-error.js';
