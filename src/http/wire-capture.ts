import type { ServerResponse } from 'node:http';
import type { StoredResponse } from '../core/idempotency-store.js';
import { sendOnResponse, type Replacement } from './replacement.js';
import { headerEntries } from './write-head-headers.js';
import {
  hasBody,
  ResponseNotSentError,
  storedHeaderNames,
  storedPairs,
  type CaptureSettings,
  type ExtraHeaders,
  type ResponseCapture,
} from './response-capture.js';
import { ResponseTooLargeError } from './unreplayable.js';

type Call = unknown[];
type WireMethods = Pick<ServerResponse, 'writeHead' | 'write' | 'end'>;
const WIRE_METHODS = ['writeHead', 'write', 'end'] as const;

/**
 * Holds one HTTP response at the point where the application writes it to
 * Node's `ServerResponse` (Express's response): after every interceptor,
 * serializer and exception filter, and before the app's middleware that
 * wrapped `write`/`end` earlier in the request (`compression`, a digest, the
 * session's cookie on `writeHead`). Released or replaced, the bytes go
 * through that middleware as any other answer does, so each answer is
 * encoded for its own request and carries the app's cookies.
 *
 * It wraps `writeHead`, `write` and `end` on that one object. Under Fastify
 * it only guards `reply.raw` (see `FastifyReplyCapture`).
 */
export class WireCapture implements ResponseCapture {
  private readonly original: Partial<Record<keyof WireMethods, unknown>> = {};
  private readonly stored: ReadonlySet<string>;
  private writeHeadCall?: Call;
  private writes: Call[] = [];
  private heldBytes = 0;
  private endCall?: Call;
  private replacement?: Replacement;
  private settled = false;
  private listeners: Array<() => void> = [];
  refusal?: Error;

  private constructor(
    private readonly res: ServerResponse,
    private readonly settings: CaptureSettings,
  ) {
    this.stored = storedHeaderNames(settings.replayHeaders);
    for (const name of WIRE_METHODS) this.original[name] = res[name];
    res.writeHead = ((...args: Call) => {
      this.writeHeadCall = args;
      return res;
    }) as ServerResponse['writeHead'];
    res.write = ((...args: Call) => {
      this.hold(args, false);
      const callback = args.find((arg) => typeof arg === 'function') as (() => void) | undefined;
      if (callback) process.nextTick(callback);
      return true;
    }) as ServerResponse['write'];
    res.end = ((...args: Call) => {
      this.hold(args, true);
      if (this.replacement) this.send(this.replacement);
      else this.notify();
      return res;
    }) as ServerResponse['end'];
  }

  /** Starts holding `res`. */
  static attach(res: ServerResponse, settings: CaptureSettings): WireCapture {
    return new WireCapture(res, settings);
  }

  sent(timeoutMs: number): Promise<StoredResponse> {
    if (this.refusal) return Promise.reject(this.refusal);
    if (this.endCall) return Promise.resolve(this.snapshot());
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.listeners = [];
        this.release();
        reject(new ResponseNotSentError(timeoutMs));
      }, timeoutMs);
      this.onceSent(() => {
        clearTimeout(timer);
        if (this.refusal) reject(this.refusal);
        else resolve(this.snapshot());
      });
    });
  }

  /** Calls `listener` once the application has ended the response, or it was refused (see `sent`). */
  onceSent(listener: () => void): void {
    if (this.endCall || this.refusal) listener();
    else this.listeners.push(listener);
  }

  /** The held response as the application sent it, once it has; undefined before, or when it was refused. */
  heldResponse(): StoredResponse | undefined {
    return this.endCall && !this.refusal ? this.snapshot() : undefined;
  }

  release(): void {
    if (this.settled) return;
    this.settled = true;
    this.restore();
    // A refused response was dropped as it came: the interceptor replaces it with a problem instead of releasing it.
    if (this.writeHeadCall) (this.res.writeHead as (...args: Call) => unknown)(...this.writeHeadCall);
    for (const call of this.writes) (this.res.write as (...args: Call) => unknown)(...call);
    if (this.endCall) (this.res.end as (...args: Call) => unknown)(...this.endCall);
  }

  replace(response: StoredResponse, headers: ExtraHeaders = []): void {
    if (this.settled) return;
    this.replacement = { response, headers };
    if (this.endCall) this.send(this.replacement);
  }

  /**
   * Keeps a call of `write` or `end`, counting its bytes; past the limit the
   * response is refused and nothing more of it is kept.
   */
  private hold(args: Call, end: boolean): void {
    const size = chunkLength(args[0], args[1]);
    if (!this.refusal && size > 0 && this.heldBytes + size > this.settings.maxBytes) {
      this.refusal = new ResponseTooLargeError(this.settings.maxBytes);
      this.writes = [];
      this.notify();
    }
    if (this.refusal) {
      if (end) this.endCall = [];
      return;
    }
    this.heldBytes += size;
    if (end) this.endCall = args;
    else this.writes.push(args);
  }

  private notify(): void {
    const listeners = this.listeners;
    this.listeners = [];
    for (const listener of listeners) listener();
  }

  private send(replacement: Replacement): void {
    if (this.settled) return;
    this.settled = true;
    this.restore();
    if (this.res.headersSent) {
      // Something flushed the head already; all that can be done is to end it.
      this.res.end();
      return;
    }
    sendOnResponse(this.res, headerEntries(this.writeHeadCall), this.stored, replacement);
  }

  /** The held response: status, the stored headers as they stand, and the body bytes. */
  private snapshot(): StoredResponse {
    const status = typeof this.writeHeadCall?.[0] === 'number' ? this.writeHeadCall[0] : this.res.statusCode;
    // The names as the app spelled them, in the order it set them. Headers given to writeHead win over those set
    // before, in their place, as Node merges them.
    const values = this.res.getHeaders();
    const all = new Map<string, [string, unknown]>();
    // Node's OutgoingMessage has it (since 15.13); its types declare it on ClientRequest only.
    const names = (this.res as unknown as { getRawHeaderNames(): string[] }).getRawHeaderNames();
    for (const name of names) all.set(name.toLowerCase(), [name, values[name.toLowerCase()]]);
    if (this.writeHeadCall) for (const [lower, entry] of headerEntries(this.writeHeadCall)) all.set(lower, entry);
    const chunks = [...this.writes, ...(this.endCall ? [this.endCall] : [])]
      .map((call) => toBuffer(call[0], call[1]))
      .filter((chunk): chunk is Buffer => chunk !== undefined);
    // One chunk (Express's `send` makes one Buffer of the whole body) is kept as it is, as the Fastify capture keeps
    // a Buffer payload: a copy of a 1 MiB body costs a fresh 1 MiB allocation, and Node itself holds on to the same
    // bytes until they are written.
    const body = chunks.length === 0 ? null : chunks.length === 1 ? chunks[0] : Buffer.concat(chunks);
    return {
      status,
      headers: storedPairs(all.values(), withLength(this.stored)),
      body: body && body.length === 0 && !hasBody(status) ? null : body,
    };
  }

  private restore(): void {
    const res = this.res as unknown as Record<string, unknown>;
    // Assigned back, never deleted: deleting a property other than the last one added (Express adds `statusCode`
    // after these) turns the response into a dictionary-mode object, and slows every later property read of
    // Node's http code on it.
    for (const name of WIRE_METHODS) res[name] = this.original[name];
  }
}

/**
 * The stored names and `Content-Length`, whose place among them a replay keeps (its value is the length of the body
 * sent then), made once per allowlist.
 */
const withLengthOf = new WeakMap<ReadonlySet<string>, ReadonlySet<string>>();
function withLength(stored: ReadonlySet<string>): ReadonlySet<string> {
  let names = withLengthOf.get(stored);
  if (!names) {
    names = new Set([...stored, 'content-length']);
    withLengthOf.set(stored, names);
  }
  return names;
}

function chunkLength(chunk: unknown, encoding: unknown): number {
  if (typeof chunk === 'string')
    return Buffer.byteLength(chunk, typeof encoding === 'string' ? (encoding as BufferEncoding) : 'utf8');
  if (chunk instanceof Uint8Array) return chunk.byteLength;
  return 0;
}

function toBuffer(chunk: unknown, encoding: unknown): Buffer | undefined {
  if (chunk === undefined || chunk === null || typeof chunk === 'function') return undefined;
  if (typeof chunk === 'string') return Buffer.from(chunk, typeof encoding === 'string' ? (encoding as BufferEncoding) : 'utf8');
  if (chunk instanceof Uint8Array) return Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
  return undefined;
}
