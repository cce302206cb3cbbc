import {
  HttpException,
  HttpStatus,
  Inject,
  Injectable,
  Optional,
  UnauthorizedException,
  type CanActivate,
  type ExecutionContext,
} from '@nestjs/common';
import { HttpAdapterHost, Reflector } from '@nestjs/core';
import { PROBLEM_CONTENT_TYPE } from '../../src/index.js';
import { BOARD_PATH, BoardSessions } from '../board-login/board-sessions.js';
import type { AuthenticatedRequest } from './authenticated-request.js';
import { PUBLIC_ROUTE } from './public.decorator.js';

/** DI token of the `ReadonlyMap` from API key to tenant. */
export const API_KEYS = Symbol('API_KEYS');
/** DI token of the board's controller classes: the only routes where a board session stands in for the key. */
export const BOARD_CONTROLLERS = Symbol('BOARD_CONTROLLERS');

const BEARER = /^Bearer +([\x21-\x7e]+) *$/i;

/** What the app's GraphQL context carries (see GraphQLModule in app.module.ts). */
interface GraphQLContext {
  req: AuthenticatedRequest;
  res?: unknown;
  reply?: unknown;
}

/**
 * Authenticates `Authorization: Bearer <key>` and records the key's tenant on
 * the request, where the idempotency module's tenant resolver reads it.
 * Registered as a global guard: guards run before interceptors, so an unknown
 * or missing key answers 401 before any idempotency key is claimed.
 */
@Injectable()
export class ApiKeyGuard implements CanActivate {
  constructor(
    private readonly reflector: Reflector,
    private readonly adapterHost: HttpAdapterHost,
    @Inject(API_KEYS) private readonly apiKeys: ReadonlyMap<string, string>,
    @Optional() private readonly sessions?: BoardSessions,
    @Optional() @Inject(BOARD_CONTROLLERS) private readonly boardControllers: readonly unknown[] = [],
  ) {}

  canActivate(context: ExecutionContext): boolean {
    if (this.reflector.getAllAndOverride<boolean>(PUBLIC_ROUTE, [context.getHandler(), context.getClass()])) return true;
    // Messages come through the broker, which authenticated their publisher: there is no API key to check.
    if (context.getType() === 'rpc') return true;
    const graphql = context.getType<string>() === 'graphql' ? context.getArgByIndex<GraphQLContext>(2) : undefined;
    const http = context.switchToHttp();
    const request = graphql ? graphql.req : http.getRequest<AuthenticatedRequest>();
    // The board's routes, and only those, also take a browser's sign-in (see BoardLoginController): an
    // Authorization header, when sent, still decides alone.
    const board = !graphql && this.boardControllers.includes(context.getClass());
    let tenant = this.tenantFor(request.headers.authorization);
    if (tenant === undefined && board && request.headers.authorization === undefined) {
      tenant = this.sessions?.tenantOf(request.headers);
    }
    if (tenant === undefined && board && wantsPage(request)) {
      // A person opening the board without signing in is sent to the sign-in form.
      this.adapterHost.httpAdapter.setHeader(http.getResponse(), 'Location', `${BOARD_PATH}/login`);
      throw new HttpException(
        { type: 'about:blank', title: 'See Other', status: 303, detail: `Sign in at ${BOARD_PATH}/login.` },
        HttpStatus.SEE_OTHER,
      );
    }
    if (tenant === undefined) {
      const response = graphql ? (graphql.res ?? graphql.reply) : http.getResponse();
      if (response) this.adapterHost.httpAdapter.setHeader(response, 'WWW-Authenticate', 'Bearer realm="payments"');
      // A problem document (RFC 9457), sent as one; a GraphQL request gets it as an error in its own JSON answer.
      if (!graphql) this.adapterHost.httpAdapter.setHeader(response, 'Content-Type', PROBLEM_CONTENT_TYPE);
      throw new UnauthorizedException({
        type: 'about:blank',
        title: 'Unauthorized',
        status: 401,
        detail: 'Send a valid API key as "Authorization: Bearer <key>".',
      });
    }
    request.tenant = tenant;
    return true;
  }

  private tenantFor(header: string | string[] | undefined): string | undefined {
    if (typeof header !== 'string') return undefined;
    const token = BEARER.exec(header)?.[1];
    return token === undefined ? undefined : this.apiKeys.get(token);
  }
}

/** A browser navigating to the board's page (not a script's fetch, nor curl). */
function wantsPage(request: AuthenticatedRequest): boolean {
  const { method, url, originalUrl } = request as { method?: string; url?: string; originalUrl?: string };
  const path = (originalUrl ?? url ?? '').split('?')[0].replace(/\/+$/, '');
  const accept = request.headers.accept;
  return method === 'GET' && path === BOARD_PATH && typeof accept === 'string' && accept.includes('text/html');
}
