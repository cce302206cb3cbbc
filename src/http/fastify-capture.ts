import type { StoredResponse } from '../core/idempotency-store.js';
import { ResponseTooLargeError, UnreplayableResponseError } from './capture-errors.js';
import type { FastifyReplyLike } from './platform-types.js';
import { applyToReply, hasBody, type Replacement } from './replacement.js';
import type { CaptureSettings, ExtraHeaders, ResponseCapture } from './response-capture.js';
import { storedHeaderNames, storedPairs, WireCapture } from './wire-capture.js';

export type OnSendDone = (error: Error | null, payload?: unknown) => void;

/** The capture of each reply in flight, found by the onSend hook. */
const captures = new WeakMap<object, FastifyReplyCapture>();
/** Fastify instances the hook was added to; their child instances inherit it (and have them as prototypes). */
export const hooked = new WeakSet<object>();

/** Whether the replies of `reply`'s Fastify instance go through the capture hook. */
export function hasCaptureHook(reply: FastifyReplyLike): boolean {
  for (let server: object | null = reply.server; server; server = Object.getPrototypeOf(server) as object | null) {
    if (hooked.has(server)) return true;
  }
  return false;
}

/**
 * The module's `onSend` hook, where a held reply waits for its key's outcome. `@fastify/compress` adds its own per
 * route, after all of them: this one sees the body before any encoding, and what it lets through (the app's payload
 * or a stored one) goes through the later hooks (compression, a digest, cookies) like any other answer.
 */
export function captureOnSend(_request: unknown, reply: object, payload: unknown, done: OnSendDone): void {
  const capture = captures.get(reply);
  if (capture) capture.onSend(payload, done);
  else done(null, payload);
}

/**
 * Holds a Fastify reply at `onSend`: the payload serialized, not encoded; a `Set-Cookie` array still one header per
 * cookie. A replacement (a replay, a problem) goes in at `reply.send`, so every `onSend` hook of the app sees the
 * bytes sent; one after the app has sent, by the hook. What the app writes to `reply.raw` a `WireCapture` holds.
 */
export class FastifyReplyCapture implements ResponseCapture {
  private readonly stored: ReadonlySet<string>;
  private readonly guard: WireCapture;
  private readonly ownSend?: PropertyDescriptor;
  private readonly inheritedSend: FastifyReplyLike['send'];
  private held?: { payload: unknown; done: OnSendDone; response?: StoredResponse };
  private ownRefusal?: Error;
  private replacement?: Replacement;
  /** The app wrote `reply.raw` itself: the guard holds that response. */
  private viaRaw = false;
  private settled = false;

  constructor(
    private readonly reply: FastifyReplyLike,
    private readonly settings: CaptureSettings,
  ) {
    this.stored = storedHeaderNames(settings.replayHeaders);
    this.guard = new WireCapture(reply.raw, settings);
    // Called before this capture's own waiters (see `sent`): a reply not held by then was answered at reply.raw.
    this.guard.onceSent(() => {
      if (!this.held && !this.settled) this.viaRaw = true;
    });
    captures.set(reply, this);
    this.ownSend = Object.getOwnPropertyDescriptor(reply, 'send');
    const send = reply.send;
    this.inheritedSend = send;
    reply.send = (payload?: unknown) => this.onReplySend(send, payload);
  }

  get refusal(): Error | undefined {
    return this.viaRaw ? this.guard.refusal : this.ownRefusal;
  }

  /** Waits among the guard's listeners: it calls them once reply.raw is ended, the hook once it holds the payload. */
  sent(timeoutMs: number): Promise<StoredResponse> {
    if (this.held) return this.refusal ? Promise.reject(this.refusal) : Promise.resolve(this.held.response!);
    return this.guard.sent(timeoutMs, this, () => (this.viaRaw ? this.guard.snapshot() : this.held!.response!));
  }

  release(): void {
    if (this.settled) return;
    const held = this.held;
    this.settle(true);
    held?.done(null, held.payload);
  }

  replace(response: StoredResponse, headers: ExtraHeaders = []): void {
    if (this.settled) return;
    if (this.viaRaw) {
      this.settle(false);
      this.guard.replace(response, headers);
      return;
    }
    this.replacement = { response, headers };
    if (this.held) this.answerHook(this.held.done, this.replacement);
    // Should the app end reply.raw itself instead of sending, the guard answers there.
    else this.guard.replace(response, headers);
  }

  /** Nest sends: a replacement waiting for it goes in its place, before any hook runs. */
  private onReplySend(send: (payload?: unknown) => unknown, payload: unknown): unknown {
    const replacement = this.replacement;
    if (!replacement || this.settled) return send.call(this.reply, payload);
    this.settle(true);
    return send.call(this.reply, applyToReply(this.reply, this.stored, replacement));
  }

  /** The hook's turn: hold the payload (or let it by once the capture has settled). */
  onSend(payload: unknown, done: OnSendDone): void {
    if (this.settled || this.held || this.viaRaw) return done(null, payload);
    if (this.replacement) return this.answerHook(done, this.replacement);
    this.held = { payload, done, response: this.snapshot(payload) };
    this.guard.notify();
  }

  /** The hook goes on with `replacement`'s body in place of the app's payload. */
  private answerHook(done: OnSendDone, replacement: Replacement): void {
    this.settle(true);
    done(null, applyToReply(this.reply, this.stored, replacement) ?? null);
  }

  /** The reply as it stands with `payload` as its body, or undefined (and a refusal) when it cannot be stored. */
  private snapshot(payload: unknown): StoredResponse | undefined {
    let body: Buffer | null;
    if (payload === undefined || payload === null) body = null;
    else if (typeof payload === 'string') {
      if (Buffer.byteLength(payload, 'utf8') > this.settings.maxBytes)
        return this.refuse(new ResponseTooLargeError(this.settings.maxBytes));
      body = Buffer.from(payload, 'utf8');
    } else if (payload instanceof Uint8Array) {
      if (payload.byteLength > this.settings.maxBytes) return this.refuse(new ResponseTooLargeError(this.settings.maxBytes));
      body = Buffer.from(payload.buffer, payload.byteOffset, payload.byteLength);
    } else {
      // A stream, or a web Response: something between the handler and Fastify made one.
      return this.refuse(new UnreplayableResponseError('a stream'));
    }
    const status = this.reply.statusCode;
    return {
      status,
      headers: storedPairs(Object.entries(this.reply.getHeaders()), this.stored),
      body: body && body.length === 0 && !hasBody(status) ? null : body,
    };
  }

  private refuse(error: Error): undefined {
    this.ownRefusal = error;
    return undefined;
  }

  private settle(releaseGuard: boolean): void {
    this.settled = true;
    captures.delete(this.reply);
    // Assigned back, not deleted: deleting turns the reply into a dictionary-mode object (slower property reads).
    if (this.ownSend) Object.defineProperty(this.reply, 'send', this.ownSend);
    else this.reply.send = this.inheritedSend;
    // Releasing the guard lets out what the app wrote to reply.raw; when it wrote nothing, only unwraps it, for Fastify.
    if (releaseGuard) this.guard.release();
  }
}
