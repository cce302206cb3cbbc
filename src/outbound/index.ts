/**
 * `nest-idempotency-pg/outbound`: derived keys on calls a handler makes to other
 * systems. `createDownstreamFetch` and `attachDownstreamKeys` need no package;
 * `IdempotentHttpModule` loads the optional peers `@nestjs/axios` and `axios`
 * when it is registered.
 */
export type { DownstreamKeyOptions } from './downstream-request-key.js';
export {
  createDownstreamFetch,
  type DownstreamFetch,
  type DownstreamFetchOptions,
  type DownstreamRequestInit,
} from './downstream-fetch.js';
export { attachDownstreamKeys, downstreamPurpose, type AxiosInstanceLike } from './axios-downstream-keys.js';
export { IdempotentHttpModule, type IdempotentHttpModuleOptions } from './idempotent-http.module.js';
