import { localId } from './held-keys.js';
import type { WorkScope } from './work.js';

/**
 * The claims this process has sent and not yet had answered, by key: a duplicate of one (same tenant, key and
 * request) waits for its answer instead of sending its own. Only answers that stay true are shared (see
 * `answeredByClaim`); a key held elsewhere may have been completed since, so its duplicates ask the store.
 */
export class ClaimsOnTheirWay<Answer> {
  private readonly pending = new Map<string, { fingerprint: string; answer: Promise<Answer> }>();

  /** The answer to come of a claim of `work`'s key and request sent by this process, if one is on its way. */
  find(work: Pick<WorkScope, 'tenant' | 'key' | 'fingerprint'>): Promise<Answer> | undefined {
    const pending = this.pending.get(localId(work));
    return pending?.fingerprint === work.fingerprint ? pending.answer : undefined;
  }

  /**
   * Lets duplicates of `work` find `claim` until it is answered. Returns `claim` itself: its sender's
   * continuation is registered first, so it holds the key (running here) before any duplicate looks.
   */
  share<T extends Answer>(work: Pick<WorkScope, 'tenant' | 'key' | 'fingerprint'>, claim: Promise<T>): Promise<T> {
    const id = localId(work);
    const pending = { fingerprint: work.fingerprint, answer: claim };
    this.pending.set(id, pending);
    const forget = () => {
      if (this.pending.get(id) === pending) this.pending.delete(id);
    };
    claim.then(forget, forget);
    return claim;
  }
}
