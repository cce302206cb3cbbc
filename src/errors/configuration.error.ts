export { IdempotencyConfigurationError } from '../core/configuration-error.js';
