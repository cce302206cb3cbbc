import type { ExecutionContext } from '@nestjs/common';
import type { ClaimMode } from './core/idempotency-engine.js';
import ms from 'ms';
import {
  DEFAULT_HEADER,
  DEFAULT_LEASE_MS,
  DEFAULT_LEDGER_TABLE_NAME,
  DEFAULT_MAX_DELIVERIES,
  DEFAULT_MAX_KEY_LENGTH,
  DEFAULT_REPLAY_HEADERS,
  DEFAULT_SWEEP_BATCH_SIZE,
  DEFAULT_SWEEP_DUTY_CYCLE,
  DEFAULT_SWEEP_INTERVAL_MS,
  DEFAULT_SWEEP_MAX_DURATION_MS,
  DEFAULT_OUTBOX_TABLE_NAME,
  DEFAULT_RESERVED_CONNECTIONS,
  DEFAULT_TABLE_NAME,
  DEFAULT_TTL_MS,
  DEFAULT_UNAVAILABLE_RETRY_AFTER_S,
  NEVER_REPLAYED_HEADERS,
} from './idempotency.constants.js';
import { IdempotencyConfigurationError } from './errors/configuration.error.js';
import { messages } from './errors/messages.js';

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
  /** The scheduled sweeper (needs `ScheduleModule.forRoot()`), or `false` to disable it. Default: enabled, every 60 s. */
  sweep?: SweepSchedule | false;
  /** The transactional outbox. */
  outbox?: OutboxOptions;
  /** The effect ledger; given, the start-up schema check requires its table. */
  ledger?: EffectLedgerOptions;
}

export interface ResolvedRouteOptions {
  required: boolean;
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
  unavailableRetryAfter: number;
  preparedStatements: boolean;
  reservedConnections: number;
  telemetry: boolean;
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

const POLICIES: readonly FailurePolicy[] = ['store', 'release', 'keep'];
const CLAIM_MODES: readonly ClaimMode[] = ['separate', 'request-transaction'];

/** The one place that fills defaults and validates module options. */
export function resolveIdempotencyOptions(options: IdempotencyModuleOptions | undefined): ResolvedIdempotencyOptions {
  if (!options || typeof options !== 'object') throw new IdempotencyConfigurationError(messages.config.missingOptions);
  if (typeof options.tenant !== 'function') throw new IdempotencyConfigurationError(messages.config.tenant);
  const route = resolveRouteOptions(options, undefined, 'IdempotencyModule');
  const header = options.header ?? DEFAULT_HEADER;
  if (typeof header !== 'string' || !/^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/.test(header)) {
    throw new IdempotencyConfigurationError(messages.config.header(header));
  }
  const maxKeyLength = options.maxKeyLength ?? DEFAULT_MAX_KEY_LENGTH;
  if (!Number.isInteger(maxKeyLength) || maxKeyLength < 1 || maxKeyLength > 8192) {
    throw new IdempotencyConfigurationError(messages.config.maxKeyLength(maxKeyLength));
  }
  const replayHeaders = new Set<string>(DEFAULT_REPLAY_HEADERS);
  for (const name of options.replayHeaders ?? []) {
    const lower = String(name).toLowerCase();
    if (NEVER_REPLAYED_HEADERS.has(lower)) throw new IdempotencyConfigurationError(messages.config.replayHeader(name));
    replayHeaders.add(lower);
  }
  const tableName = tableNameOption(options.tableName ?? DEFAULT_TABLE_NAME, 'tableName');
  const unavailableRetryAfter = options.unavailableRetryAfter ?? DEFAULT_UNAVAILABLE_RETRY_AFTER_S;
  if (!Number.isInteger(unavailableRetryAfter) || unavailableRetryAfter < 1) {
    throw new IdempotencyConfigurationError(messages.config.positive('unavailableRetryAfter', unavailableRetryAfter));
  }
  return {
    ...route,
    tenant: options.tenant,
    header,
    maxKeyLength,
    replayHeaders,
    tableName,
    partitioned: booleanOption(options.partitioned ?? false, 'partitioned'),
    unavailableRetryAfter,
    preparedStatements: booleanOption(options.preparedStatements ?? false, 'preparedStatements'),
    telemetry: booleanOption(options.telemetry ?? true, 'telemetry'),
    reservedConnections: nonNegativeInteger(options.reservedConnections ?? DEFAULT_RESERVED_CONNECTIONS, 'reservedConnections'),
    sweep: resolveSweep(options.sweep),
    outbox: resolveOutbox(options.outbox),
    ledger: {
      tableName: tableNameOption(options.ledger?.tableName ?? DEFAULT_LEDGER_TABLE_NAME, 'ledger.tableName'),
      configured: options.ledger !== undefined,
    },
  };
}

function tableNameOption(value: unknown, name: string): string {
  if (typeof value !== 'string' || !/^[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)?$/.test(value)) {
    throw new IdempotencyConfigurationError(messages.config.tableName(name, value));
  }
  return value;
}

function booleanOption(value: unknown, name: string): boolean {
  if (typeof value !== 'boolean') throw new IdempotencyConfigurationError(messages.config.boolean(`IdempotencyModule: ${name}`));
  return value;
}

function nonNegativeInteger(value: number, name: string): number {
  if (!Number.isInteger(value) || value < 0) throw new IdempotencyConfigurationError(messages.config.nonNegative(name, value));
  return value;
}

function positiveInteger(value: number, name: string): number {
  if (!Number.isInteger(value) || value < 1) throw new IdempotencyConfigurationError(messages.config.positive(name, value));
  return value;
}

function resolveOutbox(outbox: OutboxOptions | undefined): ResolvedOutboxOptions {
  const relay = outbox?.relay || {};
  const duration = (value: Duration | undefined, fallback: number, name: string) =>
    value === undefined ? fallback : toMs(value, `outbox.relay.${name}`);
  const lockMs = duration(relay.lockTimeout, 60_000, 'lockTimeout');
  const deliveryTimeoutMs = duration(relay.deliveryTimeout, Math.min(30_000, Math.ceil(lockMs / 2)), 'deliveryTimeout');
  // A delivery must be settled while its lock holds, or another relay delivers the message again meanwhile.
  if (deliveryTimeoutMs >= lockMs) {
    throw new IdempotencyConfigurationError(messages.config.deliveryTimeout(deliveryTimeoutMs, lockMs));
  }
  return {
    tableName: tableNameOption(outbox?.tableName ?? DEFAULT_OUTBOX_TABLE_NAME, 'outbox.tableName'),
    configured: outbox !== undefined,
    scheduled: !!outbox?.relay,
    intervalMs: duration(relay.interval, 1_000, 'interval'),
    batchSize: positiveInteger(relay.batchSize ?? 50, 'outbox.relay.batchSize'),
    concurrency: positiveInteger(relay.concurrency ?? 10, 'outbox.relay.concurrency'),
    maxAttempts: positiveInteger(relay.maxAttempts ?? 10, 'outbox.relay.maxAttempts'),
    initialBackoffMs: duration(relay.initialBackoff, 1_000, 'initialBackoff'),
    maxBackoffMs: duration(relay.maxBackoff, 300_000, 'maxBackoff'),
    lockMs,
    deliveryTimeoutMs,
  };
}

/**
 * Fills a route's options from the module's. Called for every route at
 * start-up, so a bad `@Idempotent({...})` stops the app with a message.
 */
export function resolveRouteOptions(
  options: IdempotencyRouteOptions,
  defaults: ResolvedRouteOptions | undefined,
  where: string,
): ResolvedRouteOptions {
  const ttlMs = options.ttl === undefined ? (defaults?.ttlMs ?? DEFAULT_TTL_MS) : toMs(options.ttl, `${where}: ttl`);
  const leaseMs = options.lease === undefined ? (defaults?.leaseMs ?? DEFAULT_LEASE_MS) : toMs(options.lease, `${where}: lease`);
  const required = options.required ?? defaults?.required ?? true;
  if (typeof required !== 'boolean') throw new IdempotencyConfigurationError(messages.config.boolean(`${where}: required`));
  const onHttpException = policy(options.onHttpException ?? defaults?.onHttpException ?? 'store', `${where}: onHttpException`);
  const onError = policy(options.onError ?? defaults?.onError ?? 'keep', `${where}: onError`);
  const fingerprint = options.fingerprint ?? defaults?.fingerprint;
  if (fingerprint !== undefined && typeof fingerprint !== 'function') {
    throw new IdempotencyConfigurationError(messages.config.fingerprint(where));
  }
  const phases = options.phases ?? defaults?.phases ?? false;
  if (typeof phases !== 'boolean') throw new IdempotencyConfigurationError(messages.config.boolean(`${where}: phases`));
  const waitMs = options.wait === undefined ? (defaults?.waitMs ?? 0) : toMs(options.wait, `${where}: wait`, { zero: true });
  const heartbeat = options.heartbeat ?? defaults?.heartbeat ?? true;
  if (typeof heartbeat !== 'boolean') throw new IdempotencyConfigurationError(messages.config.boolean(`${where}: heartbeat`));
  const claimMode = options.claimMode ?? defaults?.claimMode ?? 'separate';
  if (!CLAIM_MODES.includes(claimMode)) throw new IdempotencyConfigurationError(messages.config.claimMode(where, claimMode));
  if (claimMode === 'request-transaction' && phases) {
    throw new IdempotencyConfigurationError(messages.config.phasesInRequestTransaction(where));
  }
  const key = options.key ?? defaults?.key;
  if (key !== undefined && typeof key !== 'function' && (typeof key !== 'string' || key === '')) {
    throw new IdempotencyConfigurationError(messages.config.keyOption(where, key));
  }
  const maxDeliveries = positiveInteger(
    options.maxDeliveries ?? defaults?.maxDeliveries ?? DEFAULT_MAX_DELIVERIES,
    `${where}: maxDeliveries`,
  );
  const maxHoldMs = options.maxHold === undefined ? defaults?.maxHoldMs : toMs(options.maxHold, `${where}: maxHold`);
  if (maxHoldMs !== undefined && maxHoldMs < leaseMs) {
    throw new IdempotencyConfigurationError(messages.config.maxHold(where, maxHoldMs, leaseMs));
  }
  return {
    maxHoldMs,
    required,
    ttlMs,
    leaseMs,
    onHttpException,
    onError,
    fingerprint,
    phases,
    key,
    maxDeliveries,
    waitMs,
    heartbeat,
    claimMode,
  };
}

function resolveSweep(sweep: SweepSchedule | false | undefined): ResolvedIdempotencyOptions['sweep'] {
  const s = sweep || {};
  const batchSize = s.batchSize ?? DEFAULT_SWEEP_BATCH_SIZE;
  if (!Number.isInteger(batchSize) || batchSize < 1) {
    throw new IdempotencyConfigurationError(messages.config.positive('sweep.batchSize', batchSize));
  }
  const dutyCycle = s.dutyCycle ?? DEFAULT_SWEEP_DUTY_CYCLE;
  if (typeof dutyCycle !== 'number' || !(dutyCycle > 0 && dutyCycle <= 1)) {
    throw new IdempotencyConfigurationError(messages.config.dutyCycle(dutyCycle));
  }
  return {
    scheduled: sweep !== false,
    intervalMs: s.interval === undefined ? DEFAULT_SWEEP_INTERVAL_MS : toMs(s.interval, 'sweep.interval'),
    batchSize,
    maxDurationMs: s.maxDuration === undefined ? DEFAULT_SWEEP_MAX_DURATION_MS : toMs(s.maxDuration, 'sweep.maxDuration'),
    dutyCycle,
  };
}

function policy(value: unknown, name: string): FailurePolicy {
  if (!POLICIES.includes(value as FailurePolicy)) throw new IdempotencyConfigurationError(messages.config.policy(name, value));
  return value as FailurePolicy;
}

/**
 * Durations are milliseconds; `'30s'`-style strings are parsed here and
 * nowhere else. A string needs its unit: `'30'` would read as 30 ms where
 * the writer most likely meant seconds, so it is refused.
 */
export function toMs(value: Duration, name: string, allow: { zero?: boolean } = {}): number {
  if (typeof value === 'string' && !/^\s*-?(\d+\.?\d*|\.\d+)\s*[a-z]+\s*$/i.test(value)) {
    throw new IdempotencyConfigurationError(messages.config.duration(name, value));
  }
  const parsed = typeof value === 'string' ? ms(value as ms.StringValue) : value;
  const tooSmall = allow.zero ? parsed < 0 : parsed <= 0;
  if (typeof parsed !== 'number' || !Number.isFinite(parsed) || tooSmall || !Number.isInteger(parsed)) {
    throw new IdempotencyConfigurationError(messages.config.duration(name, value));
  }
  return parsed;
}
