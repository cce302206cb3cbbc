import { IdempotencyConfigurationError } from '../errors/configuration.error.js';

/**
 * Imports an optional peer dependency when a feature needs it, so that apps
 * without the feature need not install it. A missing package is a
 * configuration error with `missing` (which says what to install); any other
 * failure to load it is rethrown as it is.
 */
export async function loadOptionalPackage<T>(specifier: string, missing: string): Promise<T> {
  try {
    return (await import(specifier)) as T;
  } catch (error) {
    const code = (error as { code?: unknown }).code;
    const notFound =
      (code === 'ERR_MODULE_NOT_FOUND' || code === 'MODULE_NOT_FOUND') && String((error as Error).message).includes(specifier);
    if (notFound) throw new IdempotencyConfigurationError(missing);
    throw error;
  }
}
