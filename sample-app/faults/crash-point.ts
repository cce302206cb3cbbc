import { FAULT_HEADER, FAULT_INJECTION_ENV } from './fault-injection.interceptor.js';

/**
 * Test-only: kills the process with SIGKILL at a named point of a handler
 * when the request carries `X-Fault: crash-after:<point>` and the app runs
 * with SAMPLE_FAULT_INJECTION=1; does nothing otherwise. The reliability
 * suite uses it to crash a checkout between two of its phases.
 */
export function crashIfRequested(headers: Record<string, string | string[] | undefined>, point: string): void {
  if (process.env[FAULT_INJECTION_ENV] !== '1') return;
  if (headers[FAULT_HEADER] === `crash-after:${point}`) process.kill(process.pid, 'SIGKILL');
}
