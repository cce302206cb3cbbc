/**
 * Thrown at start-up when the module is configured in a way that cannot work; the message says how to fix it.
 * Framework-free, so the client (which has no Nest) throws the same class for its own options.
 */
export class IdempotencyConfigurationError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'IdempotencyConfigurationError';
  }
}
