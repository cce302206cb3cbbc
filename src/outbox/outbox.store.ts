import type { DataSource, EntityManager } from 'typeorm';
import { installRedactingLogger, redactQueryError, sqlMarker } from '../store/redacting-logger.js';
import { quoteTableName } from '../store/identifiers.js';

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
  messages: OutboxMessage[];
}

interface MessageRow {
  id: string;
  tenant_id: string | null;
  topic: string;
  payload: string;
  attempts: number;
  created_at: Date;
}

/**
 * The outbox table in SQL. Rows are claimed with `FOR UPDATE SKIP LOCKED`
 * plus a short lock lease recorded on the row, so several relays never claim
 * the same message, no transaction stays open while a message is delivered,
 * and a relay that dies mid-delivery only delays its messages by the lease.
 */
export class OutboxStore {
  private readonly table: string;

  constructor(
    private readonly dataSource: DataSource,
    tableName: string,
  ) {
    this.table = quoteTableName(tableName);
    installRedactingLogger(dataSource);
  }

  async enqueue(
    manager: EntityManager,
    message: { tenant?: string | null; topic: string; payload: unknown; delayMs?: number },
  ): Promise<string> {
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

  async claim(batchSize: number, lockMs: number, lockToken: string): Promise<ClaimedBatch> {
    const { records } = await this.run(
      `${sqlMarker('outbox-claim')}
       UPDATE ${this.table} AS m
          SET attempts = m.attempts + 1, locked_until = now() + interval '1 millisecond' * $3::float8, lock_token = $2
        WHERE m.id IN (
          SELECT id FROM ${this.table}
           WHERE status = 'pending' AND available_at <= now() AND (locked_until IS NULL OR locked_until <= now())
           ORDER BY available_at, id
           LIMIT $1
           FOR UPDATE SKIP LOCKED)
        RETURNING m.id, m.tenant_id, m.topic, m.payload, m.attempts, m.created_at`,
      [batchSize, lockToken, lockMs],
    );
    return {
      lockToken,
      messages: (records as MessageRow[])
        .sort((a, b) => Number(a.id) - Number(b.id))
        .map((r) => ({
          id: String(r.id),
          tenant: r.tenant_id,
          topic: r.topic,
          payload: JSON.parse(r.payload) as unknown,
          attempt: r.attempts,
          createdAt: r.created_at,
        })),
    };
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

  /** Puts dead-lettered messages back in the queue (after fixing what made them fail). */
  async redrive(ids?: string[]): Promise<number> {
    return this.count(
      `${sqlMarker('outbox-redrive')}
       UPDATE ${this.table} SET status = 'pending', attempts = 0, available_at = now(), last_error = NULL
        WHERE status = 'dead' AND ($1::bigint[] IS NULL OR id = ANY($1::bigint[]))`,
      [ids ?? null],
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
    return (await this.count(sql, params)) === 1;
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
