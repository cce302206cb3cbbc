import { Module, type DynamicModule } from '@nestjs/common';
import { outboundMessages } from './messages.js';
import { attachDownstreamKeys } from './axios-downstream-keys.js';
import { resolveDownstreamKeyOptions, type DownstreamKeyOptions } from './downstream-request-key.js';
import { loadOptionalPackage } from './optional-package.js';

export interface IdempotentHttpModuleOptions extends DownstreamKeyOptions {
  /** What `HttpModule.register()` takes: axios defaults such as `baseURL`, `timeout`, `headers`. */
  http?: Record<string, unknown>;
}

/** Token of the function that detaches the interceptor; the provider exists so that Nest attaches it at start-up. */
const DOWNSTREAM_KEYS_INTERCEPTOR = Symbol('DOWNSTREAM_KEYS_INTERCEPTOR');

type NestAxios = typeof import('@nestjs/axios');

/**
 * `HttpModule` of `@nestjs/axios` whose `HttpService` attaches derived keys:
 * every POST or PATCH a handler makes with it inside an idempotent request
 * carries an `Idempotency-Key` derived from the request's (see
 * `attachDownstreamKeys`). `@nestjs/axios` and `axios` are optional peers,
 * loaded only when this module is registered.
 *
 * ```ts
 * @Module({ imports: [IdempotentHttpModule.register({ http: { baseURL: 'https://api.provider.example', timeout: 5000 }, maxLength: 64 })] })
 * ```
 */
@Module({})
export class IdempotentHttpModule {
  static async register(options: IdempotentHttpModuleOptions = {}): Promise<DynamicModule> {
    const { http, ...keyOptions } = options;
    // Refused at start-up, before @nestjs/axios is even looked for.
    resolveDownstreamKeyOptions(keyOptions);
    const { HttpModule, HttpService } = await loadOptionalPackage<NestAxios>('@nestjs/axios', outboundMessages.axiosMissing);
    return {
      module: IdempotentHttpModule,
      imports: [HttpModule.register(http ?? {})],
      providers: [
        {
          provide: DOWNSTREAM_KEYS_INTERCEPTOR,
          inject: [HttpService],
          useFactory: (service: InstanceType<typeof HttpService>) => attachDownstreamKeys(service.axiosRef, keyOptions),
        },
      ],
      exports: [HttpModule],
    };
  }
}
