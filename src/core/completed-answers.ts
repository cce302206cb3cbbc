import type { StoredResponse } from './idempotency-store.js';

/** How many completed answers a process keeps, and for how long (see `CompletedAnswers`). */
export interface CompletedAnswersLimits {
  maxEntries: number;
  maxBytes: number;
  windowMs: number;
}

interface Entry {
  fingerprint: string;
  response: StoredResponse;
  bytes: number;
  /** By this process's monotonic clock. */
  until: number;
}

/**
 * A bounded store of the answers this process completed or last replayed
 * from the database, so a retry that reaches the same instance soon after (a
 * client's, a load balancer's) is answered without a round trip. A completed
 * answer never changes until its record expires (the contract, A4.10), so
 * this is safe while an entry lives no longer than the record: an entry is
 * kept at most `windowMs`, and never past the record's life (the TTL from
 * its completion, or what the database said was left of it at a replay)
 * minus a margin for the round trip and for clocks. Looked up by tenant and key,
 * and answered only for the same fingerprint, exactly as the database path
 * (another fingerprint is a 422 there too). Least recently stored first out
 * when the entries or their bytes exceed the limits.
 */
export class CompletedAnswers {
  private readonly entries = new Map<string, Entry>();
  private bytes = 0;

  constructor(private readonly limits: CompletedAnswersLimits) {}

  /** The answer for `(tenant, key)` if this process completed it and it may still be replayed from here. */
  get(tenant: string, key: string): { fingerprint: string; response: StoredResponse } | undefined {
    const id = entryId(tenant, key);
    const entry = this.entries.get(id);
    if (!entry) return undefined;
    if (performance.now() >= entry.until) {
      this.drop(id, entry);
      return undefined;
    }
    return entry;
  }

  /**
   * Keeps the answer just committed, or just replayed from the database, for `(tenant, key)`.
   * @param ttlMs how long the record lives from `completedAt` on: the TTL of a completion, what is left of a replayed one
   * @param completedAt `performance.now()` when the completion (or the claim that replayed it) was sent: the database
   *   measured `ttlMs` from a moment after it
   */
  remember(tenant: string, key: string, fingerprint: string, response: StoredResponse, ttlMs: number, completedAt: number): void {
    const lifetime = Math.min(this.limits.windowMs, ttlMs - clockMargin(ttlMs));
    const bytes = sizeOf(response);
    if (lifetime <= 0 || bytes > this.limits.maxBytes) return;
    const id = entryId(tenant, key);
    const previous = this.entries.get(id);
    if (previous) this.drop(id, previous);
    this.entries.set(id, { fingerprint, response, bytes, until: completedAt + lifetime });
    this.bytes += bytes;
    for (const [oldest, entry] of this.entries) {
      if (this.entries.size <= this.limits.maxEntries && this.bytes <= this.limits.maxBytes) break;
      this.drop(oldest, entry);
    }
  }

  private drop(id: string, entry: Entry): void {
    this.entries.delete(id);
    this.bytes -= entry.bytes;
  }
}

/**
 * Time taken off an entry's life so it never outlives its record: a second
 * (the completion's round trip and a slow COMMIT), and a hundredth of the
 * TTL for clock rates.
 */
function clockMargin(ttlMs: number): number {
  return 1_000 + ttlMs / 100;
}

function sizeOf(response: StoredResponse): number {
  let bytes = 64 + (response.body?.length ?? 0);
  for (const [name, value] of response.headers) bytes += name.length + value.length;
  return bytes;
}

function entryId(tenant: string, key: string): string {
  return `${tenant.length}:${tenant}:${key}`;
}
