import { StreamableFile } from '@nestjs/common';
import { isUtf8 } from 'node:buffer';
import type { StoredResponse } from '../store/idempotency-store.js';

export type PlatformType = 'express' | 'fastify' | string;

/** Thrown while capturing a value that cannot be stored as bytes (a stream, an SSE source). */
export class UnreplayableResponseError extends Error {
  constructor(what: string) {
    super(`The handler returned ${what}, which cannot be stored and replayed.`);
    this.name = 'UnreplayableResponseError';
  }
}

const JSON_TYPE = 'application/json; charset=utf-8';
const OCTET_TYPE = 'application/octet-stream';

/**
 * Turns a handler's return value into the exact bytes that will be sent, and
 * the Content-Type they go with. Both adapters' defaults are reproduced here
 * (Express sends a string as HTML and a number as text; Fastify sends both as
 * text/JSON), so a route behaves as it would without the module, except that
 * a Buffer is sent as raw bytes on Express too.
 *
 * @param presetType the Content-Type already on the response (from `@Header()`
 *   or the response object); it wins over the defaults.
 */
export function encodeBody(
  value: unknown,
  platform: PlatformType,
  presetType: string | undefined,
): { body: Buffer | null; contentType: string | undefined } {
  if (value === undefined || value === null) return { body: null, contentType: presetType };
  if (typeof value === 'string') {
    return {
      body: Buffer.from(value, 'utf8'),
      contentType: presetType ?? (platform === 'express' ? 'text/html; charset=utf-8' : 'text/plain; charset=utf-8'),
    };
  }
  if (Buffer.isBuffer(value) || value instanceof Uint8Array) {
    return { body: Buffer.from(value), contentType: presetType ?? OCTET_TYPE };
  }
  const unreplayable = describeUnreplayable(value);
  if (unreplayable) throw new UnreplayableResponseError(unreplayable);
  if ((typeof value === 'number' || typeof value === 'boolean' || typeof value === 'bigint') && platform === 'express') {
    return { body: Buffer.from(String(value), 'utf8'), contentType: presetType ?? 'text/html; charset=utf-8' };
  }
  const json = JSON.stringify(value);
  if (json === undefined) return { body: null, contentType: presetType };
  return { body: Buffer.from(json, 'utf8'), contentType: presetType ?? JSON_TYPE };
}

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

/**
 * The value handed back to Nest for sending `response`, chosen so that the
 * adapter sends the stored bytes untouched. The original response goes out
 * through this same function, so it and every replay are the same bytes and
 * get the same derived headers (Content-Length, Express's ETag).
 */
export function toWireValue(response: StoredResponse, platform: PlatformType): unknown {
  const body = response.body;
  if (body === null) return undefined;
  if (platform !== 'express') return body;
  const type = response.headers.find(([name]) => name === 'content-type')?.[1] ?? '';
  // Express sends strings as they are (adding a charset to the type), but
  // turns any object, a Buffer included, into JSON: binary goes as a stream.
  if (isTextual(type) && isUtf8(body)) return body.toString('utf8');
  return new StreamableFile(body, { length: body.length });
}

function isTextual(contentType: string): boolean {
  const type = contentType.toLowerCase();
  return type.startsWith('text/') || type.includes('json') || type.includes('xml') || type.includes('javascript');
}
