import { deriveKey, type DeriveKeyOptions } from '../core/derived-keys.js';
import { IdempotencyConfigurationError } from '../errors/configuration.error.js';
import { outboundMessages } from './messages.js';
import { DEFAULT_HEADER } from '../idempotency.constants.js';
import { idempotencyContext } from '../transaction/idempotency-context.js';

export interface DownstreamKeyOptions extends DeriveKeyOptions {
  /** The header that carries the derived key to the other system. Default `'Idempotency-Key'`. */
  header?: string;
  /**
   * Methods whose calls get a key. Default `['POST', 'PATCH']`: GET, HEAD,
   * PUT and DELETE are idempotent by definition, and providers (Stripe,
   * Adyen) take keys on POST.
   */
  methods?: readonly string[];
}

export interface ResolvedDownstreamKeyOptions {
  header: string;
  methods: ReadonlySet<string>;
  derive: DeriveKeyOptions;
}

export const DOWNSTREAM_KEY_DEFAULTS = { header: DEFAULT_HEADER, methods: ['POST', 'PATCH'] } as const;

const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;

export function resolveDownstreamKeyOptions(options: DownstreamKeyOptions = {}): ResolvedDownstreamKeyOptions {
  const header = options.header ?? DOWNSTREAM_KEY_DEFAULTS.header;
  if (typeof header !== 'string' || !TOKEN.test(header)) throw new IdempotencyConfigurationError(outboundMessages.header(header));
  const methods = options.methods ?? DOWNSTREAM_KEY_DEFAULTS.methods;
  if (!Array.isArray(methods) || methods.length === 0 || !methods.every((m) => typeof m === 'string' && TOKEN.test(m))) {
    throw new IdempotencyConfigurationError(outboundMessages.methods(methods));
  }
  try {
    // Checked now rather than on the first call: deriveKey refuses a bad maxLength.
    deriveKey({ tenant: 't', key: 'k' }, 'check', { maxLength: options.maxLength, secret: options.secret });
  } catch (error) {
    throw new IdempotencyConfigurationError(`Downstream keys: ${(error as Error).message}`);
  }
  return {
    header,
    methods: new Set(methods.map((m) => m.toUpperCase())),
    derive: { maxLength: options.maxLength, secret: options.secret },
  };
}

/**
 * Default purposes already used in an execution. Keyed by the execution's
 * scope, which every phase of an attempt shares and a new attempt replaces.
 */
const defaultPurposesUsed = new WeakMap<object, Set<string>>();

/**
 * The derived key for one outbound call, or undefined when the call gets
 * none (a method not keyed, or no idempotent execution around it). The key
 * is `deriveKey(scope, purpose)`, exactly what `DownstreamKeys.derive(purpose)`
 * gives in the same execution.
 *
 * Without an explicit purpose the call's method and path are the purpose
 * (`POST /v1/charges`): the host is left out, since one provider may be
 * reached under several names, and so is the query, which often carries
 * per-attempt values. A second call with the same default purpose in one
 * execution throws: it would carry the first call's key, and the provider
 * would answer it with the first call's outcome.
 */
export function downstreamKeyFor(
  method: string,
  url: string,
  purpose: string | undefined,
  options: ResolvedDownstreamKeyOptions,
): string | undefined {
  const upper = method.toUpperCase();
  if (!options.methods.has(upper)) return undefined;
  const scope = idempotencyContext.getStore()?.scope;
  if (!scope) return undefined;
  if (purpose !== undefined) {
    if (typeof purpose !== 'string' || purpose === '') throw new TypeError(outboundMessages.purpose);
    return deriveKey(scope, purpose, options.derive);
  }
  const path = pathOf(url);
  const derived = `${upper} ${path}`;
  const used = defaultPurposesUsed.get(scope) ?? new Set<string>();
  if (used.has(derived)) throw new IdempotencyConfigurationError(outboundMessages.repeatedCall(upper, path));
  used.add(derived);
  defaultPurposesUsed.set(scope, used);
  return deriveKey(scope, derived, options.derive);
}

/** The path of an absolute or relative URL, normalised as WHATWG URL does (dot segments, percent-encoding). */
function pathOf(url: string): string {
  return new URL(url, 'http://relative.invalid').pathname;
}
