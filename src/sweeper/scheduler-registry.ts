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

/**
 * Runs `tick` every `intervalMs`, registered in the app's SchedulerRegistry
 * under `name` so it shows up with the app's other jobs.
 * @returns a function that stops it
 */
export async function scheduleInterval(
  moduleRef: ModuleRef,
  name: string,
  intervalMs: number,
  tick: () => void,
): Promise<() => void> {
  const registry = await schedulerRegistry(moduleRef);
  const timer = setInterval(tick, intervalMs);
  // A pending tick must not keep a process alive that is otherwise done.
  timer.unref?.();
  registry.addInterval(name, timer);
  return () => {
    if (registry.doesExist('interval', name)) registry.deleteInterval(name);
    clearInterval(timer);
  };
}
