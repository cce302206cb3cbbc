import { request as httpRequest } from 'node:http';

export interface RawResponse {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  /** Name/value pairs as received, in order, duplicates kept (set by `send`). */
  rawHeaders?: string[];
  body: Buffer;
  json<T = any>(): T;
  text(): string;
}

/**
 * One real HTTP request with node:http, so tests see the exact bytes and can
 * send what fetch would refuse or merge (a header twice, raw header values).
 *
 * @param headers pairs, in order; a name may repeat.
 */
export function send(
  baseUrl: string,
  method: string,
  path: string,
  options: { headers?: Array<[string, string]>; body?: unknown; rawBody?: string | Buffer } = {},
): Promise<RawResponse> {
  const url = new URL(path, baseUrl);
  const payload =
    options.rawBody !== undefined
      ? Buffer.from(options.rawBody)
      : options.body !== undefined
        ? Buffer.from(JSON.stringify(options.body))
        : undefined;
  const flat: string[] = ['Host', url.host];
  const pairs = options.headers ?? [];
  if (payload && !pairs.some(([n]) => n.toLowerCase() === 'content-type')) flat.push('Content-Type', 'application/json');
  for (const [name, value] of pairs) flat.push(name, value);
  if (payload) flat.push('Content-Length', String(payload.length));
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      { host: url.hostname, port: url.port, path: url.pathname + url.search, method, headers: flat, agent: false },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const body = Buffer.concat(chunks);
          resolve({
            status: res.statusCode ?? 0,
            headers: res.headers,
            rawHeaders: res.rawHeaders,
            body,
            json: () => JSON.parse(body.toString('utf8')),
            text: () => body.toString('utf8'),
          });
        });
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    if (payload) req.write(payload);
    req.end();
  });
}

/** Shorthand: POST JSON with an idempotency key and a tenant. */
export function post(
  baseUrl: string,
  path: string,
  body: unknown,
  key: string | undefined,
  tenant = 'tenant-a',
  extraHeaders: Array<[string, string]> = [],
): Promise<RawResponse> {
  const headers: Array<[string, string]> = [['X-Tenant', tenant], ...extraHeaders];
  if (key !== undefined) headers.push(['Idempotency-Key', key]);
  return send(baseUrl, 'POST', path, { headers, body });
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
