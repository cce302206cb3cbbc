import type { ResolvedRouteOptions } from '../idempotency.options.js';

/** An idempotent route: its name for messages, and its options filled from the module's. */
export interface RouteSettings {
  name: string;
  options: ResolvedRouteOptions;
}
