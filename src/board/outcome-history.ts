import type { IdempotencyEvent, IdempotencyOutcome } from '../core/observer.js';

/**
 * Every outcome, each charted under its own name, in the chart's order: what ran or replayed,
 * then the handler's failures (a 4xx it threw, stored; a 5xx or an unknown error, its key kept
 * until the lease ends; a failure whose key was given back, such as a body the validation pipe
 * rejected), then the module's own answers.
 */
export const CHARTED_OUTCOMES = [
  'executed',
  'takeover',
  'replayed',
  'failure-stored',
  'kept',
  'released',
  'conflict',
  'lease-lost',
  'mismatch',
  'unavailable',
  'error',
] as const satisfies readonly IdempotencyOutcome[];
export type ChartedOutcome = (typeof CHARTED_OUTCOMES)[number];
export type OutcomeCounts = Record<ChartedOutcome, number>;
/** Fails to compile when an outcome is added to `IdempotencyOutcome` and not to the chart. */
const everyOutcomeCharted: [Exclude<IdempotencyOutcome, ChartedOutcome>] extends [never] ? true : never = true;
void everyOutcomeCharted;

const MINUTE_MS = 60_000;

function emptyCounts(): OutcomeCounts {
  return Object.fromEntries(CHARTED_OUTCOMES.map((outcome) => [outcome, 0])) as OutcomeCounts;
}

/** Outcomes of tenants past `maxTenants` in one minute: counted, but shown only in the every-tenant view. */
const OVERFLOW_TENANT = Symbol('other tenants');
/** Routes past `maxRoutes` for one tenant in one minute. */
export const OTHER_ROUTES = '(other routes)';

type TenantSlot = string | typeof OVERFLOW_TENANT;

interface Bucket {
  minute: number;
  tenants: Map<TenantSlot, Map<string, OutcomeCounts>>;
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

function add(into: OutcomeCounts, counts: OutcomeCounts): void {
  for (const outcome of CHARTED_OUTCOMES) into[outcome] += counts[outcome];
}

/**
 * The module's outcome events counted per minute for the last `minutes`
 * minutes, per tenant and route, in this process only (each instance counts
 * its own requests). Read for one tenant, or (`null`) for every tenant.
 *
 * Bounded memory: `minutes` buckets, each with at most `maxTenants` tenants
 * and `maxRoutes` routes per tenant (routes are controller methods, a fixed
 * set, but a message consumer's label could be anything); what is past
 * either bound is still counted in the every-tenant view.
 */
export class OutcomeHistory {
  private readonly buckets: Bucket[] = [];

  constructor(
    private readonly minutes = 60,
    private readonly maxTenants = 1_000,
    private readonly maxRoutes = 100,
    private readonly now: () => number = Date.now,
  ) {}

  record(event: IdempotencyEvent, tenant: string | undefined): void {
    if (event.type !== 'outcome') return;
    const bucket = this.current();
    let slot: TenantSlot = tenant ?? OVERFLOW_TENANT;
    let routes = bucket.tenants.get(slot);
    if (!routes && bucket.tenants.size >= this.maxTenants) {
      slot = OVERFLOW_TENANT;
      routes = bucket.tenants.get(slot);
    }
    if (!routes) {
      routes = new Map();
      bucket.tenants.set(slot, routes);
    }
    const route = routes.has(event.route) || routes.size < this.maxRoutes ? event.route : OTHER_ROUTES;
    let counts = routes.get(route);
    if (!counts) {
      counts = emptyCounts();
      routes.set(route, counts);
    }
    counts[event.outcome]++;
  }

  /** Every minute of the window, empty ones included, oldest first. */
  perMinute(tenant: string | null): MinuteOfOutcomes[] {
    const last = Math.floor(this.now() / MINUTE_MS);
    const totals = new Map<number, OutcomeCounts>();
    for (const bucket of this.buckets) {
      const total = emptyCounts();
      for (const routes of this.slotsOf(bucket, tenant)) for (const counts of routes.values()) add(total, counts);
      totals.set(bucket.minute, total);
    }
    const result: MinuteOfOutcomes[] = [];
    for (let minute = last - this.minutes + 1; minute <= last; minute++) {
      result.push({ minute: new Date(minute * MINUTE_MS).toISOString(), ...(totals.get(minute) ?? emptyCounts()) });
    }
    return result;
  }

  /** Each route's outcomes within the window, most requests first. */
  perRoute(tenant: string | null): RouteOutcomes[] {
    const oldest = Math.floor(this.now() / MINUTE_MS) - this.minutes + 1;
    const totals = new Map<string, OutcomeCounts>();
    for (const bucket of this.buckets) {
      if (bucket.minute < oldest) continue;
      for (const routes of this.slotsOf(bucket, tenant)) {
        for (const [route, counts] of routes) {
          const total = totals.get(route) ?? emptyCounts();
          add(total, counts);
          totals.set(route, total);
        }
      }
    }
    const sum = (counts: OutcomeCounts) => CHARTED_OUTCOMES.reduce((all, outcome) => all + counts[outcome], 0);
    return [...totals].map(([route, counts]) => ({ route, ...counts })).sort((a, b) => sum(b) - sum(a));
  }

  private slotsOf(bucket: Bucket, tenant: string | null): Iterable<Map<string, OutcomeCounts>> {
    if (tenant === null) return bucket.tenants.values();
    const routes = bucket.tenants.get(tenant);
    return routes ? [routes] : [];
  }

  private current(): Bucket {
    const minute = Math.floor(this.now() / MINUTE_MS);
    const last = this.buckets[this.buckets.length - 1];
    if (last?.minute === minute) return last;
    const bucket: Bucket = { minute, tenants: new Map() };
    this.buckets.push(bucket);
    while (this.buckets.length > 0 && this.buckets[0].minute <= minute - this.minutes) this.buckets.shift();
    return bucket;
  }
}
