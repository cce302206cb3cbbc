import {
  HttpException,
  Inject,
  Injectable,
  Logger,
  type CallHandler,
  type ExecutionContext,
  type NestInterceptor,
  type Type,
} from '@nestjs/common';
import { defaultIfEmpty, lastValueFrom, Observable, type Subscriber } from 'rxjs';
import type { EngineOutcome } from '../core/idempotency-engine.js';
import { UnrepresentableInputError } from '../core/errors.js';
import { fingerprintValue } from '../core/fingerprint.js';
import { parseIdempotencyKey } from '../core/key.js';
import { messages } from '../errors/messages.js';
import { IdempotencyProblemException, problems } from '../errors/problems.js';
import { headerValues, type HttpRequest } from '../http/request-identity.js';
import { IdempotentRoutes, type RouteSettings } from '../http/route-settings.js';
import { IDEMPOTENCY_OPTIONS, REPLAYED_HEADER } from '../idempotency.constants.js';
import type { ResolvedIdempotencyOptions } from '../idempotency.options.js';
import { decodeOutcome, encodeOutcome, problemForOutcome, resolveTenant, runHandler } from '../entry-point.js';
import { IdempotencyService } from '../idempotency.service.js';
import { IdempotencyGraphQLError, ReplayedGraphQLError, StoredGraphQLError } from './graphql-problem.js';

/** The argument read for the key when the request has no key header. */
const DEFAULT_KEY_ARGUMENT = 'idempotencyKey';

/** Field resolutions already handled (class- and method-level `@Idempotent()` both apply the interceptor). */
const handledFields = new WeakSet<object>();

/** The parts of a GraphQL context this reads: the HTTP request (Apollo on Express `req`, on Fastify `request`/`reply`) and response. */
interface GraphQLContextValue {
  req?: HttpRequest;
  request?: HttpRequest;
  res?: { setHeader?: (name: string, value: string) => unknown; header?: (name: string, value: string) => unknown };
  reply?: { request?: HttpRequest; header?: (name: string, value: string) => unknown };
}

interface ResolveInfo {
  fieldName?: string;
  parentType?: { name?: string };
}

/**
 * The GraphQL face of the engine, for `@Idempotent()` on a mutation
 * resolver: the key from the request's key header (or an argument), the
 * resolver run through `IdempotencyService` in the transaction its
 * completion commits in, its result stored as JSON and returned again on a
 * retry, which GraphQL then resolves into the selection like the first
 * time. The module's answers (a conflict, a mismatch, ...) are GraphQL
 * errors whose `extensions` carry the code, problem type and status the
 * HTTP routes use.
 */
@Injectable()
export class IdempotentResolverInterceptor implements NestInterceptor {
  private readonly logger = new Logger('Idempotency');

  constructor(
    private readonly routes: IdempotentRoutes,
    private readonly service: IdempotencyService,
    @Inject(IDEMPOTENCY_OPTIONS) private readonly options: ResolvedIdempotencyOptions,
  ) {}

  intercept(context: ExecutionContext, next: CallHandler): Observable<unknown> {
    if (context.getType<string>() !== 'graphql') return next.handle();
    const info = context.getArgByIndex<ResolveInfo | undefined>(3);
    if (info && typeof info === 'object') {
      if (handledFields.has(info)) return next.handle();
      handledFields.add(info);
    }
    const route = this.routes.get(context.getClass<Type>(), context.getHandler() as (...args: unknown[]) => unknown);
    if (!route) return next.handle();
    return new Observable((subscriber) => void this.resolve(context, next, route, info, subscriber));
  }

  private async resolve(
    context: ExecutionContext,
    next: CallHandler,
    route: RouteSettings,
    info: ResolveInfo | undefined,
    subscriber: Subscriber<unknown>,
  ): Promise<void> {
    const args = context.getArgByIndex<Record<string, unknown> | undefined>(1) ?? {};
    const gqlContext = context.getArgByIndex<GraphQLContextValue | undefined>(2) ?? {};
    const fail = (error: unknown) =>
      subscriber.error(error instanceof IdempotencyProblemException ? this.graphqlError(error, gqlContext) : error);
    let key = '';
    try {
      const found = this.keyOf(route, context, args, gqlContext);
      if (found === undefined) {
        if (route.options.required) return fail(problems.missingKey(this.options.header));
        return void this.service.runWithoutIdempotency(() => next.handle()).subscribe(subscriber);
      }
      key = found;
      const tenant = await resolveTenant(this.options, context, route.name, this.logger);
      let outcome: EngineOutcome<unknown>;
      try {
        outcome = await runHandler(this.service, {
          route,
          context,
          tenant,
          key,
          defaultFingerprint: () =>
            fingerprintValue({ field: `${info?.parentType?.name ?? ''}.${info?.fieldName ?? route.name}`, args }),
          run: async () => {
            const value = await lastValueFrom(next.handle().pipe(defaultIfEmpty(undefined)));
            return { response: encodeOutcome({ value: value ?? null }, 200), result: value };
          },
          readFailure: (error) => ({
            definite: error instanceof HttpException ? error.getStatus() < 500 : isGraphQLError(error),
            response: async () => encodeOutcome({ error: storedError(error) }, 400),
          }),
        });
      } catch (error) {
        if (error instanceof UnrepresentableInputError) return fail(problems.unrepresentableBody(error.reason));
        throw error;
      }
      if (outcome.kind === 'replayed') setHeader(gqlContext, REPLAYED_HEADER, 'true');
      const stored = decodeOutcome<{ message: string; extensions: Record<string, unknown> }>(outcome.response);
      if ('error' in stored) {
        const { message, extensions } = stored.error;
        return subscriber.error(
          outcome.kind === 'failure-stored'
            ? new StoredGraphQLError(message, extensions, outcome.error)
            : new ReplayedGraphQLError(message, extensions),
        );
      }
      subscriber.next(stored.value);
      subscriber.complete();
    } catch (error) {
      fail(problemForOutcome(error, this.options, route.name, key, this.logger) ?? error);
    }
  }

  private keyOf(
    route: RouteSettings,
    context: ExecutionContext,
    args: Record<string, unknown>,
    gqlContext: GraphQLContextValue,
  ): string | undefined {
    const option = route.options.key;
    if (typeof option === 'function') return checkedKey(option(context), this.options.maxKeyLength);
    if (typeof option === 'string') return checkedKey(args[option], this.options.maxKeyLength);
    const request = gqlContext.req ?? gqlContext.request ?? gqlContext.reply?.request;
    const values = request ? headerValues(request, this.options.header) : [];
    if (values.length > 0) {
      const parsed = parseIdempotencyKey(values, this.options.maxKeyLength);
      if (!parsed.ok) throw problems.invalidKey(parsed.reason, parsed.detail);
      return parsed.key;
    }
    const argument = args[DEFAULT_KEY_ARGUMENT];
    if (argument !== undefined) return checkedKey(argument, this.options.maxKeyLength);
    // Not a client's mistake but the app's: the header can never be read.
    if (!request) this.logger.error(messages.graphql.noRequest);
    return undefined;
  }

  /** The problem as a GraphQL error; `Retry-After` goes on the HTTP response too where the context carries it. */
  private graphqlError(problem: IdempotencyProblemException, gqlContext: GraphQLContextValue): IdempotencyGraphQLError {
    if (problem.retryAfterSeconds !== undefined) setHeader(gqlContext, 'Retry-After', String(problem.retryAfterSeconds));
    return new IdempotencyGraphQLError(problem);
  }
}

function checkedKey(value: unknown, maxLength: number): string | undefined {
  if (value === undefined || value === null) return undefined;
  const parsed = parseIdempotencyKey([typeof value === 'string' ? value : String(value)], maxLength);
  if (!parsed.ok) throw problems.invalidKey(parsed.reason, parsed.detail);
  return parsed.key;
}

/** graphql-js errors (and those thrown to become one) carry `extensions`: the resolver's definite answer, like a 4xx. */
function isGraphQLError(error: unknown): boolean {
  return error instanceof Error && typeof (error as { extensions?: unknown }).extensions === 'object';
}

function storedError(error: unknown): { message: string; extensions: Record<string, unknown> } {
  if (error instanceof HttpException) {
    return { message: error.message, extensions: { code: httpCode(error.getStatus()), status: error.getStatus() } };
  }
  const { message, extensions } = error as { message: string; extensions?: Record<string, unknown> };
  return { message, extensions: { ...(extensions ?? {}) } };
}

/** The code Nest's GraphQL exception mapping gives an `HttpException` of this status. */
function httpCode(status: number): string {
  const codes: Record<number, string> = { 400: 'BAD_REQUEST', 401: 'UNAUTHENTICATED', 403: 'FORBIDDEN', 404: 'NOT_FOUND' };
  return codes[status] ?? 'BAD_REQUEST';
}

function setHeader(gqlContext: GraphQLContextValue, name: string, value: string): void {
  try {
    if (gqlContext.res?.setHeader) gqlContext.res.setHeader(name, value);
    else if (gqlContext.res?.header) gqlContext.res.header(name, value);
    else gqlContext.reply?.header?.(name, value);
  } catch {
    // Headers already sent (a batched request answered in part): the extensions say it all.
  }
}
