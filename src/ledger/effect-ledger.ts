import { Inject, Injectable } from '@nestjs/common';
import type { EntityManager } from 'typeorm';
import type { SourceDataSource } from '../store/connection.js';
import { ledgerMessages } from './messages.js';
import { DEFAULT_LEDGER_TABLE_NAME, IDEMPOTENCY_DATA_SOURCE, IDEMPOTENCY_OPTIONS } from '../idempotency.constants.js';
import type { ResolvedIdempotencyOptions } from '../idempotency.options.js';
import type { RequiredTable } from '../store/required-table.js';
import { idempotencyContext } from '../transaction/idempotency-context.js';
import { findEffectSql, LEDGER_TABLE_COLUMNS, recordEffectSql } from './effect-ledger.sql.js';

export interface EffectKeyOptions {
  /**
   * What kind of effect the key names (`'refund'`, `'payout'`): keys of
   * different scopes never collide. Default `'default'`.
   */
  scope?: string;
  /** The tenant the effect belongs to. Default: the tenant of the current idempotent execution. */
  tenant?: string;
}

const DEFAULT_SCOPE = 'default';

/** The ledger was called in a way that cannot record an effect safely (no transaction, no tenant, no key). */
export class EffectLedgerUsageError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'EffectLedgerUsageError';
  }
}

/**
 * Effects that must happen at most once for ever, whatever the key table says.
 *
 * An idempotency key expires (`ttl`), and a message replayed from a
 * dead-letter queue a week later, or a client that retries past the TTL,
 * runs its handler again. The ledger is a row per (tenant, scope, business
 * key) under a primary key, with no TTL, written in the handler's own
 * transaction: the effect and its ledger row commit together or not at all,
 * and a second transaction with the same business key finds the row and
 * skips the effect.
 *
 * ```ts
 * if (!(await ledger.once(manager, `order:${id}:capture`, { scope: 'payments' }))) return { alreadyCaptured: true };
 * await manager.insert(Capture, { orderId: id, amount });
 * ```
 */
@Injectable()
export class EffectLedger {
  private readonly tableName: string;

  constructor(
    @Inject(IDEMPOTENCY_DATA_SOURCE) private readonly dataSource: SourceDataSource,
    @Inject(IDEMPOTENCY_OPTIONS) options: ResolvedIdempotencyOptions,
  ) {
    this.tableName = options.ledger?.tableName ?? DEFAULT_LEDGER_TABLE_NAME;
  }

  /**
   * Records `key` in `manager`'s transaction. Resolves `true` when this
   * transaction records it: go on with the effect, in the same transaction.
   * Resolves `false` when a committed transaction recorded it before: the
   * effect happened, skip it. A concurrent transaction recording the same key
   * makes this one wait for its outcome (the primary key's row lock), so two
   * never both get `true`.
   *
   * Without `manager`, the current idempotent execution's transaction is used
   * (the one `TransactionHost.manager` gives); outside one this throws, since
   * a ledger row that commits apart from its effect proves nothing.
   */
  once(manager: EntityManager, key: string, options?: EffectKeyOptions): Promise<boolean>;
  once(key: string, options?: EffectKeyOptions): Promise<boolean>;
  async once(
    managerOrKey: EntityManager | string,
    keyOrOptions?: string | EffectKeyOptions,
    maybeOptions?: EffectKeyOptions,
  ): Promise<boolean> {
    const { manager, key, options } = this.arguments(managerOrKey, keyOrOptions, maybeOptions);
    if (!manager.queryRunner?.isTransactionActive) throw new EffectLedgerUsageError(ledgerMessages.noTransaction);
    const { tenant, scope } = this.scopeOf(key, options);
    const generation = idempotencyContext.getStore()?.scope?.generation ?? null;
    const rows = (await manager.query(recordEffectSql(this.tableName), [tenant, scope, key, generation])) as unknown[];
    return rows.length === 1;
  }

  /** Whether `key` is recorded (committed, or written earlier in `manager`'s own transaction). */
  async has(key: string, options?: EffectKeyOptions & { manager?: EntityManager }): Promise<boolean> {
    const manager = options?.manager ?? idempotencyContext.getStore()?.manager ?? this.dataSource.manager;
    const { tenant, scope } = this.scopeOf(key, options);
    const rows = (await manager.query(findEffectSql(this.tableName), [tenant, scope, key])) as unknown[];
    return rows.length === 1;
  }

  private arguments(
    managerOrKey: EntityManager | string,
    keyOrOptions: string | EffectKeyOptions | undefined,
    maybeOptions: EffectKeyOptions | undefined,
  ): { manager: EntityManager; key: string; options?: EffectKeyOptions } {
    if (typeof managerOrKey === 'string') {
      const context = idempotencyContext.getStore();
      if (!context?.transactional) throw new EffectLedgerUsageError(ledgerMessages.noTransaction);
      return { manager: context.manager, key: managerOrKey, options: keyOrOptions as EffectKeyOptions | undefined };
    }
    return { manager: managerOrKey, key: keyOrOptions as string, options: maybeOptions };
  }

  private scopeOf(key: unknown, options: EffectKeyOptions | undefined): { tenant: string; scope: string } {
    if (typeof key !== 'string' || key === '') throw new EffectLedgerUsageError(ledgerMessages.key(key));
    const scope = options?.scope ?? DEFAULT_SCOPE;
    if (typeof scope !== 'string' || scope === '') throw new EffectLedgerUsageError(ledgerMessages.scope(scope));
    // Never a shared fallback: an effect without a tenant would be refused for every other tenant.
    const tenant = options?.tenant ?? idempotencyContext.getStore()?.scope?.tenant;
    if (typeof tenant !== 'string' || tenant === '') throw new EffectLedgerUsageError(ledgerMessages.tenant);
    return { tenant, scope };
  }
}

/** The ledger table under `tableName`, for the start-up schema check. */
export function ledgerTable(tableName: string): RequiredTable {
  return {
    what: 'ledger',
    name: tableName,
    columns: LEDGER_TABLE_COLUMNS,
    migration:
      tableName === DEFAULT_LEDGER_TABLE_NAME ? 'CreateEffectLedger1764806400000' : `createEffectLedgerMigration('${tableName}')`,
  };
}
