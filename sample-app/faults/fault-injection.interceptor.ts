import { Injectable, type CallHandler, type ExecutionContext, type NestInterceptor, type Provider } from '@nestjs/common';
import { APP_INTERCEPTOR } from '@nestjs/core';
import { tap, type Observable } from 'rxjs';

/** The environment switch; anything but `1` leaves the app without this hook. */
export const FAULT_INJECTION_ENV = 'SAMPLE_FAULT_INJECTION';
/** Request header naming the fault to inject. Headers are not fingerprinted: a retry without it is the same request. */
export const FAULT_HEADER = 'x-fault';
/** Kill the process after the idempotency module committed and stored the response, before Nest sends it. */
export const CRASH_AFTER_COMMIT = 'crash-after-commit';

/**
 * Test-only fault injection for the reliability suite (`test/reliability`);
 * never registered unless `SAMPLE_FAULT_INJECTION=1`.
 *
 * A global interceptor wraps outside the route's `@Idempotent()` interceptor,
 * whose value arrives only once the request transaction has committed and the
 * response is stored. Killing the process with SIGKILL at that moment is a
 * crash between the commit and the response leaving: the client sees its
 * connection drop, and its retry must replay rather than charge again.
 */
@Injectable()
export class FaultInjectionInterceptor implements NestInterceptor {
  intercept(context: ExecutionContext, next: CallHandler): Observable<unknown> {
    if (context.getType() !== 'http') return next.handle();
    const headers = context.switchToHttp().getRequest<{ headers: Record<string, string | string[] | undefined> }>().headers;
    if (headers[FAULT_HEADER] !== CRASH_AFTER_COMMIT) return next.handle();
    return next.handle().pipe(tap(() => process.kill(process.pid, 'SIGKILL')));
  }
}

/** The providers to add to the app module: the interceptor when the environment enables it, otherwise none. */
export function faultInjectionProviders(env: NodeJS.ProcessEnv = process.env): Provider[] {
  return env[FAULT_INJECTION_ENV] === '1' ? [{ provide: APP_INTERCEPTOR, useClass: FaultInjectionInterceptor }] : [];
}
