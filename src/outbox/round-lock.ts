import { performance } from 'node:perf_hooks';
import type { OutboxStore } from './outbox.store.js';

/** Whether a message may be delivered now: `held`, taken by another relay (`lost`), or not provably held (`unrenewed`). */
export type LockState = 'held' | 'lost' | 'unrenewed';

/**
 * The lock on one round's messages. The claim locks a whole batch for
 * `lockMs`, but the round delivers it a few at a time, each delivery taking up
 * to `deliveryTimeoutMs`: a batch can outlast its lock, and another relay
 * would then claim and deliver its last messages while this one still does.
 * So before each delivery the lock must be known to hold for a whole
 * delivery more, or it is renewed first, for every message of the round not
 * settled yet, in one statement (most rounds end before one is due).
 *
 * Time is measured on the monotonic clock from just before the statement
 * that set the lock was sent: the database's `now()` in it is later, so the
 * lock ends no sooner than `lockMs` after that instant.
 */
export class RoundLock {
  /** The messages of the round this relay still holds and has not settled. */
  private held: Set<string>;
  private lockedAt: number;
  private renewal?: Promise<void>;
  /** Renewed once this much of the lock has passed: half the margin a delivery leaves. */
  private readonly renewAfterMs: number;
  /** The longest a delivery may wait after the lock was set and still end (time out) before it. */
  private readonly deliverableForMs: number;

  constructor(
    private readonly store: OutboxStore,
    private readonly lockToken: string,
    private readonly lockMs: number,
    deliveryTimeoutMs: number,
    ids: readonly string[],
    lockedAt: number,
  ) {
    this.held = new Set(ids);
    this.lockedAt = lockedAt;
    this.deliverableForMs = lockMs - deliveryTimeoutMs;
    this.renewAfterMs = this.deliverableForMs / 2;
  }

  /** The monotonic clock the lock is measured on; read it just before sending the claim. */
  static now(): number {
    return performance.now();
  }

  /**
   * Whether `id` may be delivered now: its lock holds for at least a whole
   * delivery, renewing it first when due. Throws when the renewal fails
   * (a database error): the message then waits for its lock to expire.
   */
  async hold(id: string): Promise<LockState> {
    if (RoundLock.now() - this.lockedAt > this.renewAfterMs) {
      // One renewal at a time: workers that need it meanwhile wait for the same one.
      this.renewal ??= this.renew().finally(() => (this.renewal = undefined));
      await this.renewal;
    }
    if (!this.held.has(id)) return 'lost';
    return RoundLock.now() - this.lockedAt <= this.deliverableForMs ? 'held' : 'unrenewed';
  }

  /** The message is settled (or given up): later renewals leave it alone. */
  release(id: string): void {
    this.held.delete(id);
  }

  private async renew(): Promise<void> {
    if (this.held.size === 0) return;
    const sentAt = RoundLock.now();
    const renewed = await this.store.renewLocks([...this.held], this.lockToken, this.lockMs);
    // A message missing here was claimed by another relay after this lock lapsed (a stalled process): it is theirs now.
    // One released while the renewal ran stays released.
    const still = new Set(renewed);
    this.held = new Set([...this.held].filter((id) => still.has(id)));
    this.lockedAt = sentAt;
  }
}
