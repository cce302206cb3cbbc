import type { SourceManager } from '../connection.js';
import type { ClaimRef, PhaseState } from '../../core/idempotency-store.js';
import type { AttemptParts } from './attempt-parts.js';
import { isFenceLost } from './statements.js';

/**
 * The store's writes to a key that no new key sends (the statements of key-upkeep.sql.ts): the heartbeat's lease
 * renewal, a phase recorded, a claim given back, an operator's end of a lease.
 */
type KeyUpkeepParts = Pick<AttemptParts, 'pools' | 'statements' | 'keyLockHolders'>;

/** Renews the lease, fenced; an attempt whose transaction holds the key's lock keeps the key without a write. */
export async function renewLease(parts: KeyUpkeepParts, ref: ClaimRef, leaseMs: number): Promise<boolean> {
  if (parts.keyLockHolders.has(ref.ownerToken)) return true;
  const statement = { text: parts.statements.sql.renewLease, values: [ref.tenant, ref.key, ref.ownerToken, leaseMs] };
  return rowsChanged(await parts.pools.run(statement, { write: true })) === 1;
}

/** Records the attempt's phases, fenced: in `tx` when given, else committed on its own. */
export async function recordPhase(
  parts: KeyUpkeepParts,
  ref: ClaimRef,
  phases: PhaseState,
  leaseMs: number,
  tx?: SourceManager,
): Promise<boolean> {
  const statement = {
    text: parts.statements.sql.recordPhase,
    values: [ref.tenant, ref.key, ref.ownerToken, phases.recoveryPoint, JSON.stringify(phases.results), leaseMs],
  };
  try {
    return rowsChanged(await parts.pools.run(statement, tx ? { tx } : { write: true })) === 1;
  } catch (error) {
    if (isFenceLost(error)) return false;
    throw error;
  }
}

/**
 * Gives the claim back when the work never ran (or was rejected before it
 * started): a fresh claim is deleted, a takeover's lease ends with its
 * history kept (see the `release` statement).
 */
export async function release(parts: KeyUpkeepParts, ref: ClaimRef, forget: boolean): Promise<boolean> {
  const { pools, statements } = parts;
  const values = [ref.tenant, ref.key, ref.ownerToken];
  if (forget) return rowsChanged(await pools.run({ text: statements.sql.forget, values }, { write: true })) === 1;
  const { rows } = await pools.run({ text: statements.sql.release, values }, { write: true });
  return Number((rows as Array<{ released: string | number }>)[0]?.released ?? 0) > 0;
}

/**
 * Ends the lease of the attempt holding `ownerToken` and fences it with a
 * new token (an operator's release, from the board): the next retry takes
 * the key over at once.
 * @returns the attempt's key, or undefined when it no longer holds one
 */
export async function endLease(parts: KeyUpkeepParts, tenant: string, ownerToken: string): Promise<string | undefined> {
  const { pools, statements } = parts;
  const { rows } = await pools.run({ text: statements.sql.endLease, values: [tenant, ownerToken] }, { write: true });
  // `?? undefined`: on Citus the delegated function answers one row, with a null key when nothing was released.
  return (rows as Array<{ key: string | null }>)[0]?.key ?? undefined;
}

/**
 * The rows a statement changed: its row count, or, for a delegated function of the Citus layout (one row, the
 * function's answer in `n`), that answer.
 */
function rowsChanged(result: { rows: unknown[]; affected: number }): number {
  const n = (result.rows[0] as { n?: unknown } | undefined)?.n;
  return typeof n === 'number' ? n : result.affected;
}
