import { randomUUID } from 'node:crypto';
import {
  Catch,
  HttpException,
  Injectable,
  SetMetadata,
  type ArgumentsHost,
  type CallHandler,
  type ExceptionFilter,
  type ExecutionContext,
  type NestInterceptor,
} from '@nestjs/common';
import { HttpAdapterHost, Reflector } from '@nestjs/core';
import { map, type Observable } from 'rxjs';

const UNWRAPPED = 'real-app:unwrapped';

/** Opts a route out of the `{ data }` envelope, as apps do for plain-text or file routes. */
export const Unwrapped = () => SetMetadata(UNWRAPPED, true);

/**
 * The response envelope most API style guides ask for: every result becomes
 * `{ data: result }`, and every response carries a fresh `X-Request-Id`, set
 * before the handler runs as request-id middleware would.
 */
@Injectable()
export class EnvelopeInterceptor implements NestInterceptor {
  constructor(
    private readonly reflector: Reflector,
    private readonly adapterHost: HttpAdapterHost,
  ) {}

  intercept(context: ExecutionContext, next: CallHandler): Observable<unknown> {
    this.adapterHost.httpAdapter.setHeader(context.switchToHttp().getResponse(), 'X-Request-Id', randomUUID());
    if (this.reflector.get<boolean | undefined>(UNWRAPPED, context.getHandler())) return next.handle();
    return next.handle().pipe(map((data: unknown) => ({ data })));
  }
}

/** The app's own error shape, for every error: `{ error: { status, message }, path }`. Unknown errors say nothing more. */
@Catch()
export class ErrorEnvelopeFilter implements ExceptionFilter {
  constructor(private readonly adapterHost: HttpAdapterHost) {}

  catch(exception: unknown, host: ArgumentsHost): void {
    const { httpAdapter } = this.adapterHost;
    const http = host.switchToHttp();
    const status = exception instanceof HttpException ? exception.getStatus() : 500;
    const message = exception instanceof HttpException ? messageOf(exception) : 'Internal server error';
    httpAdapter.reply(
      http.getResponse(),
      { error: { status, message }, path: httpAdapter.getRequestUrl(http.getRequest()) },
      status,
    );
  }
}

function messageOf(exception: HttpException): string | string[] {
  const body = exception.getResponse();
  if (typeof body === 'string') return body;
  const message = (body as { message?: unknown }).message;
  return typeof message === 'string' || Array.isArray(message) ? (message as string[]) : exception.message;
}
