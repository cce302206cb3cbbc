import { IdempotencyConfigurationError } from '../core/configuration-error.js';
import { clientMessages } from './messages.js';
import { systemClock, type ClientClock } from './clock.js';

export interface RetryBudgetOptions {
  /**
   * Retries allowed as a share of the requests made in the window: with 0.2,
   * an outage that fails every request costs at most 1.2 times the normal
   * load, however many attempts each intent would allow. Default 0.2.
   */
  ratio?: number;
  /**
   * Retries allowed in any window whatever the traffic, so that a client
   * making few requests can still retry a blip. Default 10.
   */
  minRetries?: number;
  /** The sliding window, in ms. Default 10 000 (10 s). */
  window?: number;
  /** For tests; default the system clock. */
  clock?: ClientClock;
}

export const RETRY_BUDGET_DEFAULTS = { ratio: 0.2, minRetries: 10, window: 10_000 } as const;

/** How finely the window slides: counts move out of it one tenth at a time. */
const SLICES = 10;

interface Slice {
  /** Which slice of time (`floor(now / sliceMs)`) the counts belong to. */
  index: number;
  requests: number;
  retries: number;
}

/**
 * Limits retries to a share of requests over a sliding window, with a small
 * floor: the retry budget of Finagle and gRPC. Per-intent limits (attempts,
 * a deadline) bound one caller; only a budget shared by every intent of a
 * client bounds what an outage multiplies the load by. One `IdempotentClient`
 * has one; pass the same instance to several clients to share it.
 */
export class RetryBudget {
  readonly ratio: number;
  readonly minRetries: number;
  readonly window: number;
  private readonly clock: ClientClock;
  private readonly sliceMs: number;
  private readonly slices: Slice[];

  constructor(options: RetryBudgetOptions = {}) {
    this.ratio = options.ratio ?? RETRY_BUDGET_DEFAULTS.ratio;
    this.minRetries = options.minRetries ?? RETRY_BUDGET_DEFAULTS.minRetries;
    this.window = options.window ?? RETRY_BUDGET_DEFAULTS.window;
    if (typeof this.ratio !== 'number' || !(this.ratio >= 0 && this.ratio <= 1)) {
      throw new IdempotencyConfigurationError(clientMessages.budgetRatio(options.ratio));
    }
    if (!Number.isSafeInteger(this.minRetries) || this.minRetries < 0) {
      throw new IdempotencyConfigurationError(clientMessages.budgetMinRetries(options.minRetries));
    }
    if (!Number.isSafeInteger(this.window) || this.window < SLICES) {
      throw new IdempotencyConfigurationError(clientMessages.budgetWindow(options.window));
    }
    this.clock = options.clock ?? systemClock;
    this.sliceMs = this.window / SLICES;
    this.slices = Array.from({ length: SLICES }, () => ({ index: -Infinity, requests: 0, retries: 0 }));
  }

  /** Counts a first attempt: every request earns `ratio` of a retry. */
  recordRequest(): void {
    this.current().requests++;
  }

  /** Spends one retry if the window has one left; false means do not retry. */
  tryRetry(): boolean {
    if (this.available() < 1) return false;
    this.current().retries++;
    return true;
  }

  /** Retries the window still allows (may be fractional). */
  available(): number {
    const { requests, retries } = this.totals();
    return this.minRetries + this.ratio * requests - retries;
  }

  private current(): Slice {
    const index = Math.floor(this.clock.now() / this.sliceMs);
    const slice = this.slices[((index % SLICES) + SLICES) % SLICES];
    if (slice.index !== index) Object.assign(slice, { index, requests: 0, retries: 0 });
    return slice;
  }

  private totals(): { requests: number; retries: number } {
    const newest = Math.floor(this.clock.now() / this.sliceMs);
    let requests = 0;
    let retries = 0;
    for (const slice of this.slices) {
      if (slice.index > newest - SLICES && slice.index <= newest) {
        requests += slice.requests;
        retries += slice.retries;
      }
    }
    return { requests, retries };
  }
}
