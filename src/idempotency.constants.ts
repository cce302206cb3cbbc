/** Metadata key for `@Idempotent()` route options. */
export const IDEMPOTENT_METADATA = 'nest-idempotency:idempotent';
/** Metadata key for `@SkipIdempotency()`. */
export const SKIP_IDEMPOTENCY_METADATA = 'nest-idempotency:skip';
/** DI token of the validated, defaulted options (`ResolvedIdempotencyOptions`). */
export const IDEMPOTENCY_OPTIONS = Symbol('IDEMPOTENCY_OPTIONS');

// The wire's names, shared with the Nest-free client.
export { DEFAULT_HEADER, REPLAYED_HEADER } from './core/protocol.js';

export const DEFAULT_TTL_MS = 24 * 60 * 60 * 1000;
export const DEFAULT_LEASE_MS = 30_000;
export const DEFAULT_MAX_KEY_LENGTH = 255;
export const DEFAULT_TABLE_NAME = 'idempotency_keys';
export const DEFAULT_OUTBOX_TABLE_NAME = 'outbox_messages';
export const DEFAULT_LEDGER_TABLE_NAME = 'effect_ledger';
/** Deliveries of a failing message before it is dead-lettered. */
export const DEFAULT_MAX_DELIVERIES = 5;
export const DEFAULT_UNAVAILABLE_RETRY_AFTER_S = 5;
/** Longest response body held and stored per request, in bytes (1 MiB). */
export const DEFAULT_MAX_RESPONSE_BYTES = 1024 * 1024;
export const DEFAULT_SWEEP_INTERVAL_MS = 60_000;
export const DEFAULT_SWEEP_BATCH_SIZE = 250;
export const DEFAULT_SWEEP_MAX_DURATION_MS = 10_000;
export const DEFAULT_SWEEP_DUTY_CYCLE = 0.5;

/** Response headers always stored and replayed (lower case). */
export const DEFAULT_REPLAY_HEADERS = ['content-type', 'location', 'etag', 'content-location'] as const;
/** Never stored or replayed, whatever the allowlist says: they are per-response or per-user. */
export const NEVER_REPLAYED_HEADERS = new Set(['set-cookie', 'content-length', 'transfer-encoding', 'connection', 'date']);

/** DI token of the TypeORM `DataSource` the module uses. */
export const IDEMPOTENCY_DATA_SOURCE = Symbol('IDEMPOTENCY_DATA_SOURCE');
/** DI token of the engine's observer (spans, metrics and the typed events). */
export const IDEMPOTENCY_OBSERVER = Symbol('IDEMPOTENCY_OBSERVER');
/** DI token of the small data source the module's own short statements use (or undefined: the main one). */
export const IDEMPOTENCY_CLAIM_DATA_SOURCE = Symbol('IDEMPOTENCY_CLAIM_DATA_SOURCE');
/** Connections reserved for claims, replays, conflicts, releases and lease renewals. */
export const DEFAULT_RESERVED_CONNECTIONS = 2;
