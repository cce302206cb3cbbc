import { Injectable, type CallHandler, type ExecutionContext, type NestInterceptor, type Provider } from '@nestjs/common';
import { APP_INTERCEPTOR } from '@nestjs/core';
import type { ServerResponse } from 'node:http';
import type { Observable } from 'rxjs';

/** The environment switch; anything but `1` leaves the app without this hook. */
export const FAULT_INJECTION_ENV = 'SAMPLE_FAULT_INJECTION';
/** Request header naming the fault to inject. Headers are not fingerprinted: a retry without it is the same request. */
export const FAULT_HEADER = 'x-fault';
/** Kill the process after the idempotency module committed and stored the response, before it is sent. */
export const CRASH_AFTER_COMMIT = 'crash-after-commit';

/**
 * Test-only fault injection for the reliability suite (`test/reliability`);
 * never registered unless `SAMPLE_FAULT_INJECTION=1`.
 *
 * The idempotency module holds the response at the wire until the request
 * transaction has committed and the response is stored, then writes it out
 * through the response's `end`. This global interceptor runs before the
 * route's `@Idempotent()` interceptor, so the `end` it wraps here is the one
 * the module calls once everything is committed: killing the process with
 * SIGKILL there is a crash between the commit and the response leaving. The
 * client sees its connection drop, and its retry must replay rather than
 * charge again.
 */
@Injectable()
export class FaultInjectionInterceptor implements NestInterceptor {
  intercept(context: ExecutionContext, next: CallHandler): Observable<unknown> {
    if (context.getType() !== 'http') return next.handle();
    const http = context.switchToHttp();
    const headers = http.getRequest<{ headers: Record<string, string | string[] | undefined> }>().headers;
    if (headers[FAULT_HEADER] !== CRASH_AFTER_COMMIT) return next.handle();
    const reply = http.getResponse<ServerResponse | { raw: ServerResponse }>();
    const res = 'raw' in reply ? reply.raw : reply;
    res.end = (() => process.kill(process.pid, 'SIGKILL')) as unknown as ServerResponse['end'];
    return next.handle();
  }
}

/** The providers to add to the app module: the interceptor when the environment enables it, otherwise none. */
export function faultInjectionProviders(env: NodeJS.ProcessEnv = process.env): Provider[] {
  return env[FAULT_INJECTION_ENV] === '1' ? [{ provide: APP_INTERCEPTOR, useClass: FaultInjectionInterceptor }] : [];
}
