import { Injectable, type OnModuleInit } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import { captureOnSend, hooked } from './fastify-capture.js';

/**
 * Adds the capture hook to the app's Fastify instance. It goes in when the
 * module is instantiated, before the app registers its plugins in `main.ts`
 * (`NestFactory.create`), so that it is the first `onSend` hook; an app
 * built through `Test.createTestingModule` gets it when it initialises.
 */
@Injectable()
export class FastifyCaptureHook implements OnModuleInit {
  constructor(private readonly adapterHost: HttpAdapterHost) {
    this.install();
  }

  onModuleInit(): void {
    this.install();
  }

  private install(): void {
    const adapter = this.adapterHost?.httpAdapter;
    if (!adapter || adapter.getType() !== 'fastify') return;
    const instance = adapter.getInstance<{ addHook(name: 'onSend', hook: typeof captureOnSend): unknown }>();
    if (hooked.has(instance)) return;
    try {
      instance.addHook('onSend', captureOnSend);
    } catch {
      // Started already (a module loaded lazily after listen()): its replies are held at reply.raw instead.
      return;
    }
    hooked.add(instance);
  }
}
