import { expect } from '@jest/globals';
import type pg from 'pg';
import { keyLock } from '../../src/store/key-function-parts.sql.js';
import { keyStoreStatements } from '../../src/store/key-store.sql.js';
import { sleep } from './http.js';

/**
 * Who holds a key's advisory lock, read from another connection (`db`, at READ COMMITTED): what the
 * request-transaction mode's session hold must never leave behind on a pooled connection.
 */
export function keyLockProbe(db: pg.Client, table: string, tenant = 'tenant-a') {
  /** Backends holding `key`'s lock, at any level. */
  const holders = async (key: string) => {
    const { rows } = await db.query<{ n: number }>(
      `WITH k AS (SELECT ${keyLock(table, '$1::text', '$2::text')} AS v)
       SELECT count(*)::int AS n FROM pg_locks, k
        WHERE locktype = 'advisory' AND objsubid = 1 AND granted
          AND classid::bigint = (k.v >> 32) & 4294967295 AND objid::bigint = k.v & 4294967295`,
      [tenant, key],
    );
    return rows[0].n;
  };
  /** What a claim of `key` from another connection would do: take its lock, at once, or not. */
  const lockableAtOnce = async (key: string) => {
    await db.query('BEGIN');
    try {
      const { rows } = await db.query<{ locked: boolean }>(keyStoreStatements(`"${table}"`, table).holdKeyLock, [tenant, key]);
      return rows[0].locked;
    } finally {
      await db.query('ROLLBACK');
    }
  };
  /**
   * No backend holds `key`'s lock, and another connection takes it at once. A duplicate that replays answers
   * before its transaction's ROLLBACK (which ends its own transaction-level hold) has come back: that hold may
   * trail the answer by a moment, never longer. A hold left on a pooled connection stays, and fails this.
   */
  const expectKeyFree = async (key: string) => {
    for (let i = 0; i < 200 && (await holders(key)) > 0; i++) await sleep(10);
    expect(await holders(key)).toBe(0);
    expect(await lockableAtOnce(key)).toBe(true);
  };
  return { holders, lockableAtOnce, expectKeyFree };
}
