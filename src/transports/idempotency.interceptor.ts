import { Injectable, Optional, type CallHandler, type ExecutionContext, type NestInterceptor, type Type } from '@nestjs/common';
import { Observable } from 'rxjs';
import { IdempotencyConfigurationError } from '../errors/configuration.error.js';
import { messages } from '../errors/messages.js';
import { IdempotentRoutes } from '../http/route-settings.js';
import { GraphQLTransport } from './graphql-transport.js';
import { HttpTransport } from './http-transport.js';
import { MessageTransport } from './message-transport.js';
import { IdempotencyRuntime, runIdempotent } from './run-idempotent.js';

/** Requests, deliveries and field resolutions seen: class- and method-level `@Idempotent()` both apply this interceptor. */
const handled = new WeakSet<object>();

/** The interceptor of every `@Idempotent()` handler: the route's settings, its context type's transport, `runIdempotent`. */
@Injectable()
export class IdempotencyInterceptor implements NestInterceptor {
  // Optional, so an app without IdempotencyModule.forRoot() gets a message that says so, not Nest's dependency error.
  constructor(
    @Optional() private readonly routes: IdempotentRoutes,
    @Optional() private readonly runtime: IdempotencyRuntime,
  ) {
    if (!routes || !runtime) throw new IdempotencyConfigurationError(messages.config.moduleNotImported);
  }

  intercept(context: ExecutionContext, next: CallHandler): Observable<unknown> {
    const type = context.getType<string>();
    const identity =
      type === 'http'
        ? context.switchToHttp().getRequest<object>()
        : type === 'rpc'
          ? context.switchToRpc().getContext<unknown>()
          : type === 'graphql'
            ? context.getArgByIndex<unknown>(3)
            : undefined;
    if (type !== 'http' && type !== 'rpc' && type !== 'graphql') return next.handle();
    if (identity !== null && typeof identity === 'object') {
      if (handled.has(identity)) return next.handle();
      handled.add(identity);
    }
    const route = this.routes.get(context.getClass<Type>(), context.getHandler() as (...args: unknown[]) => unknown);
    if (!route) return next.handle();
    const { runtime } = this;
    const Transport = type === 'http' ? HttpTransport : type === 'graphql' ? GraphQLTransport : MessageTransport;
    return new Observable((subscriber) => {
      const transport = new Transport(runtime, route, context, next, subscriber);
      // A bug on the path: the transport's own `unexpected`, else the app's filters log and answer it.
      runIdempotent(runtime, route, context, transport).catch((error: unknown) =>
        'unexpected' in transport ? transport.unexpected(error) : subscriber.error(error),
      );
    });
  }
}
