import type { ServerResponse } from 'node:http';
import type { StoredResponse } from '../core/idempotency-store.js';
import { ResponseNotSentError, ResponseTooLargeError } from './capture-errors.js';
import { hasBody, sendOnResponse, type Replacement } from './replacement.js';
import type { CaptureSettings, ExtraHeaders, ResponseCapture } from './response-capture.js';
import { headerEntries } from './write-head-headers.js';

type Call = unknown[];
const WIRE_METHODS = ['writeHead', 'write', 'end'] as const;

/**
 * Holds a response by wrapping `writeHead`, `write` and `end` on Node's `ServerResponse`: after the app's filters,
 * before the middleware that wrapped them earlier (`compression`, the session's cookie). Fastify: `FastifyReplyCapture`.
 */
export class WireCapture implements ResponseCapture {
  private readonly original: Partial<Record<(typeof WIRE_METHODS)[number], unknown>> = {};
  private readonly stored: ReadonlySet<string>;
  private writeHeadCall?: Call;
  private writes: Call[] = [];
  private heldBytes = 0;
  private endCall?: Call;
  private replacement?: Replacement;
  private settled = false;
  private listeners: Array<() => void> = [];
  refusal?: Error;

  constructor(
    private readonly res: ServerResponse,
    private readonly settings: CaptureSettings,
  ) {
    this.stored = storedHeaderNames(settings.replayHeaders);
    for (const name of WIRE_METHODS) this.original[name] = res[name];
    // Once the app has ended the response, what comes later changes nothing of it, as on Node's own response: Nest's
    // reply after a handler that wrote it (`@Res({ passthrough: true })`), or Fastify's, which cannot see a held end.
    res.writeHead = ((...args: Call) => {
      if (!this.endCall) this.writeHeadCall = args;
      return res;
    }) as ServerResponse['writeHead'];
    res.write = ((...args: Call) => {
      if (this.endCall) return false;
      this.hold(args, false);
      const callback = args.find((arg) => typeof arg === 'function') as (() => void) | undefined;
      if (callback) process.nextTick(callback);
      return true;
    }) as ServerResponse['write'];
    res.end = ((...args: Call) => {
      if (this.endCall) return res;
      this.hold(args, true);
      if (this.replacement) this.send(this.replacement);
      else this.notify();
      return res;
    }) as ServerResponse['end'];
  }

  /** A FastifyReplyCapture waits here too, as `capture`, with its `response`: this capture is its guard (see its `sent`). */
  sent(timeoutMs: number, capture: ResponseCapture = this, response = () => this.snapshot()): Promise<StoredResponse> {
    return new Promise((resolve, reject) => {
      let waiting = true;
      // Still held after the wait: released, the app's late end would tell the client of work that never committed.
      const timer = setTimeout(() => {
        waiting = false;
        reject(new ResponseNotSentError(timeoutMs));
      }, timeoutMs);
      this.onceSent(() => {
        if (!waiting) return;
        clearTimeout(timer);
        if (capture.refusal) reject(capture.refusal);
        else resolve(response());
      });
    });
  }

  /** Calls `listener` once the application has ended the response, or it was refused (see `sent`). */
  onceSent(listener: () => void): void {
    if (this.endCall || this.refusal) listener();
    else this.listeners.push(listener);
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

  /** Keeps a call of `write` or `end`, counting its bytes; past the limit the response is refused, nothing more kept. */
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

  notify(): void {
    const listeners = this.listeners;
    this.listeners = [];
    for (const listener of listeners) listener();
  }

  private send(replacement: Replacement): void {
    if (this.settled) return;
    this.settled = true;
    this.restore();
    sendOnResponse(this.res, this.writeHeadCall, this.stored, replacement);
  }

  /** The held response: status, the stored headers as they stand, and the body bytes (once sent, not refused). */
  snapshot(): StoredResponse {
    const status = typeof this.writeHeadCall?.[0] === 'number' ? this.writeHeadCall[0] : this.res.statusCode;
    // Names as the app spelled them, in the order it set them; those given to writeHead win, in place, as Node merges.
    const values = this.res.getHeaders();
    const all = new Map<string, [string, unknown]>();
    // Node's OutgoingMessage has it (since 15.13); its types declare it on ClientRequest only.
    const names = (this.res as unknown as { getRawHeaderNames(): string[] }).getRawHeaderNames();
    for (const name of names) all.set(name.toLowerCase(), [name, values[name.toLowerCase()]]);
    if (this.writeHeadCall) for (const [lower, entry] of headerEntries(this.writeHeadCall)) all.set(lower, entry);
    const chunks = [...this.writes, ...(this.endCall ? [this.endCall] : [])]
      .map((call) => toBuffer(call[0], call[1]))
      .filter((chunk): chunk is Buffer => chunk !== undefined);
    // One chunk (Express's `send` makes one Buffer) is kept as it is, not copied: Node holds the same bytes anyway.
    const body = chunks.length === 0 ? null : chunks.length === 1 ? chunks[0] : Buffer.concat(chunks);
    return {
      status,
      headers: storedPairs(all.values(), withLength(this.stored)),
      body: body && body.length === 0 && !hasBody(status) ? null : body,
    };
  }

  private restore(): void {
    const res = this.res as unknown as Record<string, unknown>;
    // Assigned back, never deleted: deleting a property other than the last one added turns the response into a
    // dictionary-mode object, and slows every later property read of Node's http code on it.
    for (const name of WIRE_METHODS) res[name] = this.original[name];
  }
}

/**
 * The body's own headers: always stored, and removed from the answer a replacement goes out in. `Content-Encoding`
 * too: the capture sits before compression, so one set by then is on bytes the app encoded itself.
 */
const BODY_HEADERS = ['content-type', 'content-encoding', 'etag', 'location', 'content-location'] as const;
const storedNamesOf = new WeakMap<ReadonlySet<string>, ReadonlySet<string>>();

/** The lower-case names of the headers a capture stores, made once per allowlist (the module's resolved option). */
export function storedHeaderNames(replayHeaders: ReadonlySet<string>): ReadonlySet<string> {
  let names = storedNamesOf.get(replayHeaders);
  if (!names) {
    names = new Set<string>([...BODY_HEADERS, ...replayHeaders]);
    storedNamesOf.set(replayHeaders, names);
  }
  return names;
}

/** The stored headers as name/value pairs, one per value (never joined), in the case and order sent; names in any case. */
export function storedPairs(headers: Iterable<[string, unknown]>, stored: ReadonlySet<string>): Array<[string, string]> {
  const pairs: Array<[string, string]> = [];
  for (const [name, value] of headers) {
    if (!stored.has(name.toLowerCase()) || value === undefined || value === null) continue;
    for (const one of Array.isArray(value) ? value : [value]) {
      const text = String(one);
      if (text !== '') pairs.push([name, text]);
    }
  }
  return pairs;
}

/** The stored names and `Content-Length`, whose place a replay keeps (with the length sent then), once per allowlist. */
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
  if (typeof chunk === 'string') return Buffer.from(chunk, typeof encoding === 'string' ? (encoding as BufferEncoding) : 'utf8');
  if (chunk instanceof Uint8Array) return Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
  return undefined;
}
