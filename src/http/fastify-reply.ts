import type { ServerResponse } from 'node:http';

/** The parts of a Fastify reply the capture uses, typed here so that Express apps never load Fastify's types. */
export interface FastifyReplyLike {
  raw: ServerResponse;
  readonly server: object;
  readonly statusCode: number;
  send(payload?: unknown): unknown;
  code(status: number): unknown;
  header(name: string, value: unknown): unknown;
  removeHeader(name: string): unknown;
  getHeaders(): Record<string, unknown>;
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
