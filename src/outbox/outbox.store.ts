import type { EntityManager } from 'typeorm';
import type { SourceDataSource } from '../store/connection.js';
import { installRedactingLogger } from '../store/redacting-logger.js';
import { sqlMarker } from '../store/sql-marker.js';
import { redactQueryError } from '../store/redacted-query-error.js';
import { quoteTableName } from '../store/identifiers.js';
import { outboxMessages } from './messages.js';

/** A message as the relay hands it to a handler. */
export interface OutboxMessage<P = unknown> {
  id: string;
  tenant: string | null;
  topic: string;
  payload: P;
  /** 1 on the first delivery attempt. */
  attempt: number;
  createdAt: Date;
}

export interface ClaimedBatch {
  lockToken: string;
  /** To deliver: each counted as an attempt by the claim. */
  messages: OutboxMessage[];
  /**
   * Locked only to be dead-lettered, not delivered: their `maxAttempts`
   * attempts are spent and the last one never settled (its relay died, or
   * its lock expired mid-delivery). The claim does not count them again.
   */
  exhausted: OutboxMessage[];
}

interface MessageRow {
  id: string;
  tenant_id: string | null;
  topic: string;
  payload: string;
  attempts: number;
  created_at: Date;
  exhausted: boolean;
}

/**
 * The outbox table in SQL. Rows are claimed with `FOR UPDATE SKIP LOCKED`
 * plus a short lock lease recorded on the row, so several relays never claim
 * the same message, no transaction stays open while a message is delivered,
 * and a relay that dies mid-delivery only delays its messages by the lease.
 */
export class OutboxStore {
  private readonly table: string;
  private readonly citus: boolean;
  /**
   * On Citus, the tenant of each message this relay claimed and has not settled yet, so that a settle names the
   * tenant and runs on its shard: by id alone it would be an UPDATE of every shard, with a two-phase commit.
   */
  private readonly claimedTenants = new Map<string, string>();

  constructor(
    private readonly dataSource: SourceDataSource,
    tableName: string,
    options: { citus?: boolean } = {},
  ) {
    this.table = quoteTableName(tableName);
    this.citus = Boolean(options.citus);
    installRedactingLogger(dataSource);
  }

  async enqueue(
    manager: EntityManager,
    message: { tenant?: string | null; topic: string; payload: unknown; delayMs?: number },
  ): Promise<string> {
    if (this.citus && (typeof message.tenant !== 'string' || message.tenant === '')) {
      throw new Error(outboxMessages.tenantRequiredOnCitus);
    }
    const params = [message.tenant ?? null, message.topic, JSON.stringify(message.payload ?? null), message.delayMs ?? 0];
    try {
      const [row] = (await manager.query(
        `${sqlMarker('outbox-enqueue')}
         INSERT INTO ${this.table} (tenant_id, topic, payload, available_at)
         VALUES ($1, $2, $3, now() + interval '1 millisecond' * $4::float8) RETURNING id`,
        params,
      )) as Array<{ id: string }>;
      return row.id;
    } catch (error) {
      throw redactQueryError(error, params);
    }
  }

  /**
   * Locks up to `batchSize` due messages for `lockMs` under `lockToken`. An
   * attempt is counted here, when a message is locked for delivery, so an
   * attempt that ends in a crash or an expired lock counts like a failure.
   * With `maxAttempts`, a message that already had that many is locked
   * without being counted again and returned in `exhausted`: the relay
   * dead-letters it instead of delivering it once more.
   */
  async claim(batchSize: number, lockMs: number, lockToken: string, maxAttempts?: number): Promise<ClaimedBatch> {
    const records = this.citus
      ? await this.claimPerTenant(batchSize, lockMs, lockToken, maxAttempts)
      : (await this.run(this.claimStatement(false), [batchSize, lockToken, lockMs, maxAttempts ?? null])).records;
    const rows = (records as MessageRow[]).sort((a, b) => Number(a.id) - Number(b.id));
    const message = (r: MessageRow): OutboxMessage => ({
      id: String(r.id),
      tenant: r.tenant_id,
      topic: r.topic,
      payload: JSON.parse(r.payload) as unknown,
      attempt: r.attempts,
      createdAt: r.created_at,
    });
    return {
      lockToken,
      messages: rows.filter((r) => !r.exhausted).map(message),
      exhausted: rows.filter((r) => r.exhausted).map(message),
    };
  }

  /**
   * The claim's statement: the due messages locked and counted in one statement. `oneTenant` confines it to the
   * tenant given as $5, in both conditions, so that on Citus it is a query of that tenant's shard.
   */
  private claimStatement(oneTenant: boolean): string {
    const tenant = (alias: string) => (oneTenant ? `${alias}tenant_id = $5 AND ` : '');
    return `${sqlMarker('outbox-claim')}
       WITH due AS (
         SELECT id, $4::integer IS NOT NULL AND attempts >= $4::integer AS exhausted FROM ${this.table}
          WHERE ${tenant('')}status = 'pending' AND available_at <= now() AND (locked_until IS NULL OR locked_until <= now())
          ORDER BY available_at, id
          LIMIT $1
          FOR UPDATE SKIP LOCKED)
       UPDATE ${this.table} AS m
          SET attempts = CASE WHEN due.exhausted THEN m.attempts ELSE m.attempts + 1 END,
              locked_until = now() + interval '1 millisecond' * $3::float8, lock_token = $2
         FROM due
        WHERE ${tenant('m.')}m.id = due.id
        RETURNING m.id, m.tenant_id, m.topic, m.payload, m.attempts, m.created_at, due.exhausted`;
  }

  /**
   * The claim on Citus, where `FOR UPDATE SKIP LOCKED` runs only in a query of one shard ("could not run distributed
   * query with FOR UPDATE/SHARE commands"): the tenants with due messages are read first, without locks (a query of
   * every shard), then each tenant's messages are claimed as above with the tenant in both conditions, a query of
   * its shard, until the batch is full. A tenant another relay has just claimed is skipped like its locked rows.
   */
  private async claimPerTenant(batchSize: number, lockMs: number, lockToken: string, maxAttempts?: number): Promise<unknown[]> {
    const { records: due } = await this.run(
      `${sqlMarker('outbox-due-tenants')}
       SELECT DISTINCT tenant_id FROM ${this.table}
        WHERE status = 'pending' AND available_at <= now() AND (locked_until IS NULL OR locked_until <= now())
        LIMIT $1`,
      [batchSize],
    );
    const claimed: MessageRow[] = [];
    for (const { tenant_id: tenant } of due as Array<{ tenant_id: string }>) {
      if (claimed.length >= batchSize) break;
      const { records } = await this.run(this.claimStatement(true), [
        batchSize - claimed.length,
        lockToken,
        lockMs,
        maxAttempts ?? null,
        tenant,
      ]);
      for (const row of records as MessageRow[]) {
        claimed.push(row);
        this.claimedTenants.set(String(row.id), tenant);
      }
    }
    return claimed;
  }

  /**
   * Extends the lock of claimed messages to `lockMs` from now, for those this
   * relay still holds (same token) and has not settled (a settled message has
   * no lock); returns their ids. A message whose lock lapsed is renewed if no
   * other relay claimed it since: no one else can be delivering it.
   */
  async renewLocks(ids: readonly string[], lockToken: string, lockMs: number): Promise<string[]> {
    if (this.citus) return this.renewLocksPerTenant(ids, lockToken, lockMs);
    const { records } = await this.run(
      `${sqlMarker('outbox-renew')}
       UPDATE ${this.table} SET locked_until = now() + interval '1 millisecond' * $3::float8
        WHERE id = ANY($1::bigint[]) AND lock_token = $2 AND status = 'pending' AND locked_until IS NOT NULL
        RETURNING id`,
      [ids, lockToken, lockMs],
    );
    return (records as Array<{ id: string }>).map((r) => String(r.id));
  }

  /**
   * The renewal on Citus: the ids grouped by the tenant each was claimed with, one statement per tenant, so each runs
   * on its tenant's shard (by ids alone it would update every shard, with a two-phase commit). An id this store did
   * not claim goes with the rest the single-server way.
   */
  private async renewLocksPerTenant(ids: readonly string[], lockToken: string, lockMs: number): Promise<string[]> {
    const byTenant = new Map<string | undefined, string[]>();
    for (const id of ids) {
      const tenant = this.claimedTenants.get(id);
      byTenant.set(tenant, [...(byTenant.get(tenant) ?? []), id]);
    }
    const renewed: string[] = [];
    for (const [tenant, group] of byTenant) {
      // A literal condition on the tenant, not `$4 IS NULL OR ...`, which Citus cannot route to one shard.
      const { records } = await this.run(
        `${sqlMarker('outbox-renew')}
         UPDATE ${this.table} SET locked_until = now() + interval '1 millisecond' * $3::float8
          WHERE id = ANY($1::bigint[]) AND lock_token = $2 AND status = 'pending' AND locked_until IS NOT NULL
          ${tenant === undefined ? '' : 'AND tenant_id = $4'}
          RETURNING id`,
        tenant === undefined ? [group, lockToken, lockMs] : [group, lockToken, lockMs, tenant],
      );
      renewed.push(...(records as Array<{ id: string }>).map((r) => String(r.id)));
    }
    return renewed;
  }

  /** Marks a claimed message delivered; false if this relay's lock was lost meanwhile. */
  async markDelivered(id: string, lockToken: string): Promise<boolean> {
    return this.settle(
      `${sqlMarker('outbox-delivered')}
       UPDATE ${this.table} SET status = 'delivered', delivered_at = now(), locked_until = NULL, last_error = NULL
        WHERE id = $1 AND lock_token = $2 AND status = 'pending'`,
      [id, lockToken],
    );
  }

  /** Schedules another attempt after `retryInMs`, or dead-letters the message. */
  async markFailed(id: string, lockToken: string, error: string, retryInMs: number | null): Promise<boolean> {
    return retryInMs === null
      ? this.settle(
          `${sqlMarker('outbox-dead')}
           UPDATE ${this.table} SET status = 'dead', locked_until = NULL, last_error = $3
            WHERE id = $1 AND lock_token = $2 AND status = 'pending'`,
          [id, lockToken, error],
        )
      : this.settle(
          `${sqlMarker('outbox-retry')}
           UPDATE ${this.table}
              SET available_at = now() + interval '1 millisecond' * $4::float8, locked_until = NULL, last_error = $3
            WHERE id = $1 AND lock_token = $2 AND status = 'pending'`,
          [id, lockToken, error, retryInMs],
        );
  }

  /**
   * Dead-letters a message locked as exhausted, keeping the last failure
   * recorded before it (the crash that ended its last attempt left none).
   */
  async markExhausted(id: string, lockToken: string, reason: string): Promise<boolean> {
    return this.settle(
      `${sqlMarker('outbox-exhausted')}
       UPDATE ${this.table}
          SET status = 'dead', locked_until = NULL,
              last_error = CASE WHEN last_error IS NULL THEN $3 ELSE $3 || ' Last recorded failure: ' || last_error END
        WHERE id = $1 AND lock_token = $2 AND status = 'pending'`,
      [id, lockToken, reason],
    );
  }

  /**
   * Puts dead-lettered messages back in the queue (after fixing what made
   * them fail): those of `ids`, or every one; with `tenant`, only that
   * tenant's.
   */
  async redrive(ids?: readonly string[], tenant?: string): Promise<number> {
    return this.count(
      `${sqlMarker('outbox-redrive')}
       UPDATE ${this.table} SET status = 'pending', attempts = 0, available_at = now(), last_error = NULL
        WHERE status = 'dead' AND ($1::bigint[] IS NULL OR id = ANY($1::bigint[]))
          AND ($2::text IS NULL OR tenant_id = $2)`,
      [ids ?? null, tenant ?? null],
    );
  }

  /** Counts dead-lettered messages, at most `limit` (for health checks). */
  async countDead(limit: number): Promise<number> {
    const { records } = await this.run(
      `${sqlMarker('outbox-count-dead')}
       SELECT count(*)::integer AS dead FROM (SELECT 1 FROM ${this.table} WHERE status = 'dead' LIMIT $1) AS dead`,
      [limit],
    );
    return (records as Array<{ dead: number }>)[0]?.dead ?? 0;
  }

  private async settle(sql: string, params: unknown[]): Promise<boolean> {
    const id = String(params[0]);
    const tenant = this.citus ? this.claimedTenants.get(id) : undefined;
    if (tenant === undefined) return (await this.count(sql, params)) === 1;
    // The settle statements all end with their WHERE clause: the tenant narrows it to the message's shard.
    const settled = (await this.count(`${sql} AND tenant_id = $${params.length + 1}`, [...params, tenant])) === 1;
    this.claimedTenants.delete(id);
    return settled;
  }

  private async count(sql: string, params: unknown[]): Promise<number> {
    return (await this.run(sql, params)).affected ?? 0;
  }

  private async run(sql: string, params: unknown[]): Promise<{ records: unknown[]; affected?: number }> {
    const runner = this.dataSource.createQueryRunner();
    try {
      return (await runner.query(sql, params, true)) as { records: unknown[]; affected?: number };
    } catch (error) {
      throw redactQueryError(error, params);
    } finally {
      await runner.release();
    }
  }
}
