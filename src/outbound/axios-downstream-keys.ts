import { downstreamKeyFor, resolveDownstreamKeyOptions, type DownstreamKeyOptions } from './downstream-request-key.js';

/**
 * What `attachDownstreamKeys` needs of an axios instance (`HttpService.axiosRef`
 * of `@nestjs/axios`, or `axios.create()`), typed by shape so that this
 * package's types never import axios.
 */
export interface AxiosInstanceLike {
  interceptors: {
    request: {
      use(onFulfilled: (config: any) => any): number;
      eject(id: number): void;
    };
  };
}

/** The fields of an axios request config the interceptor reads and writes. */
interface AxiosRequestConfigLike {
  method?: string;
  url?: string;
  baseURL?: string;
  headers?: unknown;
  idempotencyPurpose?: string;
}

/** An `AxiosHeaders` (axios 1.x, in interceptors) or a plain object. */
interface HeadersLike {
  has?(name: string): boolean;
  set?(name: string, value: string): unknown;
  [name: string]: unknown;
}

/**
 * Adds a request interceptor to an axios instance that gives each POST or
 * PATCH made inside an idempotent request or execution a derived
 * `Idempotency-Key` (see `createDownstreamFetch` for the rules: a purpose
 * per call, or the method and path; a header the call sets itself wins).
 * Returns a function that removes it.
 *
 * ```ts
 * constructor(http: HttpService) { attachDownstreamKeys(http.axiosRef, { maxLength: 64 }); }
 * await firstValueFrom(this.http.post(url, body, downstreamPurpose('charge')));
 * ```
 */
export function attachDownstreamKeys(instance: AxiosInstanceLike, options: DownstreamKeyOptions = {}): () => void {
  const resolved = resolveDownstreamKeyOptions(options);
  const id = instance.interceptors.request.use((config: AxiosRequestConfigLike) => {
    const headers = (config.headers ?? {}) as HeadersLike;
    if (hasHeader(headers, resolved.header)) return config;
    // axios lower-cases the method before interceptors run, and joins baseURL and url only after them.
    const key = downstreamKeyFor(config.method ?? 'get', fullUrl(config), config.idempotencyPurpose, resolved);
    if (key === undefined) return config;
    if (typeof headers.set === 'function') headers.set(resolved.header, key);
    else config.headers = { ...headers, [resolved.header]: key };
    return config;
  });
  return () => instance.interceptors.request.eject(id);
}

/**
 * An axios request config that names the call's purpose for its derived key:
 * `http.post(url, body, downstreamPurpose('charge', { timeout: 5000 }))`. Typed
 * as the config given, so it needs no augmentation of axios's types.
 */
export function downstreamPurpose<T extends object>(purpose: string, config?: T): T {
  return { ...config, idempotencyPurpose: purpose } as T;
}

function hasHeader(headers: HeadersLike, name: string): boolean {
  if (typeof headers.has === 'function') return headers.has(name);
  const lower = name.toLowerCase();
  return Object.keys(headers).some((header) => header.toLowerCase() === lower && headers[header] !== undefined);
}

function fullUrl(config: AxiosRequestConfigLike): string {
  const url = config.url ?? '';
  if (!config.baseURL || /^([a-z][a-z\d+\-.]*:)?\/\//i.test(url)) return url;
  return `${config.baseURL.replace(/\/+$/, '')}/${url.replace(/^\/+/, '')}`;
}
