export type HttpAdapterName = 'express' | 'fastify';

/** Everything the sample app reads from its environment, parsed and checked once at start. */
export interface SampleConfig {
  /** `PORT`, default 3000. */
  port: number;
  /** `HTTP_ADAPTER`, default `express`. */
  httpAdapter: HttpAdapterName;
  /** `DATABASE_URL`; when unset, `main.ts` starts an embedded PostgreSQL server and fills this in. */
  databaseUrl?: string;
  /**
   * Schema holding the app's tables; unset means the server's default (`public`).
   * Not read from the environment: tests use it to keep their tables apart.
   */
  databaseSchema?: string;
  /** `IDEMPOTENCY_LEASE_MS`; unset keeps the module's default (30 s). */
  leaseMs?: number;
  /**
   * `IDEMPOTENCY_HEARTBEAT` (`true` | `false`); unset keeps the module's default (on). Off, a slow
   * handler can be taken over once its lease ends, as the reliability suite's lease scenarios need.
   */
  heartbeat?: boolean;
  /** `IDEMPOTENCY_TTL_MS`; unset keeps the module's default (24 h). */
  ttlMs?: number;
  /** `IDEMPOTENCY_SWEEP_INTERVAL_MS`; unset keeps the module's default (60 s). */
  sweepIntervalMs?: number;
  /** `SAMPLE_API_KEYS` (`key:tenant,key:tenant`): API key to tenant. */
  apiKeys: ReadonlyMap<string, string>;
  /** `PAYMENT_PROVIDER_URL`; unset means this app's own fake provider (`/provider`). */
  paymentProviderUrl?: string;
  /**
   * `PAYMENT_PROVIDER_KEY`: the credential the app sends the payment provider, and the one the fake
   * provider accepts. Another company's credential, so never one of the API keys.
   */
  paymentProviderKey: string;
  /** `SHUTDOWN_TIMEOUT_MS`, default 10 s: how long a SIGTERM waits for in-flight requests. */
  shutdownTimeoutMs: number;
  /** Whether Nest logs; tests turn it off. */
  logger: boolean;
  /** `RABBITMQ_URL`: when set, the app also consumes refund requests from RabbitMQ; unset, no broker is needed. */
  rabbitmqUrl?: string;
  /** `REFUND_QUEUE`, default `refund-requests`: the queue of refund requests (its dead letters go to `<queue>.dead`). */
  refundQueue: string;
  /** `NATS_URL`: when set, the app also consumes refund requests from NATS JetStream; unset, no NATS server is needed. */
  natsUrl?: string;
  /** `REFUND_STREAM`, default `REFUNDS`: the JetStream stream of refund requests (its dead letters in `<stream>_DEAD`). */
  refundStream: string;
  /** `REFUND_SUBJECT`, default `refund.requested`: the subject refund requests are published on (dead letters on `dead-letter.<subject>`). */
  refundSubject: string;
}

export const DEFAULT_API_KEYS = 'demo-key-tenant-a:tenant-a,demo-key-tenant-b:tenant-b';
export const DEFAULT_PAYMENT_PROVIDER_KEY = 'demo-provider-secret';

/** What NATS accepts as a stream name (no spaces, dots, wildcards or path separators), kept simple. */
const STREAM_NAME = /^[A-Za-z0-9_-]+$/;
/** A literal subject: tokens separated by dots, no wildcard (`*`, `>`) and no whitespace. */
const SUBJECT = /^[^\s.*>]+(\.[^\s.*>]+)*$/;

/** Thrown for a bad environment variable; the message names the variable and what it accepts. */
export class SampleConfigError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'SampleConfigError';
  }
}

export function loadConfig(env: NodeJS.ProcessEnv = process.env): SampleConfig {
  const apiKeys = parseApiKeys(nonEmpty(env.SAMPLE_API_KEYS) ?? DEFAULT_API_KEYS);
  const paymentProviderKey = nonEmpty(env.PAYMENT_PROVIDER_KEY) ?? DEFAULT_PAYMENT_PROVIDER_KEY;
  if (apiKeys.has(paymentProviderKey)) {
    throw new SampleConfigError("PAYMENT_PROVIDER_KEY must differ from every key in SAMPLE_API_KEYS: it is the provider's.");
  }
  return {
    port: integer(env, 'PORT', { min: 0, max: 65_535 }) ?? 3000,
    httpAdapter: adapter(env.HTTP_ADAPTER),
    databaseUrl: nonEmpty(env.DATABASE_URL),
    leaseMs: integer(env, 'IDEMPOTENCY_LEASE_MS', { min: 1 }),
    heartbeat: flag(env, 'IDEMPOTENCY_HEARTBEAT'),
    ttlMs: integer(env, 'IDEMPOTENCY_TTL_MS', { min: 1 }),
    sweepIntervalMs: integer(env, 'IDEMPOTENCY_SWEEP_INTERVAL_MS', { min: 1 }),
    apiKeys,
    paymentProviderUrl: nonEmpty(env.PAYMENT_PROVIDER_URL),
    paymentProviderKey,
    shutdownTimeoutMs: integer(env, 'SHUTDOWN_TIMEOUT_MS', { min: 0 }) ?? 10_000,
    logger: true,
    rabbitmqUrl: nonEmpty(env.RABBITMQ_URL),
    refundQueue: nonEmpty(env.REFUND_QUEUE) ?? 'refund-requests',
    natsUrl: nonEmpty(env.NATS_URL),
    refundStream: matching(env, 'REFUND_STREAM', STREAM_NAME, 'letters, digits, _ and -') ?? 'REFUNDS',
    refundSubject:
      matching(env, 'REFUND_SUBJECT', SUBJECT, 'dot-separated tokens without wildcards or spaces') ?? 'refund.requested',
  };
}

/** Parses `key:tenant,key:tenant`. A tenant may hold several keys; a key belongs to one tenant. */
export function parseApiKeys(value: string): Map<string, string> {
  const keys = new Map<string, string>();
  for (const entry of value.split(',')) {
    const trimmed = entry.trim();
    if (trimmed === '') continue;
    // The last colon separates, so a key may itself contain colons.
    const separator = trimmed.lastIndexOf(':');
    const key = separator < 0 ? '' : trimmed.slice(0, separator).trim();
    const tenant = separator < 0 ? '' : trimmed.slice(separator + 1).trim();
    if (key === '' || tenant === '') {
      throw new SampleConfigError(`SAMPLE_API_KEYS: "${redact(trimmed)}" is not of the form key:tenant.`);
    }
    if (/\s/.test(key)) throw new SampleConfigError(`SAMPLE_API_KEYS: the key for tenant "${tenant}" contains whitespace.`);
    if (keys.has(key) && keys.get(key) !== tenant) {
      throw new SampleConfigError(`SAMPLE_API_KEYS: one key is listed for two tenants ("${keys.get(key)}" and "${tenant}").`);
    }
    keys.set(key, tenant);
  }
  if (keys.size === 0) throw new SampleConfigError('SAMPLE_API_KEYS: no key:tenant pair given.');
  return keys;
}

function adapter(value: string | undefined): HttpAdapterName {
  const name = nonEmpty(value)?.toLowerCase() ?? 'express';
  if (name !== 'express' && name !== 'fastify') {
    throw new SampleConfigError(`HTTP_ADAPTER must be "express" or "fastify", not "${value}".`);
  }
  return name;
}

function flag(env: NodeJS.ProcessEnv, name: string): boolean | undefined {
  const raw = env[name];
  if (raw === undefined || raw === '') return undefined;
  if (raw !== 'true' && raw !== 'false') throw new SampleConfigError(`${name} must be true or false, got "${raw}".`);
  return raw === 'true';
}

function integer(env: NodeJS.ProcessEnv, name: string, range: { min: number; max?: number }): number | undefined {
  const raw = nonEmpty(env[name]);
  if (raw === undefined) return undefined;
  const value = Number(raw);
  if (!/^\d+$/.test(raw) || !Number.isSafeInteger(value) || value < range.min || (range.max !== undefined && value > range.max)) {
    const bounds = range.max === undefined ? `>= ${range.min}` : `${range.min}..${range.max}`;
    throw new SampleConfigError(`${name} must be an integer ${bounds}, not "${raw}".`);
  }
  return value;
}

function matching(env: NodeJS.ProcessEnv, name: string, pattern: RegExp, accepts: string): string | undefined {
  const value = nonEmpty(env[name]);
  if (value !== undefined && !pattern.test(value)) throw new SampleConfigError(`${name} must be ${accepts}, not "${value}".`);
  return value;
}

function nonEmpty(value: string | undefined): string | undefined {
  const trimmed = value?.trim();
  return trimmed ? trimmed : undefined;
}

/** Error messages may reach logs: show only the start of a would-be key. */
function redact(entry: string): string {
  return entry.length <= 4 ? '****' : `${entry.slice(0, 4)}…`;
}
