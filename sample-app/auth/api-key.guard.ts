import { Inject, Injectable, UnauthorizedException, type CanActivate, type ExecutionContext } from '@nestjs/common';
import { HttpAdapterHost, Reflector } from '@nestjs/core';
import { PROBLEM_CONTENT_TYPE } from '../../src/index.js';
import type { AuthenticatedRequest } from './authenticated-request.js';
import { PUBLIC_ROUTE } from './public.decorator.js';

/** DI token of the `ReadonlyMap` from API key to tenant. */
export const API_KEYS = Symbol('API_KEYS');

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
  ) {}

  canActivate(context: ExecutionContext): boolean {
    if (this.reflector.getAllAndOverride<boolean>(PUBLIC_ROUTE, [context.getHandler(), context.getClass()])) return true;
    // Messages come through the broker, which authenticated their publisher: there is no API key to check.
    if (context.getType() === 'rpc') return true;
    const graphql = context.getType<string>() === 'graphql' ? context.getArgByIndex<GraphQLContext>(2) : undefined;
    const http = context.switchToHttp();
    const request = graphql ? graphql.req : http.getRequest<AuthenticatedRequest>();
    const tenant = this.tenantFor(request.headers.authorization);
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
