import type { ExecutionContext } from '@nestjs/common';
import type { ClaimMode } from './core/idempotency-store.js';

/*
 * The module's and the routes' options as users write them, and as the
 * module holds them once resolved. Defaults are filled and values checked in
 * one place: resolve-options.ts.
 */

/** A duration in milliseconds, or a string such as `'30s'`, `'24h'` (parsed by the `ms` package). */
export type Duration = number | string;

/**
 * Resolves the tenant of a request. It sees the execution context, so it can
 * read the authenticated principal. Returning nothing fails the request
 * closed (500): there is no shared fallback scope. A single-tenant app says
 * so explicitly, e.g. `tenant: () => 'default'`.
 */
export type TenantResolver = (context: ExecutionContext) => string | null | undefined | Promise<string | null | undefined>;

/** Computes what identifies "the same request"; the returned value is hashed in canonical JSON form. */
export type FingerprintFunction = (context: ExecutionContext) => unknown;

/** Reads the key of a message or a GraphQL mutation from its execution context; nothing means "no key". */
export type KeyExtractor = (context: ExecutionContext) => string | null | undefined;

/**
 * What to do with the key when the handler throws an `HttpException` (e.g. a
 * 402 for a declined card) or any other error. See "Handler outcomes" in the README.
 * - `'store'`: the handler's writes roll back; the error response is stored and replayed.
 * - `'release'`: the key is deleted; a retry runs the handler again at once.
 * - `'keep'`: the key stays in flight until its lease ends, then a retry takes over.
 */
export type FailurePolicy = 'store' | 'release' | 'keep';

/** Options of the scheduled sweeper that deletes expired keys. */
export interface SweepSchedule {
  /** How often the sweeper runs. Default 60 s. */
  interval?: Duration;
  /** Rows deleted per statement (each batch commits on its own). Default 250: short statements keep claim latency flat during a sweep. */
  batchSize?: number;
  /** Time budget of one run; it stops after the batch that crosses it. Default 10 s. */
  maxDuration?: Duration;
  /**
   * Share of a run spent deleting (0 < d <= 1): after each batch the sweeper
   * rests as long as the batch took × (1 − d) / d, so a large backlog never
   * takes a whole core from requests. Default 0.5; 1 sweeps flat out.
   */
  dutyCycle?: number;
}

/** The transactional outbox (see `Outbox` and `OutboxRelay`). */
export interface OutboxOptions {
  /** Table of the messages, optionally schema-qualified. Default `'outbox_messages'`. */
  tableName?: string;
  /** Run the relay on a schedule (needs `ScheduleModule.forRoot()`), or `false` to call `OutboxRelay.relayOnce()` yourself. Default `false`. */
  relay?: OutboxRelayOptions | false;
}

export interface OutboxRelayOptions {
  /** How often the relay looks for due messages. Default 1 s. */
  interval?: Duration;
  /** Messages claimed per round. Default 50. */
  batchSize?: number;
  /** Deliveries of one batch run at the same time. Default 10. */
  concurrency?: number;
  /**
   * Delivery attempts before a message is dead-lettered, each counted when
   * the message is claimed for delivery, so an attempt that ends in a crash
   * or an expired lock counts like a failure. Default 10.
   */
  maxAttempts?: number;
  /** Wait before the first retry; doubles per attempt (with jitter). Default 1 s. */
  initialBackoff?: Duration;
  /** Longest wait between retries. Default 5 min. */
  maxBackoff?: Duration;
  /**
   * How long a claimed message is reserved for its relay before another may
   * take it over. A round may last longer: before each delivery the relay
   * renews the lock of its round's unsettled messages when less than
   * `deliveryTimeout` plus half the remaining margin is left. Default 60 s.
   */
  lockTimeout?: Duration;
  /**
   * How long a handler may take before its delivery counts as a failed attempt
   * (retried with backoff, dead-lettered after `maxAttempts`), so a hung handler
   * stalls neither later rounds nor shutdown. The handler's `AbortSignal` is
   * aborted then; a handler that ignores it cannot be cancelled and runs on,
   * its outcome ignored. Must be shorter than `lockTimeout`. Default 30 s, or
   * half of `lockTimeout` when that is shorter.
   */
  deliveryTimeout?: Duration;
}

/** Options that a route can override with `@Idempotent({...})`. */
export interface IdempotencyRouteOptions {
  /** Whether a request without a key is refused (400). With `false` it runs without idempotency. Default `true`. */
  /**
   * Answer a retry of a key this instance completed from memory, without a
   * round trip: a completed answer never changes until it expires. Checked
   * with the tenant and the fingerprint as the database would (422 for
   * another request); bounded by the module's `completedAnswers`. A key
   * deleted or edited by hand in the database is still answered from memory
   * here until its entry ends. Default `false`.
   */
  replayFromMemory?: boolean;
  required?: boolean;
  /** How long a key is remembered after its claim and again after its response is stored. Default 24 h. */
  ttl?: Duration;
  /**
   * How long an attempt owns a key before a retry may take it over. Default
   * 30 s. It may be longer than `ttl`: a key whose lease is valid never
   * counts as expired.
   */
  lease?: Duration;
  /** Policy for an `HttpException` thrown by the handler itself. Default `'store'`. */
  onHttpException?: FailurePolicy;
  /** Policy for any other error thrown by the handler. Default `'keep'`. */
  onError?: FailurePolicy;
  /** Replaces the default fingerprint (method, URL and parsed body). */
  fingerprint?: FingerprintFunction;
  /**
   * Run the handler as atomic phases (`@Phased() phases: Phases`) instead of in
   * one transaction: each phase commits on its own with a recovery point, and
   * a takeover resumes after the last one. Default `false`.
   */
  phases?: boolean;
  /**
   * Message handlers and GraphQL resolvers only (an HTTP route's key is always
   * its header): where the key comes from. A string names a field of the
   * message payload (of the mutation's arguments for a resolver); a function
   * reads it from the execution context. Default: for a message, the broker's
   * message id (RabbitMQ `messageId`, the NATS `Nats-Msg-Id` header), else the
   * payload's `idempotencyKey` field; for a mutation, the `header` of its HTTP
   * request, else its `idempotencyKey` argument.
   */
  key?: string | KeyExtractor;
  /**
   * How long a duplicate waits for the request in flight to finish, then
   * replays its response, instead of an immediate 409. Bounded in time, and
   * it holds no connection while it waits. Default `0` (the immediate 409).
   */
  wait?: Duration;
  /**
   * Renew the lease while the handler runs (every third of the lease, fenced
   * by the owner token), so a slow but live handler is never taken over; a
   * dead process's key is still taken over once one lease has passed.
   * Default `true`.
   */
  heartbeat?: boolean;
  /**
   * `'separate'` (default): the claim commits on its own before the handler's
   * transaction, so a crash mid-handler keeps the key in flight and a retry
   * waits out the lease. `'request-transaction'`: BEGIN, claim, handler,
   * completion, COMMIT, one commit per new key; a duplicate waits on the row
   * lock at most `wait`, then replays or gets a 409; a handler failure rolls
   * the claim back with everything else. Only for handlers whose effects are
   * all writes to this database; not with `phases`.
   */
  claimMode?: ClaimMode;
  /**
   * The longest the heartbeat keeps one attempt's key: past it the lease is
   * no longer renewed, runs out, and a retry takes the key over, fencing the
   * hung attempt like a dead one (its writes are rolled back when it
   * completes). At least the lease. Default ten leases.
   */
  maxHold?: Duration;
  /**
   * Message handlers only: deliveries of a message whose handler keeps failing
   * (counted by its key's attempts, and by the broker where it counts them)
   * before the message is dead-lettered instead of redelivered. Default 5.
   */
  maxDeliveries?: number;
  /**
   * HTTP routes: the longest response body, in bytes, that is held until the
   * commit and stored for replays. A longer response is refused like a
   * stream: its work rolls back, the key is released and the client gets a
   * 500 `response-too-large` problem, so a retry is safe and no request holds
   * more than this in memory. Default 1 MiB (1048576).
   */
  maxResponseBytes?: number;
}

/** The effect ledger (see `EffectLedger`): business keys recorded once, forever. */
export interface EffectLedgerOptions {
  /** Table of the recorded effects, optionally schema-qualified. Default `'effect_ledger'`. */
  tableName?: string;
}

export interface IdempotencyModuleOptions extends IdempotencyRouteOptions {
  /** Resolves the tenant of each request. Required. */
  tenant: TenantResolver;
  /** Request header carrying the key. Default `'Idempotency-Key'`. */
  header?: string;
  /** Longest accepted key, in characters after unquoting. Default 255. */
  maxKeyLength?: number;
  /** Response headers stored and replayed besides Content-Type, Location, ETag and Content-Location. Never Set-Cookie. */
  replayHeaders?: string[];
  /** Table holding the keys, optionally schema-qualified. Default `'idempotency_keys'`. */
  tableName?: string;
  /**
   * The key table is the partitioned one (`createPartitionedIdempotencyKeysMigration`):
   * the sweeper then keeps partitions made ahead and drops whole partitions
   * once nothing in them is live, instead of deleting rows. Default `false`.
   */
  partitioned?: boolean;
  /**
   * The module's tables are distributed by tenant on a Citus cluster (`distributeIdempotencyTables`, run once on
   * the coordinator; docs/scaling.md, "Past one server"), and the data source connects to the coordinator. The
   * store then sends the key writes outside the claim and the completion (renewals, phases, releases, the board's
   * release, the key lock of a REPEATABLE READ attempt) through the functions delegated to the worker that holds
   * the tenant's shard, and the sweep's batch without `SKIP LOCKED`; the start-up check refuses a layout that is
   * not completely distributed, naming what is missing. Not with `partitioned: true`. Default `false`.
   */
  citus?: boolean;
  /** Seconds in the `Retry-After` of a 503 when the store cannot be reached. Default 5. */
  unavailableRetryAfter?: number;
  /**
   * Run the claim and the completion as named prepared statements (parsed and
   * planned once per connection). Only on direct connections or PgBouncer
   * 1.21+ with `max_prepared_statements`. Default `false`.
   */
  preparedStatements?: boolean;
  /**
   * Write OpenTelemetry spans and metrics when `@opentelemetry/api` is
   * installed (with no SDK registered they cost nothing). The typed events
   * (`IdempotencyEvents`) are emitted either way. Default `true`.
   */
  telemetry?: boolean;
  /**
   * Connections of a small pool of the module's own, for claims, replays,
   * 409/422 answers, releases and lease renewals, so they never queue behind
   * business transactions. `0` shares the app's pool. Default 2.
   */
  reservedConnections?: number;
  /**
   * Create the module's tables (the key table as `tableName`, `partitioned`
   * and `citus` say, and the outbox's and the ledger's when those options are
   * given) at start-up, with the module's own locked migration runner (see
   * `migrateIdempotencyTables`): instances starting together apply each
   * migration once, recorded in `nest_idempotency_migrations`. Only with the
   * `pool` option; on TypeORM add the module's migrations to the data
   * source's own. Default false.
   */
  migrate?: boolean;
  /**
   * The bounds of the answers kept for replays from memory, on the routes
   * whose `replayFromMemory` is on: an entry lives at most `window` after
   * its completion and never past its record's expiry (less a second and 1%
   * of the TTL); the oldest go first past `maxEntries` or `maxBytes`.
   * Defaults: 10,000 entries, 32 MiB, 60 s.
   */
  completedAnswers?: { maxEntries?: number; maxBytes?: number; window?: Duration };
  /** The scheduled sweeper (needs `ScheduleModule.forRoot()`), or `false` to disable it. Default: enabled, every 60 s. */
  sweep?: SweepSchedule | false;
  /** The transactional outbox. */
  outbox?: OutboxOptions;
  /** The effect ledger; given, the start-up schema check requires its table. */
  ledger?: EffectLedgerOptions;
}

export interface ResolvedRouteOptions {
  required: boolean;
  replayFromMemory: boolean;
  waitMs: number;
  heartbeat: boolean;
  claimMode: ClaimMode;
  ttlMs: number;
  leaseMs: number;
  onHttpException: FailurePolicy;
  onError: FailurePolicy;
  fingerprint?: FingerprintFunction;
  phases: boolean;
  key?: string | KeyExtractor;
  maxDeliveries: number;
  maxResponseBytes: number;
  /** Undefined: ten of the route's leases. */
  maxHoldMs?: number;
}

export interface ResolvedIdempotencyOptions extends ResolvedRouteOptions {
  tenant: TenantResolver;
  header: string;
  maxKeyLength: number;
  replayHeaders: ReadonlySet<string>;
  tableName: string;
  partitioned: boolean;
  citus: boolean;
  unavailableRetryAfter: number;
  preparedStatements: boolean;
  reservedConnections: number;
  migrate: boolean;
  telemetry: boolean;
  /** The bounds of the answers kept for replays from memory (used by the routes whose `replayFromMemory` is on). */
  completedAnswers: { maxEntries: number; maxBytes: number; windowMs: number };
  /** How a sweep runs, scheduled (`scheduled`) or called through `IdempotencyService.sweep()`. */
  sweep: { scheduled: boolean; intervalMs: number; batchSize: number; maxDurationMs: number; dutyCycle: number };
  outbox: ResolvedOutboxOptions;
  /** `configured`: the `ledger` option was given, so the start-up schema check requires its table. */
  ledger: { tableName: string; configured: boolean };
}

export interface ResolvedOutboxOptions {
  tableName: string;
  /** Whether the `outbox` option was given: then the start-up schema check requires the outbox table too. */
  configured: boolean;
  scheduled: boolean;
  intervalMs: number;
  batchSize: number;
  concurrency: number;
  maxAttempts: number;
  initialBackoffMs: number;
  maxBackoffMs: number;
  lockMs: number;
  deliveryTimeoutMs: number;
}
