import { StreamableFile } from '@nestjs/common';
import { messages } from '../errors/messages.js';

/** Thrown when a handler returns a value that cannot be stored as bytes (a stream, an async iterable). */
export class UnreplayableResponseError extends Error {
  constructor(what: string, message = `The handler returned ${what}, which cannot be stored and replayed.`) {
    super(message);
    this.name = 'UnreplayableResponseError';
  }
}

/**
 * The response is longer than the route's `maxResponseBytes`. It is refused
 * like any other response that cannot be stored: were it held until the
 * commit and written to the key table, one large answer (or many at once)
 * would cost the process its memory and every replay a large read.
 */
export class ResponseTooLargeError extends UnreplayableResponseError {
  constructor(readonly maxBytes: number) {
    super('a response too large to store', messages.capture.responseTooLarge(maxBytes));
    this.name = 'ResponseTooLargeError';
  }
}

/** What kind of unstorable value `value` is, or undefined when it can be stored once sent. */
export function describeUnreplayable(value: unknown): string | undefined {
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
