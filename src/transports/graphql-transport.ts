import { HttpException } from '@nestjs/common';
import { fingerprintValue } from '../core/fingerprint-value.js';
import { checkKey, parseIdempotencyKey } from '../core/key.js';
import type { FailureReading } from '../core/outcomes.js';
import type { EngineOutcome } from '../core/work.js';
import { messages } from '../errors/messages.js';
import { problems } from '../errors/problems.js';
import { IdempotencyGraphQLError, ReplayedGraphQLError, StoredGraphQLError } from '../graphql/graphql-problem.js';
import type { HttpRequest } from '../http/platform-types.js';
import { headerValues } from '../http/request-identity.js';
import { REPLAYED_HEADER } from '../idempotency.constants.js';
import { lastValueOf } from './http-transport.js';
import { problemForOutcome } from './outcome-answers.js';
import { NestTransport } from './nest-transport.js';
import type { Done } from './transport.js';
import { jsonResponse, readJson, type StoredOutcome } from './stored-outcome.js';
import { withoutIdempotency } from './without-idempotency.js';

/** The argument read for the key when the request has no key header. */
const DEFAULT_KEY_ARGUMENT = 'idempotencyKey';

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

type StoredError = { message: string; extensions: Record<string, unknown> };

/**
 * A GraphQL mutation: the key from the request's key header (or an
 * argument), the resolver's result stored as JSON and returned again on a
 * retry, which GraphQL then resolves into the selection like the first
 * time. The module's answers (a conflict, a mismatch, ...) are GraphQL
 * errors whose `extensions` carry the code, problem type and status the HTTP
 * routes use.
 */
export class GraphQLTransport extends NestTransport {
  private readonly args = this.context.getArgByIndex<Record<string, unknown> | undefined>(1) ?? {};
  private readonly gqlContext = this.context.getArgByIndex<GraphQLContextValue | undefined>(2) ?? {};
  private readonly info = this.context.getArgByIndex<ResolveInfo | undefined>(3);

  readKey(): string | undefined {
    const { options } = this.runtime;
    const option = this.route.options.key;
    if (typeof option === 'function') return this.checked(option(this.context));
    if (typeof option === 'string') return this.checked(this.args[option]);
    const request = this.gqlContext.req ?? this.gqlContext.request ?? this.gqlContext.reply?.request;
    const values = request ? headerValues(request, options.header) : [];
    if (values.length > 0) {
      const parsed = parseIdempotencyKey(values, options.maxKeyLength);
      if (!parsed.ok) throw problems.invalidKey(parsed.reason, parsed.detail);
      return parsed.key;
    }
    const argument = this.args[DEFAULT_KEY_ARGUMENT];
    if (argument !== undefined) return this.checked(argument);
    // Not a client's mistake but the app's: the header can never be read.
    if (!request) this.runtime.logger.error(messages.graphql.noRequest);
    return undefined;
  }

  fingerprint(): string {
    const field = `${this.info?.parentType?.name ?? ''}.${this.info?.fieldName ?? this.route.name}`;
    return fingerprintValue({ field, args: this.args });
  }

  async invoke(): Promise<Done<unknown>> {
    const value = await lastValueOf(this.next.handle());
    return { response: jsonResponse({ value: value ?? null }, 200), result: value };
  }

  readFailure(error: unknown): FailureReading {
    return {
      definite: error instanceof HttpException ? error.getStatus() < 500 : isGraphQLError(error),
      response: async () => jsonResponse({ error: storedError(error) }, 400),
    };
  }

  runWithoutKey(): void {
    withoutIdempotency(this.runtime, () => this.next.handle()).subscribe(this.subscriber);
  }

  answer(outcome: EngineOutcome<unknown>): void {
    if (outcome.kind === 'replayed') this.setHeader(REPLAYED_HEADER, 'true');
    const stored = readJson<StoredOutcome<StoredError>>(outcome.response, { value: null });
    if ('error' in stored) {
      const { message, extensions } = stored.error;
      return this.subscriber.error(
        outcome.kind === 'failure-stored'
          ? new StoredGraphQLError(message, extensions, outcome.error)
          : new ReplayedGraphQLError(message, extensions),
      );
    }
    this.subscriber.next(stored.value);
    this.subscriber.complete();
  }

  fail(error: unknown, key: string): void {
    const { options, logger } = this.runtime;
    const problem = problemForOutcome(error, options.unavailableRetryAfter, this.route.name, key, logger);
    if (!problem) return this.subscriber.error(error);
    // Retry-After goes on the HTTP response too, where the context carries it.
    if (problem.retryAfterSeconds !== undefined) this.setHeader('Retry-After', String(problem.retryAfterSeconds));
    this.subscriber.error(new IdempotencyGraphQLError(problem));
  }

  /** A key from an argument or the route's function: the key rules, with no header syntax. */
  private checked(value: unknown): string | undefined {
    if (value === undefined || value === null) return undefined;
    const checked = checkKey(typeof value === 'string' ? value : String(value), this.runtime.options.maxKeyLength);
    if (!checked.ok) throw problems.invalidKey(checked.reason, checked.detail);
    return checked.key;
  }

  private setHeader(name: string, value: string): void {
    const { res, reply } = this.gqlContext;
    try {
      if (res?.setHeader) res.setHeader(name, value);
      else if (res?.header) res.header(name, value);
      else reply?.header?.(name, value);
    } catch {
      // Headers already sent (a batched request answered in part): the extensions say it all.
    }
  }
}

/** graphql-js errors (and those thrown to become one) carry `extensions`: the resolver's definite answer, like a 4xx. */
function isGraphQLError(error: unknown): boolean {
  return error instanceof Error && typeof (error as { extensions?: unknown }).extensions === 'object';
}

function storedError(error: unknown): StoredError {
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
