import { ProblemType } from '../../../src/index.js';
import { send, type RawResponse } from '../../support/http.js';

/** The sample app's default API key for tenant-a. */
export const API_KEY = 'demo-key-tenant-a';

export interface ChargeBody {
  amount: number;
  currency: string;
  customer: string;
  simulate?: { delayMs?: number; outcome?: 'decline' | 'error' };
}

/** A charge whose customer names the intent, so its rows can be counted per intent. */
export function chargeBody(customer: string, simulate?: ChargeBody['simulate']): ChargeBody {
  return { amount: 4200, currency: 'eur', customer, ...(simulate ? { simulate } : {}) };
}

export function postCharge(
  baseUrl: string,
  key: string,
  body: ChargeBody,
  extraHeaders: Array<[string, string]> = [],
): Promise<RawResponse> {
  return send(baseUrl, 'POST', '/charges', {
    headers: [['Authorization', `Bearer ${API_KEY}`], ['Idempotency-Key', key], ...extraHeaders],
    body,
  });
}

/** `201`, `201 replayed`, `409 conflict`, `409 lease-lost`, `503 store-unavailable`, `500`…: an answer as the figures count it. */
export function answerLabel(res: RawResponse): string {
  if (res.headers['idempotent-replayed'] === 'true') return `${res.status} replayed`;
  const type = problemType(res);
  return type ? `${res.status} ${type.slice(type.lastIndexOf(':') + 1)}` : String(res.status);
}

export function problemType(res: RawResponse): string | undefined {
  if (!String(res.headers['content-type'] ?? '').startsWith('application/problem+json')) return undefined;
  try {
    const type: unknown = res.json().type;
    return typeof type === 'string' ? type : undefined;
  } catch {
    return undefined;
  }
}

/** A 409 the module produced because another attempt holds the key: problem type, and a whole-second Retry-After >= 1. */
export function isConflictWithRetryAfter(res: RawResponse): boolean {
  const retryAfter = Number(res.headers['retry-after']);
  return res.status === 409 && problemType(res) === ProblemType.conflict && Number.isInteger(retryAfter) && retryAfter >= 1;
}

/**
 * What a request ended in when no response came back (the connection died),
 * e.g. `ECONNRESET: socket hang up`; undefined for a response. (Errors from
 * node:http come from another realm than the test's, so `instanceof Error`
 * cannot tell.)
 */
export function transportFailure(outcome: RawResponse | unknown): string | undefined {
  if (outcome && typeof outcome === 'object' && typeof (outcome as RawResponse).status === 'number') return undefined;
  const { code, message } = (outcome ?? {}) as { code?: unknown; message?: unknown };
  return `${typeof code === 'string' ? `${code}: ` : ''}${typeof message === 'string' ? message : String(outcome)}`;
}
