import type { ClaimRef, IdempotencyStore, PhaseState } from './idempotency-store.js';
import { deriveKey, type DeriveKeyOptions } from './derived-keys.js';
import { LeaseLostError, StoreUnavailableError, WorkFailure } from './errors.js';

/** How a transaction ended: committed, rolled back, or unknown (the connection was lost during its COMMIT). */
export type TransactionOutcome = 'committed' | 'rolled-back' | 'unknown';

/**
 * Atomic phases with recovery points (after Brandur Leach's design for
 * Stripe-like idempotency keys). A handler is written as named phases; each
 * phase's local writes commit in their own transaction together with the
 * key's recovery point and the phase's result, fenced by the owner token.
 * Calls to other systems sit between phases (or inside one, whose result is
 * then recorded). An attempt that takes the key over resumes after the last
 * recorded phase: phases already done return their recorded result instead
 * of running again.
 *
 * Handlers must be deterministic given the phase results: a resumed attempt
 * re-runs the code between phases, so anything it decides there must come
 * from a recorded result, the request, or a derived key.
 */
export class Phases<Tx = unknown> {
  private results: Record<string, unknown>;
  private recovery: string | null;
  private readonly ran = new Set<string>();
  private committed = false;
  /** Whether this attempt started from phases a previous attempt recorded. */
  readonly resumed: boolean;

  constructor(
    private readonly store: IdempotencyStore<Tx>,
    private readonly ref: ClaimRef,
    private readonly generation: string,
    initial: PhaseState,
    private readonly leaseMs: number,
    private readonly enter: <T>(tx: Tx, fn: () => Promise<T>, ended: Promise<TransactionOutcome>) => Promise<T> = (_tx, fn) =>
      fn(),
  ) {
    this.results = { ...initial.results };
    this.recovery = initial.recoveryPoint;
    this.resumed = initial.recoveryPoint !== null;
  }

  /** The last phase recorded for this key (by this attempt or an earlier one), or null. */
  get recoveryPoint(): string | null {
    return this.recovery;
  }

  /** Whether any phase is recorded for this key: then the key must not be released on failure. */
  get hasProgress(): boolean {
    return this.committed || this.recovery !== null;
  }

  /**
   * Runs phase `name` once per key: in a transaction of its own that also
   * records `name` as the recovery point and its result. If an earlier attempt
   * recorded it, returns that result without running `fn`. Results are stored
   * as JSON; both paths return the value as parsed back from it.
   *
   * @throws LeaseLostError another attempt took the key over; this phase's writes were rolled back.
   * @throws StoreUnavailableError the store failed around the phase (BEGIN, recovery point, COMMIT).
   */
  async run<T>(name: string, fn: (tx: Tx) => T | Promise<T>): Promise<T> {
    if (this.ran.has(name)) throw new Error(`Phase "${name}" ran twice in one attempt: phase names must be unique.`);
    this.ran.add(name);
    if (Object.prototype.hasOwnProperty.call(this.results, name)) return this.results[name] as T;
    let outcome: { next: PhaseState; recorded: T };
    let ended: (how: TransactionOutcome) => void = () => undefined;
    const ending = new Promise<TransactionOutcome>((resolve) => (ended = resolve));
    try {
      outcome = await this.store.transaction(async (tx) => {
        let value: T;
        try {
          value = await this.enter(tx, async () => fn(tx), ending);
        } catch (error) {
          throw new WorkFailure(error);
        }
        const result = JSON.parse(JSON.stringify(value ?? null)) as T;
        const state: PhaseState = { recoveryPoint: name, results: { ...this.results, [name]: result } };
        if (!(await this.store.recordPhase(this.ref, state, this.leaseMs, tx))) throw new LeaseLostError();
        return { next: state, recorded: result };
      });
    } catch (error) {
      ended(!(error instanceof WorkFailure) && this.store.isUnavailableError(error) ? 'unknown' : 'rolled-back');
      // The phase's own error is the handler's; a failure of BEGIN, the recovery point or COMMIT is the store's.
      if (error instanceof WorkFailure) throw error.error;
      if (this.store.isUnavailableError(error)) {
        throw new StoreUnavailableError(error, 'unknown', Math.max(1, Math.ceil(this.leaseMs / 1000)));
      }
      throw error;
    }
    ended('committed');
    const { next, recorded } = outcome;
    // Only once committed: if the commit fails, the next attempt runs this phase again.
    this.results = next.results;
    this.recovery = name;
    this.committed = true;
    return recorded;
  }

  /** A key for a downstream call, stable across every attempt of this request (see `deriveKey`). */
  key(purpose: string, options?: DeriveKeyOptions): string {
    return deriveKey({ tenant: this.ref.tenant, key: this.ref.key, generation: this.generation }, purpose, options);
  }
}
