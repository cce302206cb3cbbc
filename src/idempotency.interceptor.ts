import {
  HttpException,
  Inject,
  Injectable,
  Logger,
  type CallHandler,
  type ExecutionContext,
  type NestInterceptor,
} from '@nestjs/common';
import { REDIRECT_METADATA, RESPONSE_PASSTHROUGH_METADATA, ROUTE_ARGS_METADATA, SSE_METADATA } from '@nestjs/common/constants.js';
import { RouteParamtypes } from '@nestjs/common/enums/route-paramtypes.enum.js';
import { HttpAdapterHost, Reflector } from '@nestjs/core';
import { defaultIfEmpty, lastValueFrom, of, type Observable } from 'rxjs';
import type { FailureDecision } from './core/idempotency-engine.js';
import { FingerprintMismatchError, KeyInFlightError, LeaseLostError, StoreUnavailableError } from './core/errors.js';
import { fingerprintRequest, fingerprintValue } from './core/fingerprint.js';
import { parseIdempotencyKey, redactKey } from './core/key.js';
import { messages } from './errors/messages.js';
import { IdempotencyProblemException, PROBLEM_CONTENT_TYPE, problems } from './errors/problems.js';
import { encodeBody, toWireValue, UnreplayableResponseError } from './http/response-codec.js';
import {
  IDEMPOTENCY_OPTIONS,
  IDEMPOTENT_METADATA,
  NEVER_REPLAYED_HEADERS,
  REPLAYED_HEADER,
  SKIP_IDEMPOTENCY_METADATA,
} from './idempotency.constants.js';
import {
  resolveRouteOptions,
  type FailurePolicy,
  type IdempotencyRouteOptions,
  type ResolvedIdempotencyOptions,
  type ResolvedRouteOptions,
} from './idempotency.options.js';
import { IdempotencyService } from './idempotency.service.js';
import type { StoredResponse } from './store/idempotency-store.js';
import type { IdempotencyExecutionContext } from './transaction/idempotency-context.js';

type HttpRequest = {
  method: string;
  url: string;
  originalUrl?: string;
  body?: unknown;
  rawHeaders?: string[];
  raw?: { rawHeaders?: string[] };
};
type HttpResponse = { statusCode: number };

/** Requests already handled by an instance of this interceptor (class- and method-level `@Idempotent()` both apply it). */
const handledRequests = new WeakSet<object>();

/**
 * The thin HTTP adapter over the engine: reads the key, tenant and
 * fingerprint, hands the handler to `IdempotencyService.run`, and turns the
 * outcome into a response. All decisions about the key live in the engine.
 */
@Injectable()
export class IdempotencyInterceptor implements NestInterceptor {
  private readonly logger = new Logger('Idempotency');
  private readonly routes = new WeakMap<object, RouteSettings | null>();

  constructor(
    private readonly reflector: Reflector,
    private readonly service: IdempotencyService,
    private readonly adapterHost: HttpAdapterHost,
    @Inject(IDEMPOTENCY_OPTIONS) private readonly options: ResolvedIdempotencyOptions,
  ) {}

  async intercept(context: ExecutionContext, next: CallHandler): Promise<Observable<unknown>> {
    const http = context.switchToHttp();
    const request = http.getRequest<HttpRequest>();
    if (context.getType() !== 'http' || handledRequests.has(request)) return next.handle();
    handledRequests.add(request);

    const route = this.routeSettings(context);
    if (!route) return next.handle();
    const response = http.getResponse<HttpResponse>();

    const values = headerValues(request, this.options.header);
    if (values.length === 0) {
      if (route.options.required) this.fail(response, problems.missingKey(this.options.header));
      return this.service.runWithoutIdempotency(() => next.handle());
    }
    const parsed = parseIdempotencyKey(values, this.options.maxKeyLength);
    if (!parsed.ok) this.fail(response, problems.invalidKey(parsed.reason, parsed.detail));
    const key = parsed.key;

    if (route.unreplayable) this.fail(response, problems.unreplayable(route.unreplayable));
    const tenant = await this.resolveTenant(context, response, route.name);

    const execution = this.service.createContext();
    try {
      const scope = {
        tenant,
        key,
        fingerprint: this.fingerprint(context, request, route.options),
        leaseMs: route.options.leaseMs,
        ttlMs: route.options.ttlMs,
        onFailure: (error: unknown) => this.classify(error, execution, route.options, response),
      };
      const handle = async () => {
        const value = await lastValueFrom(next.handle().pipe(defaultIfEmpty(undefined)));
        return { response: this.capture(response, value, route), result: value };
      };
      const outcome = route.options.phases
        ? await this.service.runPhased({ ...scope, run: handle }, execution)
        : await this.service.run({ ...scope, run: handle }, execution);
      if (outcome.kind === 'replayed') this.adapter.setHeader(response, REPLAYED_HEADER, 'true');
      return of(this.send(response, outcome.response, route));
    } catch (error) {
      return this.failFor(response, error, route.name, key);
    }
  }

  /**
   * The tenant, or a problem 500 that fails closed. An `HttpException` from
   * the resolver (e.g. a 401 for a missing principal) is the resolver's
   * answer and goes out as it is.
   */
  private async resolveTenant(context: ExecutionContext, response: HttpResponse, routeName: string): Promise<string> {
    let tenant: string | null | undefined;
    try {
      tenant = await this.options.tenant(context);
    } catch (error) {
      if (error instanceof HttpException) throw error;
      this.logger.error(messages.log.tenantFailed(routeName), error instanceof Error ? error.stack : String(error));
      this.fail(response, problems.tenantUnresolved());
    }
    if (typeof tenant !== 'string' || tenant === '') {
      this.logger.error(messages.log.tenantUnresolved(routeName));
      this.fail(response, problems.tenantUnresolved());
    }
    return tenant;
  }

  private get adapter() {
    return this.adapterHost.httpAdapter;
  }

  private get platform(): string {
    return this.adapter.getType();
  }

  /** Maps an engine outcome that is not a response to a problem answer; anything else goes to Nest's exception layer. */
  private failFor(response: HttpResponse, error: unknown, routeName: string, key: string): never {
    if (error instanceof KeyInFlightError) this.fail(response, problems.conflict(error.retryAfterSeconds));
    if (error instanceof FingerprintMismatchError) this.fail(response, problems.mismatch());
    if (error instanceof LeaseLostError) {
      this.logger.warn(messages.log.leaseLost(routeName, redactKey(key)));
      this.fail(response, problems.leaseLost());
    }
    if (error instanceof StoreUnavailableError) {
      this.logger.error(messages.log.unavailable(routeName));
      this.fail(response, problems.unavailable(this.options.unavailableRetryAfter, error.cause, error.outcome));
    }
    if (error instanceof UnreplayableResponseError) {
      this.logger.error(messages.config.unreplayableRoute(routeName, error.message));
      this.fail(response, problems.unreplayable(error));
    }
    throw error;
  }

  private fail(response: HttpResponse, problem: IdempotencyProblemException): never {
    this.adapter.setHeader(response, 'Content-Type', PROBLEM_CONTENT_TYPE);
    if (problem.retryAfterSeconds !== undefined)
      this.adapter.setHeader(response, 'Retry-After', String(problem.retryAfterSeconds));
    throw problem;
  }

  private fingerprint(context: ExecutionContext, request: HttpRequest, options: ResolvedRouteOptions): string {
    if (options.fingerprint) return fingerprintValue(options.fingerprint(context));
    return fingerprintRequest({ method: request.method, path: request.originalUrl ?? request.url, body: request.body });
  }

  /** Decides what a failure of the handler means for the key (CONTRACT A4.9). */
  private classify(
    error: unknown,
    execution: IdempotencyExecutionContext,
    options: ResolvedRouteOptions,
    response: HttpResponse,
  ): FailureDecision {
    // Nothing ran: a pipe rejected the request, or the response could not be stored.
    if (!execution.handlerStarted || error instanceof UnreplayableResponseError) return { action: 'release' };
    if (error instanceof HttpException) {
      return this.decide(options.onHttpException, () => {
        const body = error.getResponse();
        // The same body Nest's default exception filter would send.
        return this.storedFrom(
          response,
          error.getStatus(),
          typeof body === 'object' ? body : { statusCode: error.getStatus(), message: body },
        );
      });
    }
    return this.decide(options.onError, () =>
      this.storedFrom(response, 500, { statusCode: 500, message: 'Internal server error' }),
    );
  }

  private decide(policy: FailurePolicy, render: () => StoredResponse): FailureDecision {
    if (policy === 'store') return { action: 'store', response: render() };
    return { action: policy };
  }

  /** Captures the handler's response: status and allowlisted headers as now set, body as the bytes to be sent. */
  private capture(response: HttpResponse, value: unknown, route: RouteSettings): StoredResponse {
    if (route.redirect) {
      // Nest sends the redirect after the interceptors; record what it will send.
      const result = (value ?? {}) as { url?: string; statusCode?: number };
      const status = result.statusCode ?? route.redirect.statusCode ?? 302;
      return { status, headers: [['location', result.url ?? route.redirect.url]], body: null };
    }
    return this.storedFrom(response, response.statusCode, value);
  }

  private storedFrom(response: HttpResponse, status: number, value: unknown): StoredResponse {
    const presetType = this.adapter.getHeader(response, 'content-type') as string | undefined;
    const { body, contentType } = encodeBody(value, this.platform, presetType || undefined);
    const headers: Array<[string, string]> = [];
    for (const name of this.options.replayHeaders) {
      if (name === 'content-type') continue;
      const current: unknown = this.adapter.getHeader(response, name);
      if (current === undefined || current === null || current === '') continue;
      headers.push([name, Array.isArray(current) ? current.join(', ') : String(current)]);
    }
    if (contentType) headers.unshift(['content-type', contentType]);
    return { status, headers, body };
  }

  /** Applies a stored response and returns the value Nest should send; the original goes through here too. */
  private send(response: HttpResponse, stored: StoredResponse, route: RouteSettings): unknown {
    if (route.redirect) {
      const location = stored.headers.find(([name]) => name === 'location')?.[1];
      return { url: location ?? route.redirect.url, statusCode: stored.status };
    }
    this.adapter.status(response, stored.status);
    for (const [name, value] of stored.headers) {
      if (!NEVER_REPLAYED_HEADERS.has(name)) this.adapter.setHeader(response, name, value);
    }
    return toWireValue(stored, this.platform);
  }

  /** Options and static facts of a route, worked out on its first request. `null` when idempotency is off. */
  private routeSettings(context: ExecutionContext): RouteSettings | null {
    const handler = context.getHandler();
    let settings = this.routes.get(handler);
    if (settings !== undefined) return settings;
    const targets = [handler, context.getClass()];
    const skipped = this.reflector.getAllAndOverride<boolean | undefined>(SKIP_IDEMPOTENCY_METADATA, targets);
    const raw = this.reflector.getAllAndOverride<IdempotencyRouteOptions | undefined>(IDEMPOTENT_METADATA, targets);
    const name = `${context.getClass().name}.${handler.name}`;
    if (skipped || !raw) {
      settings = null;
    } else {
      const redirect = this.reflector.get<{ url: string; statusCode?: number } | undefined>(REDIRECT_METADATA, handler);
      settings = {
        name,
        options: resolveRouteOptions(raw, this.options, `@Idempotent() on ${name}`),
        redirect,
        unreplayable: unreplayableReason(context),
      };
      if (settings.unreplayable) {
        this.logger.error(messages.config.unreplayableRoute(name, settings.unreplayable));
      }
    }
    this.routes.set(handler, settings);
    return settings;
  }
}

interface RouteSettings {
  name: string;
  options: ResolvedRouteOptions;
  redirect?: { url: string; statusCode?: number };
  /** Why the route can never be replayed; such a route answers 500 without claiming the key. */
  unreplayable?: string;
}

function unreplayableReason(context: ExecutionContext): string | undefined {
  const handler = context.getHandler();
  if (Reflect.getMetadata(SSE_METADATA, handler)) return 'it is a server-sent events stream';
  // The same test Nest applies to decide that the handler sends the response itself.
  const args = (Reflect.getMetadata(ROUTE_ARGS_METADATA, context.getClass(), handler.name) ?? {}) as Record<string, unknown>;
  const writesItself = Object.keys(args).some((key) => {
    const type = Number(key.split(':')[0]);
    return type === RouteParamtypes.RESPONSE || type === RouteParamtypes.NEXT;
  });
  if (writesItself && !Reflect.getMetadata(RESPONSE_PASSTHROUGH_METADATA, context.getClass(), handler.name)) {
    return 'it writes the response itself through @Res() or @Next()';
  }
  return undefined;
}

/** Every occurrence of the header, so a header sent twice is not silently joined into one value. */
function headerValues(request: HttpRequest, header: string): string[] {
  const raw = request.rawHeaders ?? request.raw?.rawHeaders ?? [];
  const wanted = header.toLowerCase();
  const values: string[] = [];
  for (let i = 0; i < raw.length; i += 2) {
    if (raw[i].toLowerCase() === wanted) values.push(raw[i + 1]);
  }
  return values;
}
