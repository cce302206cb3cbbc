import {
  Body,
  Controller,
  Get,
  HttpCode,
  Inject,
  Post,
  Req,
  Res,
  SetMetadata,
  UseFilters,
  UseGuards,
  type Type,
} from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import { boardMessages } from './messages.js';
import { IDEMPOTENCY_OPTIONS } from '../idempotency.constants.js';
import type { ResolvedIdempotencyOptions } from '../idempotency.options.js';
import { IdempotencyService } from '../idempotency.service.js';
import { Outbox } from '../outbox/outbox.js';
import type { PostgresIdempotencyStore } from '../store/postgres/postgres-idempotency.store.js';
import { IdempotencySweeper } from '../sweeper/idempotency.sweeper.js';
import { BOARD_SCRIPT, BOARD_STYLES, boardPage } from './board-page.js';
import { BoardProblemFilter, boardProblems } from './board-problems.js';
import { csrfAccepted, csrfCookieLine, csrfCookieOf, newCsrfToken } from './board-csrf.js';
import { BoardGuard, scopeOf } from './board.guard.js';
import { BOARD_OPTIONS, BoardKeyStore, type BoardScope, type ResolvedBoardOptions } from './board.options.js';
import { BOARD_STATEMENT_TIMEOUT_MS, BoardQueries, type TenantFilter } from './board.queries.js';
import { BoardOutcomes } from './board-outcomes.js';
import { BoardRouteLabels } from './route-labels.js';

/** The request fields the board reads, the same on Express and Fastify. */
interface BoardRequest {
  headers: Record<string, string | string[] | undefined>;
  url: string;
  originalUrl?: string;
  protocol?: string;
  secure?: boolean;
}

/** The metadata key of @nestjs/swagger's `@ApiExcludeController()`. */
const SWAGGER_EXCLUDE_CONTROLLER = 'swagger/apiExcludeController';

const MAX_TENANTS = 100;
const MAX_LISTED = 100;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const OUTBOX_ID = /^[1-9][0-9]{0,18}$/;
const MAX_BIGINT = 2n ** 63n - 1n;

/** An outbox message id as PostgreSQL's `bigint` can hold it (19 digits can still overflow it). */
function isOutboxId(id: unknown): id is string {
  return typeof id === 'string' && OUTBOX_ID.test(id) && BigInt(id) <= MAX_BIGINT;
}

/**
 * A string PostgreSQL can compare with a `text` column: anything but a NUL.
 * Keys are not held to the header's rules here: `IdempotencyService.execute`
 * and message consumers store keys of their own, and the lookup must find them.
 */
function isText(value: unknown): value is string {
  return typeof value === 'string' && value.length > 0 && !value.includes('\0');
}

function tenantFilter(scope: BoardScope): TenantFilter {
  return 'tenant' in scope ? scope.tenant : null;
}

/** The tenant an action names, which a scoped operator can only name as their own. */
function tenantFor(scope: BoardScope, named: unknown): string {
  if ('tenant' in scope) {
    if (named !== undefined && named !== scope.tenant) throw boardProblems.notFound();
    return scope.tenant;
  }
  // A NUL cannot be stored in a text column: such a tenant exists nowhere, and PostgreSQL would refuse it with an error.
  if (!isText(named)) throw boardProblems.badRequest('tenant');
  return named;
}

function isStatementTimeout(error: unknown): boolean {
  return (error as { code?: unknown } | null)?.code === '57014';
}

/** A part of a page that may time out on a huge table: the rest of the page is still answered. */
async function timeLimited<T>(part: Promise<T>): Promise<T | { unavailable: string }> {
  try {
    return await part;
  } catch (error) {
    if (isStatementTimeout(error)) return { unavailable: boardMessages.timedOut(BOARD_STATEMENT_TIMEOUT_MS) };
    throw error;
  }
}

/**
 * The board's page, assets and JSON, mounted at the app's chosen path by
 * `boardController`. Every route goes through `BoardGuard`; the actions
 * (POST) also need the anti-forgery token, and the lookup is a POST too, so
 * a key never appears in a URL (nor in an access log).
 */
@UseGuards(BoardGuard)
@UseFilters(BoardProblemFilter)
export class BoardControllerBase {
  constructor(
    @Inject(BOARD_OPTIONS) private readonly options: ResolvedBoardOptions,
    @Inject(IDEMPOTENCY_OPTIONS) private readonly moduleOptions: ResolvedIdempotencyOptions,
    private readonly queries: BoardQueries,
    private readonly outcomes: BoardOutcomes,
    private readonly routeLabels: BoardRouteLabels,
    private readonly sweeper: IdempotencySweeper,
    private readonly idempotency: IdempotencyService,
    @Inject(BoardKeyStore) private readonly store: PostgresIdempotencyStore,
    private readonly outbox: Outbox,
    private readonly adapterHost: HttpAdapterHost,
  ) {}

  @Get()
  page(@Req() request: BoardRequest, @Res({ passthrough: true }) response: unknown): string {
    const base = (request.originalUrl ?? request.url).split('?')[0].replace(/\/+$/, '');
    const token = csrfCookieOf(request.headers) ?? newCsrfToken();
    const secure = request.secure === true || request.protocol === 'https';
    this.headers(response, 'text/html; charset=utf-8');
    this.adapter.setHeader(response, 'Set-Cookie', csrfCookieLine(token, base || '/', secure));
    return boardPage({ base, csrfToken: token, scope: scopeOf(request) });
  }

  @Get('assets/board.js')
  script(@Res({ passthrough: true }) response: unknown): string {
    this.headers(response, 'text/javascript; charset=utf-8');
    return BOARD_SCRIPT;
  }

  @Get('assets/board.css')
  styles(@Res({ passthrough: true }) response: unknown): string {
    this.headers(response, 'text/css; charset=utf-8');
    return BOARD_STYLES;
  }

  @Get('api/overview')
  async overview(@Req() request: BoardRequest, @Res({ passthrough: true }) response: unknown) {
    this.headers(response);
    const scope = scopeOf(request);
    const tenant = tenantFilter(scope);
    const [keys, outbox] = await Promise.all([
      timeLimited(this.queries.keyCounts(tenant, MAX_TENANTS)),
      this.queries.hasOutbox ? timeLimited(this.queries.outboxCounts(tenant)) : undefined,
    ]);
    const lastRun = this.sweeper.lastRun;
    return {
      scope,
      now: new Date().toISOString(),
      keys,
      sweeper: {
        scheduled: this.moduleOptions.sweep.scheduled,
        intervalMs: this.moduleOptions.sweep.intervalMs,
        lastRun: lastRun
          ? {
              finishedAt: lastRun.finishedAt.toISOString(),
              ran: lastRun.ran,
              deleted: lastRun.deleted,
              failed: lastRun.error !== undefined,
            }
          : null,
      },
      outbox: outbox ?? null,
      outcomes: {
        perMinute: this.outcomes.history.perMinute(tenant),
        // What a request names (`POST /charges`) beside the handler the events name (`ChargesController.create`).
        perRoute: this.outcomes.history
          .perRoute(tenant)
          .map((row) => ({ ...row, label: this.routeLabels.of(row.route) ?? row.route })),
      },
    };
  }

  @Get('api/stuck')
  async stuck(@Req() request: BoardRequest, @Res({ passthrough: true }) response: unknown) {
    this.headers(response);
    return { keys: await timeLimited(this.queries.stuckKeys(tenantFilter(scopeOf(request)), MAX_LISTED)) };
  }

  @Post('api/stuck/release')
  @HttpCode(200)
  async release(@Req() request: BoardRequest, @Body() body: unknown, @Res({ passthrough: true }) response: unknown) {
    const { tenant, ref } = this.action<'tenant' | 'ref'>(request, response, body);
    if (typeof ref !== 'string' || !UUID.test(ref)) throw boardProblems.badRequest('ref');
    const owner = tenantFor(scopeOf(request), tenant);
    const key = await this.store.endLease(owner, ref);
    if (key === undefined) throw boardProblems.released();
    // If the attempt runs in this process, its duplicates here must not be answered 409 from memory meanwhile.
    this.idempotency.leaseEnded(owner, key);
    return { released: true };
  }

  @Post('api/lookup')
  @HttpCode(200)
  async lookup(@Req() request: BoardRequest, @Body() body: unknown, @Res({ passthrough: true }) response: unknown) {
    const { tenant, key } = this.action<'tenant' | 'key'>(request, response, body);
    if (!isText(key)) throw boardProblems.badRequest('key');
    const owner = tenantFor(scopeOf(request), tenant === '' ? undefined : tenant);
    const details = await this.queries.lookup(owner, key, this.options.showBodies);
    if (!details) throw boardProblems.notFound();
    return details;
  }

  @Get('api/dead-letters')
  async deadLetters(@Req() request: BoardRequest, @Res({ passthrough: true }) response: unknown) {
    this.headers(response);
    return {
      configured: this.queries.hasOutbox,
      messages: await timeLimited(this.queries.deadLetters(tenantFilter(scopeOf(request)), MAX_LISTED)),
    };
  }

  @Post('api/dead-letters/redrive')
  @HttpCode(200)
  async redrive(@Req() request: BoardRequest, @Body() body: unknown, @Res({ passthrough: true }) response: unknown) {
    const { ids, all } = this.action<'ids' | 'all'>(request, response, body);
    let chosen: string[] | undefined;
    if (all === true && ids === undefined) chosen = undefined;
    else if (Array.isArray(ids) && ids.length > 0 && ids.length <= 1000 && ids.every(isOutboxId)) chosen = ids as string[];
    else throw boardProblems.badRequest('ids (or all: true)');
    if (!this.queries.hasOutbox) return { redriven: 0 };
    return { redriven: await this.outbox.store.redrive(chosen, tenantFilter(scopeOf(request)) ?? undefined) };
  }

  private get adapter() {
    return this.adapterHost.httpAdapter;
  }

  /**
   * Every answer: not cached (operators' data, a fresh token), framed by
   * nobody, and a policy that allows the board's own script and styles only
   * (stricter than helmet's default, so the page works under either).
   */
  private headers(response: unknown, contentType = 'application/json; charset=utf-8'): void {
    this.adapter.setHeader(response, 'Content-Type', contentType);
    this.adapter.setHeader(response, 'Cache-Control', 'no-store');
    this.adapter.setHeader(response, 'X-Content-Type-Options', 'nosniff');
    this.adapter.setHeader(
      response,
      'Content-Security-Policy',
      "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
        "base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    );
  }

  /** An action (a POST): the board's headers, the anti-forgery check, and the JSON body's fields, unchecked. */
  private action<Field extends string>(request: BoardRequest, response: unknown, body: unknown): Partial<Record<Field, unknown>> {
    this.headers(response);
    if (!csrfAccepted(request.headers)) throw boardProblems.csrf();
    return typeof body === 'object' && body !== null ? (body as Partial<Record<Field, unknown>>) : {};
  }
}

/** The controller at the app's chosen path: a subclass per board, since Nest reads a controller's path from its class. */
export function boardController(path: string): Type<BoardControllerBase> {
  @Controller(path)
  // @nestjs/swagger's @ApiExcludeController() as metadata, so Swagger stays an optional peer: an operator's
  // page and its JSON are no part of the API an app documents.
  @SetMetadata(SWAGGER_EXCLUDE_CONTROLLER, [true])
  class IdempotencyBoardController extends BoardControllerBase {}
  return IdempotencyBoardController;
}
