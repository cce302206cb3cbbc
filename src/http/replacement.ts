import type { ServerResponse } from 'node:http';
import type { StoredResponse } from '../core/idempotency-store.js';
import type { FastifyReplyLike } from './platform-types.js';
import type { ExtraHeaders } from './response-capture.js';
import { headerEntries } from './write-head-headers.js';

/*
 * A response sent in place of the one the application made (a replay, the
 * module's problem answer; see `ResponseCapture.replace`): its status, its
 * stored headers in place of the app's body headers, and its body. A new
 * key's answer is released as the app made it and needs none of this.
 */

/** What goes out instead: the stored response, and the headers the module adds to it. */
export interface Replacement {
  response: StoredResponse;
  headers: ExtraHeaders;
}

/**
 * Sends `replacement` on Node's response (Express). `writeHeadCall` is the
 * app's held `writeHead` call, whose headers are set first as they would have
 * been; `stored` the names a replacement's take the place of.
 */
export function sendOnResponse(
  res: ServerResponse,
  writeHeadCall: unknown[] | undefined,
  stored: ReadonlySet<string>,
  { response, headers }: Replacement,
): void {
  if (res.headersSent) {
    // Something flushed the head already; all that can be done is to end it.
    res.end();
    return;
  }
  for (const [name, value] of headerEntries(writeHeadCall).values()) res.setHeader(name, value);
  for (const name of headersReplacedBy(stored)) res.removeHeader(name);
  const body = response.body;
  const length = body && body.length > 0 && hasBody(response.status) ? body.length : undefined;
  for (const [name, value] of groupHeaders([...response.headers, ...headers])) {
    // Put back in its place among the stored headers, with the length of the bytes sent now.
    if (name.toLowerCase() === 'content-length') {
      if (length !== undefined) res.setHeader(name, length);
    } else res.setHeader(name, value);
  }
  res.statusCode = response.status;
  if (length !== undefined) {
    if (!res.hasHeader('content-length')) res.setHeader('content-length', length);
    res.end(body);
  } else {
    res.end();
  }
}

/** Puts `replacement`'s status and headers on a Fastify reply in place of the app's body headers; returns the body to send. */
export function applyToReply(
  reply: FastifyReplyLike,
  stored: ReadonlySet<string>,
  { response, headers }: Replacement,
): Buffer | undefined {
  for (const name of headersReplacedBy(stored)) reply.removeHeader(name);
  for (const [name, value] of groupHeaders([...response.headers, ...headers])) {
    // Stored by Express (see WireCapture); Fastify sets the length of what it sends itself.
    if (name.toLowerCase() !== 'content-length') reply.header(name, value);
  }
  reply.code(response.status);
  const body = response.body;
  return body && body.length > 0 && hasBody(response.status) ? body : undefined;
}

/** Headers taken off a response before a replacement's are put on: the body's own, its length and the stored ones. */
function headersReplacedBy(stored: ReadonlySet<string>): string[] {
  return [...stored, 'content-length'];
}

/**
 * Name/value pairs grouped by name (without regard to case), in order: a
 * header given several times becomes one array, which Node writes as one
 * header line per value (`Set-Cookie` must never be joined with commas).
 * Each keeps the spelling of its first pair.
 */
function groupHeaders(pairs: Iterable<[string, string]>): Array<[string, string | string[]]> {
  const grouped = new Map<string, [string, string | string[]]>();
  for (const [name, value] of pairs) {
    const lower = name.toLowerCase();
    const current = grouped.get(lower);
    if (!current) grouped.set(lower, [name, value]);
    else current[1] = [...(Array.isArray(current[1]) ? current[1] : [current[1]]), value];
  }
  return [...grouped.values()];
}

/** Statuses that never carry a body (RFC 9110). */
export function hasBody(status: number): boolean {
  return !(status === 204 || status === 304 || (status >= 100 && status < 200));
}
