import type { IdempotencyEvent, IdempotencyOutcome } from '../core/observer.js';

/** The outcomes the board charts; the rest of `IdempotencyOutcome` count as `other`. */
export const CHARTED_OUTCOMES = ['executed', 'replayed', 'conflict', 'mismatch', 'unavailable', 'takeover', 'other'] as const;
export type ChartedOutcome = (typeof CHARTED_OUTCOMES)[number];
export type OutcomeCounts = Record<ChartedOutcome, number>;

const MINUTE_MS = 60_000;

function chartedAs(outcome: IdempotencyOutcome): ChartedOutcome {
  return (CHARTED_OUTCOMES as readonly string[]).includes(outcome) ? (outcome as ChartedOutcome) : 'other';
}

function emptyCounts(): OutcomeCounts {
  return { executed: 0, replayed: 0, conflict: 0, mismatch: 0, unavailable: 0, takeover: 0, other: 0 };
}

interface Bucket {
  minute: number;
  total: OutcomeCounts;
  byRoute: Map<string, OutcomeCounts>;
}

/** One minute of the last hour, oldest first. */
export interface MinuteOfOutcomes extends OutcomeCounts {
  /** The minute's start, ISO 8601. */
  minute: string;
}

/** A route's outcomes over the last hour. */
export interface RouteOutcomes extends OutcomeCounts {
  route: string;
}

/**
 * The module's outcome events counted per minute for the last `minutes`
 * minutes, in this process only. Events carry no tenant (by design, so that
 * no listener can leak one), so these counts are every tenant's: the board
 * shows them only to operators who may see every tenant.
 *
 * Bounded memory: `minutes` buckets, each with at most `maxRoutes` routes
 * (the routes are controller methods, a fixed set, but a message consumer's
 * label could be anything).
 */
export class OutcomeHistory {
  private readonly buckets: Bucket[] = [];

  constructor(
    private readonly minutes = 60,
    private readonly maxRoutes = 200,
    private readonly now: () => number = Date.now,
  ) {}

  record(event: IdempotencyEvent): void {
    if (event.type !== 'outcome') return;
    const bucket = this.current();
    const outcome = chartedAs(event.outcome);
    bucket.total[outcome]++;
    let route = bucket.byRoute.get(event.route);
    if (!route) {
      if (bucket.byRoute.size >= this.maxRoutes) return;
      route = emptyCounts();
      bucket.byRoute.set(event.route, route);
    }
    route[outcome]++;
  }

  /** Every minute of the window, empty ones included, oldest first. */
  perMinute(): MinuteOfOutcomes[] {
    const last = Math.floor(this.now() / MINUTE_MS);
    const byMinute = new Map(this.buckets.map((bucket) => [bucket.minute, bucket.total]));
    const result: MinuteOfOutcomes[] = [];
    for (let minute = last - this.minutes + 1; minute <= last; minute++) {
      result.push({ minute: new Date(minute * MINUTE_MS).toISOString(), ...(byMinute.get(minute) ?? emptyCounts()) });
    }
    return result;
  }

  /** Each route's outcomes within the window, most requests first. */
  perRoute(): RouteOutcomes[] {
    const oldest = Math.floor(this.now() / MINUTE_MS) - this.minutes + 1;
    const totals = new Map<string, OutcomeCounts>();
    for (const bucket of this.buckets) {
      if (bucket.minute < oldest) continue;
      for (const [route, counts] of bucket.byRoute) {
        const total = totals.get(route) ?? emptyCounts();
        for (const outcome of CHARTED_OUTCOMES) total[outcome] += counts[outcome];
        totals.set(route, total);
      }
    }
    const sum = (counts: OutcomeCounts) => CHARTED_OUTCOMES.reduce((all, outcome) => all + counts[outcome], 0);
    return [...totals].map(([route, counts]) => ({ route, ...counts })).sort((a, b) => sum(b) - sum(a));
  }

  private current(): Bucket {
    const minute = Math.floor(this.now() / MINUTE_MS);
    const last = this.buckets[this.buckets.length - 1];
    if (last?.minute === minute) return last;
    const bucket: Bucket = { minute, total: emptyCounts(), byRoute: new Map() };
    this.buckets.push(bucket);
    while (this.buckets.length > 0 && this.buckets[0].minute <= minute - this.minutes) this.buckets.shift();
    return bucket;
  }
}
