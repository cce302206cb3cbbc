import { Inject, Injectable, type CanActivate, type ExecutionContext, type OnModuleInit, type Type } from '@nestjs/common';
import { ModuleRef } from '@nestjs/core';
import { isObservable, lastValueFrom } from 'rxjs';
import { boardProblems } from './board-problems.js';
import { BOARD_OPTIONS, type BoardScope, type ResolvedBoardOptions } from './board.options.js';

/** The scope each admitted request was given, read by the controller. Keyed by the adapter's request object. */
const scopes = new WeakMap<object, BoardScope>();

export function scopeOf(request: object): BoardScope {
  const scope = scopes.get(request);
  // The guard runs before every handler of the board: a request without a scope never got past it.
  if (!scope) throw boardProblems.badScope();
  return scope;
}

function isScope(value: unknown): value is BoardScope {
  if (typeof value !== 'object' || value === null) return false;
  const scope = value as { tenant?: unknown; allTenants?: unknown };
  if (scope.allTenants === true) return scope.tenant === undefined;
  return typeof scope.tenant === 'string' && scope.tenant.length > 0;
}

/**
 * Runs the app's guard, then records which tenants the admitted operator may
 * see. Fails closed: a scope function that answers anything but a scope
 * refuses the request.
 */
@Injectable()
export class BoardGuard implements CanActivate, OnModuleInit {
  private appGuard?: CanActivate;

  constructor(
    @Inject(BOARD_OPTIONS) private readonly options: ResolvedBoardOptions,
    private readonly moduleRef: ModuleRef,
  ) {}

  async onModuleInit(): Promise<void> {
    const guard = this.options.guard;
    if (!guard || typeof guard !== 'function') {
      this.appGuard = guard;
      return;
    }
    // The app's own instance when the guard is one of its providers (with its dependencies), else one of ours.
    try {
      this.appGuard = this.moduleRef.get(guard as Type<CanActivate>, { strict: false });
    } catch {
      this.appGuard = await this.moduleRef.create(guard as Type<CanActivate>);
    }
  }

  async canActivate(context: ExecutionContext): Promise<boolean> {
    if (this.appGuard) {
      const admitted = this.appGuard.canActivate(context);
      const result = isObservable(admitted) ? await lastValueFrom(admitted) : await admitted;
      if (!result) return false;
    } else if (!this.options.unguarded) {
      return false;
    }
    const scope = this.options.scope ? await this.options.scope(context) : { allTenants: true as const };
    if (!isScope(scope)) throw boardProblems.badScope();
    scopes.set(context.switchToHttp().getRequest<object>(), scope);
    return true;
  }
}
