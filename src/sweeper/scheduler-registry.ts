import type { ModuleRef } from '@nestjs/core';
import { IdempotencyConfigurationError } from '../errors/configuration.error.js';
import { messages } from '../errors/messages.js';

/** The part of @nestjs/schedule's SchedulerRegistry this module uses. */
export interface IntervalRegistry {
  addInterval(name: string, interval: ReturnType<typeof setInterval>): void;
  deleteInterval(name: string): void;
  doesExist(type: 'interval', name: string): boolean;
}

/**
 * Finds the app's SchedulerRegistry. `@nestjs/schedule` is an optional peer,
 * loaded only when something is scheduled, so apps that schedule nothing do
 * not need it installed.
 */
export async function schedulerRegistry(moduleRef: ModuleRef): Promise<IntervalRegistry> {
  try {
    const schedule = await import('@nestjs/schedule');
    return moduleRef.get(schedule.SchedulerRegistry, { strict: false });
  } catch {
    throw new IdempotencyConfigurationError(messages.config.scheduleMissing);
  }
}
