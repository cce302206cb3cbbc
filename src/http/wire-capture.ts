import type { OutgoingHttpHeaders, ServerResponse } from 'node:http';
import type { StoredResponse } from '../core/idempotency-store.js';

/** Raised when the application has not sent a response within the time the capture waits for one. */
export class ResponseNotSentError extends Error {
  constructor(waitedMs: number) {
    super(`The application sent no response within ${waitedMs} ms of the handler finishing.`);
    this.name = 'ResponseNotSentError';
  }
}

type Call = unknown[];
type WireMethods = Pick<ServerResponse, 'writeHead' | 'write' | 'end'>;
const WIRE_METHODS = ['writeHead', 'write', 'end'] as const;

/**
 * Headers a replacement response takes from the stored one, so none of the
 * response it replaces survive: the body's own headers, and the ones the
 * module stores.
 */
const BODY_HEADERS = ['content-type', 'content-length', 'content-encoding', 'etag', 'location', 'content-location'];

/**
 * Holds one HTTP response at the point where the platform writes it to the
 * socket, after every interceptor, serializer and exception filter of the
 * application has had its say. What is held there is exactly what the client
 * would receive, so it is what gets stored; nothing reaches the client until
 * the key's outcome is committed, and then either those bytes go out
 * untouched (`release`) or other ones instead (`replace`: a replay, or the
 * module's own problem answer).
 *
 * It works on Node's `ServerResponse` (Express's response, Fastify's
 * `reply.raw`), by wrapping `writeHead`, `write` and `end` on that one
 * object, so both adapters behave alike.
 */
export class WireCapture {
  private readonly original: Partial<Record<keyof WireMethods, { own: boolean; value: unknown }>> = {};
  private writeHeadCall?: Call;
  private readonly writes: Call[] = [];
  private endCall?: Call;
  private replacement?: { response: StoredResponse; headers: Array<[string, string]> };
  private settled = false;
  private onEnd?: () => void;

  private constructor(
    private readonly res: ServerResponse,
    private readonly storedHeaders: ReadonlySet<string>,
  ) {
    for (const name of WIRE_METHODS) {
      this.original[name] = { own: Object.prototype.hasOwnProperty.call(res, name), value: res[name] };
    }
    res.writeHead = ((...args: Call) => {
      this.writeHeadCall = args;
      return res;
    }) as ServerResponse['writeHead'];
    res.write = ((...args: Call) => {
      this.writes.push(args);
      const callback = args.find((arg) => typeof arg === 'function') as (() => void) | undefined;
      if (callback) process.nextTick(callback);
      return true;
    }) as ServerResponse['write'];
    res.end = ((...args: Call) => {
      this.endCall = args;
      if (this.replacement) this.send(this.replacement);
      else this.onEnd?.();
      return res;
    }) as ServerResponse['end'];
  }

  /**
   * Starts holding `res`. `storedHeaders` are the lower-case names of the
   * response headers that are stored (the replay allowlist).
   */
  static attach(res: ServerResponse, storedHeaders: ReadonlySet<string>): WireCapture {
    return new WireCapture(res, storedHeaders);
  }

  /**
   * Resolves with the response as the application sent it, once it has
   * (still held). Rejects with `ResponseNotSentError` after `timeoutMs`, and
   * then lets whatever comes later pass untouched.
   */
  sent(timeoutMs: number): Promise<StoredResponse> {
    if (this.endCall) return Promise.resolve(this.snapshot());
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.onEnd = undefined;
        this.release();
        reject(new ResponseNotSentError(timeoutMs));
      }, timeoutMs);
      this.onEnd = () => {
        clearTimeout(timer);
        this.onEnd = undefined;
        resolve(this.snapshot());
      };
    });
  }

  /** Lets the held response go out as the application wrote it; anything written later passes straight through. */
  release(): void {
    if (this.settled) return;
    this.settled = true;
    this.restore();
    if (this.writeHeadCall) (this.res.writeHead as (...args: Call) => unknown)(...this.writeHeadCall);
    for (const call of this.writes) (this.res.write as (...args: Call) => unknown)(...call);
    if (this.endCall) (this.res.end as (...args: Call) => unknown)(...this.endCall);
  }

  /**
   * Sends `response` instead of what the application writes: now if it has
   * written already, else as soon as it does. `headers` are added (e.g.
   * `Idempotent-Replayed`). Headers the application set that are not about
   * the body (a request id, CORS) are kept, as they would be on any answer.
   */
  replace(response: StoredResponse, headers: Array<[string, string]> = []): void {
    if (this.settled) return;
    this.replacement = { response, headers };
    if (this.endCall) this.send(this.replacement);
  }

  private send({ response, headers }: { response: StoredResponse; headers: Array<[string, string]> }): void {
    if (this.settled) return;
    this.settled = true;
    this.restore();
    const res = this.res;
    if (res.headersSent) {
      // Something flushed the head already; all that can be done is to end it.
      res.end();
      return;
    }
    for (const [name, value] of headerEntries(this.writeHeadCall)) res.setHeader(name, value);
    for (const name of [...BODY_HEADERS, ...this.storedHeaders]) res.removeHeader(name);
    for (const [name, value] of [...response.headers, ...headers]) res.setHeader(name, value);
    res.statusCode = response.status;
    const body = response.body;
    if (body && body.length > 0 && hasBody(response.status)) {
      res.setHeader('content-length', body.length);
      res.end(body);
    } else {
      res.end();
    }
  }

  /** The held response: status, the stored headers as they stand, and the body bytes. */
  private snapshot(): StoredResponse {
    const status = typeof this.writeHeadCall?.[0] === 'number' ? this.writeHeadCall[0] : this.res.statusCode;
    const all = new Map<string, string>();
    for (const [name, value] of Object.entries(this.res.getHeaders())) all.set(name, headerValue(value));
    for (const [name, value] of headerEntries(this.writeHeadCall)) all.set(name.toLowerCase(), value);
    const headers: Array<[string, string]> = [];
    for (const name of this.storedHeaders) {
      const value = all.get(name);
      if (value !== undefined && value !== '') headers.push([name, value]);
    }
    const chunks = [...this.writes, ...(this.endCall ? [this.endCall] : [])]
      .map((call) => toBuffer(call[0], call[1]))
      .filter((chunk): chunk is Buffer => chunk !== undefined);
    const body = chunks.length === 0 ? null : Buffer.concat(chunks);
    return { status, headers, body: body && body.length === 0 && !hasBody(status) ? null : body };
  }

  private restore(): void {
    const res = this.res as unknown as Record<string, unknown>;
    for (const name of WIRE_METHODS) {
      const saved = this.original[name]!;
      if (saved.own) res[name] = saved.value;
      else delete res[name];
    }
  }
}

/** The headers given to a held `writeHead(status, [message], [headers])` call, as name/value pairs. */
function headerEntries(call: Call | undefined): Array<[string, string]> {
  if (!call) return [];
  const headers = (typeof call[1] === 'string' ? call[2] : call[1]) as OutgoingHttpHeaders | unknown[] | undefined;
  if (!headers) return [];
  if (Array.isArray(headers)) {
    // Either [[name, value], ...] or a flat [name, value, name, value].
    if (headers.every((entry) => Array.isArray(entry))) {
      return (headers as Array<[string, unknown]>).map(([n, v]) => [String(n).toLowerCase(), headerValue(v)]);
    }
    const pairs: Array<[string, string]> = [];
    for (let i = 0; i + 1 < headers.length; i += 2) pairs.push([String(headers[i]).toLowerCase(), headerValue(headers[i + 1])]);
    return pairs;
  }
  return Object.entries(headers)
    .filter(([, value]) => value !== undefined)
    .map(([name, value]) => [name.toLowerCase(), headerValue(value)]);
}

function headerValue(value: unknown): string {
  return Array.isArray(value) ? value.map(String).join(', ') : String(value);
}

function toBuffer(chunk: unknown, encoding: unknown): Buffer | undefined {
  if (chunk === undefined || chunk === null || typeof chunk === 'function') return undefined;
  if (typeof chunk === 'string') return Buffer.from(chunk, typeof encoding === 'string' ? (encoding as BufferEncoding) : 'utf8');
  if (chunk instanceof Uint8Array) return Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
  return undefined;
}

/** Statuses that never carry a body (RFC 9110). */
function hasBody(status: number): boolean {
  return !(status === 204 || status === 304 || (status >= 100 && status < 200));
}
