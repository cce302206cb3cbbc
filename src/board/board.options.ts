import type { CanActivate, DynamicModule, ExecutionContext, ForwardReference, Type } from '@nestjs/common';

/**
 * Which tenants an operator may see and act on: one tenant's keys and
 * dead letters, or every tenant's (`allTenants`). Anything else the `scope`
 * function returns refuses the request (403), so a resolver that yields
 * nothing never widens an operator's view.
 */
export type BoardScope = { tenant: string } | { allTenants: true };

export interface IdempotencyBoardOptions {
  /** Where the board is mounted, relative to the app's global prefix: `'board'`, `'admin/idempotency'`. */
  path: string;
  /**
   * The guard that admits operators, run before every page, asset and API
   * call of the board: a guard class (taken from the app's providers when it
   * is one, otherwise created in the board's module with `imports`) or an
   * instance. Required: the board refuses to start without one unless
   * `unguarded: true`.
   */
  guard?: Type<CanActivate> | CanActivate;
  /** Serve the board with no guard at all (a local tool, a test). Logged as a warning at start-up. Default false. */
  unguarded?: boolean;
  /**
   * The tenants the operator admitted by the guard may see, read from the
   * request (the principal the guard authenticated). Default: every tenant.
   * A scoped operator sees only that tenant's keys, outcomes and dead
   * letters.
   */
  scope?: (context: ExecutionContext) => BoardScope | undefined | Promise<BoardScope | undefined>;
  /** Show stored response bodies and headers in the lookup. Default false. */
  showBodies?: boolean;
  /** Modules that provide what the guard class injects, when it is not one of the app's providers already. */
  imports?: Array<Type<unknown> | DynamicModule | Promise<DynamicModule> | ForwardReference>;
}

export interface ResolvedBoardOptions {
  path: string;
  guard?: Type<CanActivate> | CanActivate;
  unguarded: boolean;
  scope?: IdempotencyBoardOptions['scope'];
  showBodies: boolean;
}

export const BOARD_OPTIONS = Symbol('IDEMPOTENCY_BOARD_OPTIONS');

/** The module's store, once the board has checked it is `PostgresIdempotencyStore` (whose table it reads). */
export const BoardKeyStore = Symbol('IDEMPOTENCY_BOARD_KEY_STORE');
