import { messages } from '../errors/messages.js';

/** Raised when the application has not sent a response within the time the capture waits for one. */
export class ResponseNotSentError extends Error {
  constructor(readonly waitedMs: number) {
    super(`The application sent no response within ${waitedMs} ms of the handler finishing.`);
    this.name = 'ResponseNotSentError';
  }
}

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
