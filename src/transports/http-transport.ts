import type { Observable } from 'rxjs';
import { CommitRefusedError } from '../core/errors.js';
import { fingerprintRequest } from '../core/fingerprint.js';
import { parseIdempotencyKey } from '../core/key.js';
import type { FailureReading } from '../core/outcomes.js';
import type { EngineOutcome } from '../core/work.js';
import { problems } from '../errors/problems.js';
import { captureResponse } from '../http/capture.js';
import { fingerprintInput, headerValues, serverResponse, type HttpRequest } from '../http/request-identity.js';
import type { ResponseCapture } from '../http/response-capture.js';
import { describeUnreplayable, UnreplayableResponseError } from '../http/unreplayable.js';
import { REPLAYED_HEADER } from '../idempotency.constants.js';
import { FailedAfterHandlerError, failHttp, readHttpFailure, type HttpFailureScope } from './http-failures.js';
import { OnceSubscriber } from './once-subscriber.js';
import { NestTransport, type Done } from './run-idempotent.js';

/**
 * An HTTP route: the key from its header, the response taken where the
 * platform sends it (`captureResponse`: after every interceptor, serializer
 * and exception filter of the app, before content encoding), so what is
 * stored and replayed is what the client got, and let go only once its
 * outcome is committed.
 */
export class HttpTransport extends NestTransport {
  private readonly http = this.context.switchToHttp();
  private readonly request = this.http.getRequest<HttpRequest>();
  private readonly wire: ResponseCapture = captureResponse(this.http.getResponse(), {
    replayHeaders: this.runtime.options.replayHeaders,
    maxBytes: this.route.options.maxResponseBytes,
  });
  private readonly out = new OnceSubscriber(this.subscriber);

  readKey(): string | undefined {
    const values = headerValues(this.request, this.runtime.options.header);
    if (values.length === 0) return undefined;
    const parsed = parseIdempotencyKey(values, this.runtime.options.maxKeyLength);
    if (!parsed.ok) throw problems.invalidKey(parsed.reason, parsed.detail);
    return parsed.key;
  }

  fingerprint(): string {
    return fingerprintRequest(fingerprintInput(this.request, this.route.name));
  }

  async invoke(): Promise<Done<unknown>> {
    const value = await lastValueOf(this.next.handle());
    const unreplayable = describeUnreplayable(value);
    if (unreplayable) throw new UnreplayableResponseError(unreplayable);
    this.out.emit(value);
    const sent = await this.wire.sent(this.route.options.leaseMs);
    if (sent.status >= 400) throw new FailedAfterHandlerError(sent);
    return { response: sent, result: value };
  }

  readFailure(error: unknown): Promise<FailureReading> {
    return readHttpFailure(error, this.failureScope());
  }

  runWithoutKey(): void {
    this.wire.release();
    this.runtime.withoutIdempotency(() => this.next.handle()).subscribe(this.subscriber);
  }

  answer(outcome: EngineOutcome<unknown>): void {
    if (outcome.kind === 'replayed') {
      // Set now, so the app's outer interceptors can tell a replay from the response they are handed.
      serverResponse(this.http.getResponse()).setHeader(REPLAYED_HEADER, 'true');
      this.wire.replace(outcome.response, [[REPLAYED_HEADER, 'true']]);
      // Nest still runs the app's outer interceptors and sends; the wire swaps in the stored bytes.
      this.out.emit(undefined);
    } else if (outcome.kind === 'failure-stored' && outcome.error instanceof CommitRefusedError) {
      // What the wire holds is the success that never committed; the stored answer goes out instead.
      this.wire.replace(outcome.response);
    } else {
      this.wire.release();
    }
  }

  fail(error: unknown, key: string): void {
    failHttp(error, key, this.failureScope());
  }

  private failureScope(): HttpFailureScope {
    const { runtime, route, wire, out } = this;
    return { runtime, routeName: route.name, leaseMs: route.options.leaseMs, wire, out };
  }
}

/**
 * The handler's last value, or undefined when it completes with none: what
 * `lastValueFrom(source.pipe(defaultIfEmpty(undefined)))` gives, without an
 * operator chain built per request.
 */
export function lastValueOf(source: Observable<unknown>): Promise<unknown> {
  return new Promise((resolve, reject) => {
    let last: unknown;
    source.subscribe({ next: (value) => (last = value), error: reject, complete: () => resolve(last) });
  });
}
