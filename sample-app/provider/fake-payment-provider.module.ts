import { Module, type DynamicModule } from '@nestjs/common';
import { FakePaymentProviderController } from './fake-payment-provider.controller.js';
import { FAKE_PROVIDER_API_KEY, ProviderCredentialGuard } from './provider-credential.guard.js';

/** The fake payment provider (`/provider/*`), a stand-in for another company's API mounted in this app. */
@Module({})
export class FakePaymentProviderModule {
  /** @param options.apiKey the only credential it accepts */
  static register(options: { apiKey: string }): DynamicModule {
    return {
      module: FakePaymentProviderModule,
      controllers: [FakePaymentProviderController],
      providers: [{ provide: FAKE_PROVIDER_API_KEY, useValue: options.apiKey }, ProviderCredentialGuard],
    };
  }
}
