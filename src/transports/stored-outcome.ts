import type { StoredResponse } from '../core/idempotency-store.js';

const JSON_HEADERS: Array<[string, string]> = [['content-type', 'application/json']];

/*
 * Outcomes that are not HTTP responses (a GraphQL mutation's, a message
 * handler's, an `execute()` call's) are stored as JSON. Their stored shapes
 * are kept as they are, since keys stored by an earlier version are replayed
 * by this one.
 */

/** What a GraphQL mutation's or a message handler's outcome is stored as: its value, or a definite error to replay. */
export type StoredOutcome<E = unknown> = { value: unknown } | { error: E };

/** `value` as a stored JSON response. */
export function jsonResponse(value: unknown, status: number): StoredResponse {
  return { status, headers: JSON_HEADERS, body: Buffer.from(JSON.stringify(value), 'utf8') };
}

/** A stored JSON response read back; `empty` when it has no body. */
export function readJson<T>(response: StoredResponse, empty: T): T {
  return response.body ? (JSON.parse(response.body.toString('utf8')) as T) : empty;
}
