import { StreamableFile, type CallHandler, type ExecutionContext } from '@nestjs/common';
import type { HttpArgumentsHost } from '@nestjs/common/interfaces/index.js';
import type { Observable, Subscriber } from 'rxjs';
import { fingerprintRequest } from '../core/fingerprint.js';
import { parseIdempotencyKey } from '../core/key.js';
import type { FailureReading } from '../core/outcomes.js';
import type { EngineOutcome } from '../core/work.js';
import { problems } from '../errors/problems.js';
import { UnreplayableResponseError } from '../http/capture-errors.js';
import { FastifyReplyCapture, hasCaptureHook } from '../http/fastify-capture.js';
import type { HttpRequest } from '../http/platform-types.js';
import { fingerprintInput, headerValues, isFastifyReply, serverResponse } from '../http/request-identity.js';
import type { ResponseCapture } from '../http/response-capture.js';
import type { RouteSettings } from '../http/route-settings-type.js';
import { WireCapture } from '../http/wire-capture.js';
import { FailedAfterHandlerError, failHttp, readHttpFailure } from './http-failures.js';
import { answerStored } from './http-stored-answer.js';
import { OnceSubscriber } from './once-subscriber.js';
import type { IdempotencyRuntime } from './run-idempotent.js';
import type { Done, Transport } from './transport.js';
import { withoutIdempotency } from './without-idempotency.js';

/**
 * An HTTP route: the key from its header; the response held where the platform
 * sends it (see `ResponseCapture`), so what is stored is what the client got.
 */
export class HttpTransport implements Transport {
  private readonly http: HttpArgumentsHost;
  private readonly request: HttpRequest;
  readonly wire: ResponseCapture;
  readonly out: OnceSubscriber;

  constructor(
    readonly runtime: IdempotencyRuntime,
    readonly route: RouteSettings,
    context: ExecutionContext,
    private readonly next: CallHandler,
    private readonly subscriber: Subscriber<unknown>,
  ) {
    this.http = context.switchToHttp();
    this.request = this.http.getRequest<HttpRequest>();
    const response: unknown = this.http.getResponse();
    const settings = { replayHeaders: runtime.options.replayHeaders, maxBytes: route.options.maxResponseBytes };
    // Fastify: in its reply pipeline (before `@fastify/compress`); a Fastify instance without the module's hook, and
    // Express, at Node's response (before `compression`, which wraps it earlier).
    this.wire =
      isFastifyReply(response) && hasCaptureHook(response)
        ? new FastifyReplyCapture(response, settings)
        : new WireCapture(serverResponse(response), settings);
    this.out = new OnceSubscriber(subscriber);
  }

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
    return readHttpFailure(error, this);
  }

  runWithoutKey(): void {
    this.wire.release();
    withoutIdempotency(this.runtime, () => this.next.handle()).subscribe(this.subscriber);
  }

  answer(outcome: EngineOutcome<unknown>): void {
    if (outcome.kind === 'executed') this.wire.release();
    else answerStored(outcome, this.wire, this.out, this.http.getResponse());
  }

  fail(error: unknown, key: string): void {
    failHttp(error, key, this);
  }
}

/** The handler's last value, or undefined when it completes with none (`lastValueFrom` with a default, no operators). */
export function lastValueOf(source: Observable<unknown>): Promise<unknown> {
  return new Promise((resolve, reject) => {
    let last: unknown;
    source.subscribe({ next: (value) => (last = value), error: reject, complete: () => resolve(last) });
  });
}

/** What kind of unstorable value `value` is, or undefined when it can be stored once sent. */
function describeUnreplayable(value: unknown): string | undefined {
  if (value instanceof StreamableFile) return 'a StreamableFile';
  if (typeof Response !== 'undefined' && value instanceof Response) return 'a web Response';
  if (typeof ReadableStream !== 'undefined' && value instanceof ReadableStream) return 'a ReadableStream';
  if (typeof value === 'object' && value !== null) {
    if (typeof (value as { pipe?: unknown }).pipe === 'function') return 'a stream';
    if (Symbol.asyncIterator in value) return 'an async iterable';
  }
  if (typeof value === 'function') return 'a function';
  return undefined;
}
