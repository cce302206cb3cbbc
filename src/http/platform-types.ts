import type { ServerResponse } from 'node:http';

/**
 * The parts of an Express request or a Fastify request the module reads.
 * Both platforms parse `params`, `query` and `body` before interceptors run.
 */
export interface HttpRequest {
  method: string;
  body?: unknown;
  params?: Record<string, unknown>;
  query?: unknown;
  rawHeaders?: string[];
  raw?: { rawHeaders?: string[] };
  /** Express: the route that matched. */
  route?: { path?: unknown };
  /** Fastify: the route that matched. */
  routeOptions?: { url?: unknown };
}

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
