import type { ServerResponse } from 'node:http';
import type { FingerprintInput } from '../core/fingerprint-input.js';
import type { FastifyReplyLike, HttpRequest } from './platform-types.js';

/** Every occurrence of the header, so a header sent twice is not silently joined into one value. */
export function headerValues(request: HttpRequest, header: string): string[] {
  const raw = request.rawHeaders ?? request.raw?.rawHeaders ?? [];
  const wanted = header.toLowerCase();
  const values: string[] = [];
  for (let i = 0; i < raw.length; i += 2) {
    if (raw[i].toLowerCase() === wanted) values.push(raw[i + 1]);
  }
  return values;
}

/**
 * What identifies the request for its fingerprint: the route's pattern (not the target as spelled, so an
 * absolute-form target, a trailing `?`, or a slash or letter case the router ignores change nothing), its
 * parameters, the parsed query and body. `routeName` stands in where the platform exposes no pattern.
 */
export function fingerprintInput(request: HttpRequest, routeName: string): FingerprintInput {
  const pattern = request.routeOptions?.url ?? request.route?.path;
  return {
    method: request.method,
    route: typeof pattern === 'string' ? pattern : routeName,
    params: { ...(request.params ?? {}) },
    query: request.query ?? {},
    body: request.body,
  };
}

/** Node's response under the platform's: Express's response is one, Fastify's reply wraps one in `raw`. */
export function serverResponse(response: unknown): ServerResponse {
  const raw = (response as { raw?: ServerResponse }).raw;
  return raw && typeof raw.setHeader === 'function' ? raw : (response as ServerResponse);
}

/** Whether `response` is a Fastify reply (Nest hands interceptors the reply, not Node's response). */
export function isFastifyReply(response: unknown): response is FastifyReplyLike {
  const reply = response as Partial<FastifyReplyLike> | null;
  return (
    typeof reply === 'object' &&
    reply !== null &&
    typeof reply.raw?.setHeader === 'function' &&
    typeof reply.send === 'function' &&
    typeof reply.getHeaders === 'function' &&
    typeof reply.server === 'object'
  );
}
