import type { SourceDataSource } from '../store/connection.js';
import { quoteTableName } from '../store/identifiers.js';
import { installRedactingLogger } from '../store/redacting-logger.js';
import { sqlMarker } from '../store/sql-marker.js';
import { redactQueryError } from '../store/redacted-query-error.js';
import { boardKey } from './board-key.js';

/**
 * Whose rows a query may read or change: one tenant's, or (`null`) every
 * tenant's. Every statement below takes it as `$1`, so a scoped operator's
 * query cannot reach another tenant's rows whatever else it asks.
 */
export type TenantFilter = string | null;

/** A key's state as the contract's state table reads it. */
export type BoardKeyState = 'in-flight' | 'lease-passed' | 'completed' | 'expired';

export interface TenantKeyCounts {
  tenant: string;
  /** In flight and not expired, including those whose lease has passed. */
  inFlight: number;
  /** Of `inFlight`, those whose lease has passed: the next retry takes them over. */
  leasePassed: number;
  completed: number;
  /** Expired (they count as absent), waiting for the sweeper. */
  expired: number;
}

export interface KeyCounts {
  totals: Omit<TenantKeyCounts, 'tenant'>;
  /** Tenants with any key in the table; `tenants` lists the first of them by number of keys. */
  tenantCount: number;
  tenants: TenantKeyCounts[];
}

export interface StuckKey {
  tenant: string;
  /** Shortened (`boardKey`): never the whole key, but two keys always read apart. */
  key: string;
  /** Names this attempt for a release; it changes on every takeover, so a release never hits a newer attempt. */
  ref: string;
  attempt: number;
  createdAt: string;
  leaseExpiresAt: string;
  ageMs: number;
  leasePassed: boolean;
}

export interface KeyDetails {
  tenant: string;
  /** Shortened as in the stuck keys' list (`boardKey`); the operator who typed the key has it in full. */
  key: string;
  state: BoardKeyState;
  attempt: number;
  generation: string | null;
  createdAt: string;
  /** While the key is in flight (`in-flight`, `lease-passed`); null once it completed or expired. */
  leaseExpiresAt: string | null;
  completedAt: string | null;
  expiresAt: string;
  responseStatus: number | null;
  /** Only when the board was given `showBodies: true`. */
  response?: { headers: unknown; body: string; bodyEncoding: 'utf8' | 'base64'; truncated: boolean };
}

export interface OutboxCounts {
  /** Waiting for their first delivery. */
  pending: number;
  /** Failed at least once, waiting for their next attempt. */
  retrying: number;
  dead: number;
}

export interface DeadLetter {
  id: string;
  tenant: string | null;
  topic: string;
  attempts: number;
  lastError: string | null;
  createdAt: string;
}

const SHOWN_BODY_BYTES = 64 * 1024;

/** Counting every row of a big key table is a sequential scan: past this, the board says so rather than waiting. */
export const BOARD_STATEMENT_TIMEOUT_MS = 5_000;

const EXPIRED = `(expires_at <= now() AND NOT (status = 'in_flight' AND lease_expires_at > now()))`;

/**
 * The board's reads of the key and outbox tables, on the module's data
 * source. Its two writes are the stores': a release is
 * `PostgresIdempotencyStore.endLease`, a redrive `OutboxStore.redrive`.
 */
export class BoardQueries {
  private readonly keys: string;
  private readonly outbox?: string;

  constructor(
    private readonly dataSource: SourceDataSource,
    keyTable: string,
    outboxTable: string | undefined,
  ) {
    this.keys = quoteTableName(keyTable);
    this.outbox = outboxTable === undefined ? undefined : quoteTableName(outboxTable);
    installRedactingLogger(dataSource);
  }

  get hasOutbox(): boolean {
    return this.outbox !== undefined;
  }

  /** Keys by state per tenant (the `maxTenants` with the most keys), and the totals over every tenant in the filter. */
  async keyCounts(tenant: TenantFilter, maxTenants: number): Promise<KeyCounts> {
    const rows = await this.read<Record<string, string>>(
      `${sqlMarker('board-key-counts')}
       WITH per_tenant AS (
         SELECT tenant_id,
                count(*) FILTER (WHERE status = 'in_flight' AND NOT ${EXPIRED}) AS in_flight,
                count(*) FILTER (WHERE status = 'in_flight' AND NOT ${EXPIRED} AND lease_expires_at <= now()) AS lease_passed,
                count(*) FILTER (WHERE status = 'completed' AND NOT ${EXPIRED}) AS completed,
                count(*) FILTER (WHERE ${EXPIRED}) AS expired,
                count(*) AS all_keys
           FROM ${this.keys}
          WHERE ($1::text IS NULL OR tenant_id = $1)
          GROUP BY tenant_id
       )
       SELECT *, sum(in_flight) OVER () AS total_in_flight, sum(lease_passed) OVER () AS total_lease_passed,
              sum(completed) OVER () AS total_completed, sum(expired) OVER () AS total_expired,
              count(*) OVER () AS tenant_count
         FROM per_tenant
        ORDER BY all_keys DESC, tenant_id
        LIMIT $2`,
      [tenant, maxTenants],
    );
    const first = rows[0];
    return {
      totals: {
        inFlight: Number(first?.total_in_flight ?? 0),
        leasePassed: Number(first?.total_lease_passed ?? 0),
        completed: Number(first?.total_completed ?? 0),
        expired: Number(first?.total_expired ?? 0),
      },
      tenantCount: Number(first?.tenant_count ?? 0),
      tenants: rows.map((row) => ({
        tenant: row.tenant_id,
        inFlight: Number(row.in_flight),
        leasePassed: Number(row.lease_passed),
        completed: Number(row.completed),
        expired: Number(row.expired),
      })),
    };
  }

  /** In-flight keys, those past their lease first, then the longest held. */
  async stuckKeys(tenant: TenantFilter, limit: number): Promise<StuckKey[]> {
    const rows = await this.read<{
      tenant_id: string;
      key: string;
      owner_token: string;
      attempt: number;
      created_at: Date;
      lease_expires_at: Date;
      age_ms: number;
      lease_passed: boolean;
    }>(
      `${sqlMarker('board-stuck-keys')}
       SELECT tenant_id, key, owner_token, attempt, created_at, lease_expires_at,
              (extract(epoch FROM now() - created_at) * 1000)::float8 AS age_ms,
              lease_expires_at <= now() AS lease_passed
         FROM ${this.keys}
        WHERE ($1::text IS NULL OR tenant_id = $1) AND status = 'in_flight' AND NOT ${EXPIRED}
        ORDER BY lease_expires_at <= now() DESC, created_at
        LIMIT $2`,
      [tenant, limit],
    );
    return rows.map((row) => ({
      tenant: row.tenant_id,
      key: boardKey(row.key),
      ref: row.owner_token,
      attempt: row.attempt,
      createdAt: row.created_at.toISOString(),
      leaseExpiresAt: row.lease_expires_at.toISOString(),
      ageMs: Math.round(row.age_ms),
      leasePassed: row.lease_passed,
    }));
  }

  async lookup(tenant: string, key: string, withBody: boolean): Promise<KeyDetails | undefined> {
    const rows = await this.read<{
      tenant_id: string;
      key: string;
      status: 'in_flight' | 'completed';
      attempt: number;
      generation: string | null;
      created_at: Date;
      lease_expires_at: Date;
      completed_at: Date | null;
      expires_at: Date;
      response_status: number | null;
      expired: boolean;
      lease_passed: boolean;
      response_headers?: unknown;
      response_body?: Buffer | null;
    }>(
      `${sqlMarker('board-lookup')}
       SELECT tenant_id, key, status, attempt, generation, created_at, lease_expires_at, completed_at, expires_at,
              response_status, ${EXPIRED} AS expired, lease_expires_at <= now() AS lease_passed
              ${withBody ? `, response_headers, substring(response_body FROM 1 FOR ${SHOWN_BODY_BYTES + 1}) AS response_body` : ''}
         FROM ${this.keys}
        WHERE tenant_id = $1 AND key = $2
        -- The partitioned table may still hold rows of earlier, expired uses of the key: the latest is the key's state.
        ORDER BY created_at DESC
        LIMIT 1`,
      [tenant, key],
    );
    const row = rows[0];
    if (!row) return undefined;
    const state: BoardKeyState = row.expired
      ? 'expired'
      : row.status === 'completed'
        ? 'completed'
        : row.lease_passed
          ? 'lease-passed'
          : 'in-flight';
    const details: KeyDetails = {
      tenant: row.tenant_id,
      key: boardKey(row.key),
      state,
      attempt: row.attempt,
      generation: row.generation,
      createdAt: row.created_at.toISOString(),
      leaseExpiresAt: state === 'in-flight' || state === 'lease-passed' ? row.lease_expires_at.toISOString() : null,
      completedAt: row.completed_at?.toISOString() ?? null,
      expiresAt: row.expires_at.toISOString(),
      responseStatus: row.response_status,
    };
    if (withBody && row.response_body) details.response = shownBody(row.response_headers, row.response_body);
    return details;
  }

  async outboxCounts(tenant: TenantFilter): Promise<OutboxCounts | undefined> {
    if (!this.outbox) return undefined;
    const [row] = await this.read<{ pending: string; retrying: string; dead: string }>(
      `${sqlMarker('board-outbox-counts')}
       SELECT count(*) FILTER (WHERE status = 'pending' AND attempts = 0) AS pending,
              count(*) FILTER (WHERE status = 'pending' AND attempts > 0) AS retrying,
              count(*) FILTER (WHERE status = 'dead') AS dead
         FROM ${this.outbox}
        WHERE ($1::text IS NULL OR tenant_id = $1) AND status <> 'delivered'`,
      [tenant],
    );
    return { pending: Number(row.pending), retrying: Number(row.retrying), dead: Number(row.dead) };
  }

  async deadLetters(tenant: TenantFilter, limit: number): Promise<DeadLetter[]> {
    if (!this.outbox) return [];
    const rows = await this.read<{
      id: string;
      tenant_id: string | null;
      topic: string;
      attempts: number;
      last_error: string | null;
      created_at: Date;
    }>(
      `${sqlMarker('board-dead-letters')}
       SELECT id, tenant_id, topic, attempts, last_error, created_at
         FROM ${this.outbox}
        WHERE ($1::text IS NULL OR tenant_id = $1) AND status = 'dead'
        ORDER BY id DESC
        LIMIT $2`,
      [tenant, limit],
    );
    return rows.map((row) => ({
      id: String(row.id),
      tenant: row.tenant_id,
      topic: row.topic,
      attempts: row.attempts,
      lastError: row.last_error,
      createdAt: row.created_at.toISOString(),
    }));
  }

  /** A read with a time limit: an operator's page must not hold a connection for a minute on a huge table. */
  private async read<Row>(sql: string, params: unknown[]): Promise<Row[]> {
    try {
      return await this.dataSource.transaction(async (manager) => {
        await manager.query(`SET LOCAL statement_timeout = ${BOARD_STATEMENT_TIMEOUT_MS}`);
        return (await manager.query(sql, params)) as Row[];
      });
    } catch (error) {
      throw redactQueryError(error, params);
    }
  }
}

function shownBody(headers: unknown, body: Buffer): NonNullable<KeyDetails['response']> {
  const truncated = body.length > SHOWN_BODY_BYTES;
  const shown = truncated ? body.subarray(0, SHOWN_BODY_BYTES) : body;
  const text = shown.toString('utf8');
  const isText = Buffer.from(text, 'utf8').equals(shown);
  return { headers, body: isText ? text : shown.toString('base64'), bodyEncoding: isText ? 'utf8' : 'base64', truncated };
}
