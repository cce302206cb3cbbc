import type { ClaimMode } from './core/idempotency-store.js';
import ms from 'ms';
import {
  DEFAULT_HEADER,
  DEFAULT_LEASE_MS,
  DEFAULT_LEDGER_TABLE_NAME,
  DEFAULT_MAX_DELIVERIES,
  DEFAULT_MAX_KEY_LENGTH,
  DEFAULT_MAX_RESPONSE_BYTES,
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

import type {
  Duration,
  FailurePolicy,
  IdempotencyModuleOptions,
  IdempotencyRouteOptions,
  OutboxOptions,
  ResolvedIdempotencyOptions,
  ResolvedOutboxOptions,
  ResolvedRouteOptions,
  SweepSchedule,
} from './idempotency.options.js';

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
  const citus = booleanOption(options.citus ?? false, 'citus');
  if (citus && options.partitioned) throw new IdempotencyConfigurationError(messages.config.citusPartitioned);
  return {
    ...route,
    tenant: options.tenant,
    header,
    maxKeyLength,
    replayHeaders,
    tableName,
    partitioned: booleanOption(options.partitioned ?? false, 'partitioned'),
    citus,
    unavailableRetryAfter,
    preparedStatements: booleanOption(options.preparedStatements ?? false, 'preparedStatements'),
    telemetry: booleanOption(options.telemetry ?? true, 'telemetry'),
    reservedConnections: nonNegativeInteger(options.reservedConnections ?? DEFAULT_RESERVED_CONNECTIONS, 'reservedConnections'),
    migrate: booleanOption(options.migrate ?? false, 'migrate'),
    completedAnswers: resolveCompletedAnswers(options.completedAnswers),
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
  const replayFromMemory = options.replayFromMemory ?? defaults?.replayFromMemory ?? false;
  if (typeof replayFromMemory !== 'boolean') {
    throw new IdempotencyConfigurationError(messages.config.boolean(`${where}: replayFromMemory`));
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
  const maxResponseBytes = options.maxResponseBytes ?? defaults?.maxResponseBytes ?? DEFAULT_MAX_RESPONSE_BYTES;
  if (!Number.isSafeInteger(maxResponseBytes) || maxResponseBytes < 1) {
    throw new IdempotencyConfigurationError(messages.config.maxResponseBytes(where, maxResponseBytes));
  }
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
    replayFromMemory,
    key,
    maxDeliveries,
    maxResponseBytes,
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

function resolveCompletedAnswers(
  limits: IdempotencyModuleOptions['completedAnswers'] = {},
): ResolvedIdempotencyOptions['completedAnswers'] {
  return {
    maxEntries: positiveInteger(limits.maxEntries ?? DEFAULT_COMPLETED_ANSWERS.maxEntries, 'completedAnswers.maxEntries'),
    maxBytes: positiveInteger(limits.maxBytes ?? DEFAULT_COMPLETED_ANSWERS.maxBytes, 'completedAnswers.maxBytes'),
    windowMs: limits.window === undefined ? DEFAULT_COMPLETED_ANSWERS.windowMs : toMs(limits.window, 'completedAnswers.window'),
  };
}

/** What replays from memory keep by default: enough for a retry storm's keys, little memory, a minute. */
const DEFAULT_COMPLETED_ANSWERS = { maxEntries: 10_000, maxBytes: 32 * 1024 * 1024, windowMs: 60_000 };

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
