import { createParamDecorator, InternalServerErrorException, type ExecutionContext } from '@nestjs/common';
import type { AuthenticatedRequest } from './authenticated-request.js';

/** The tenant `ApiKeyGuard` authenticated for this request. */
export const CurrentTenant = createParamDecorator((_data: unknown, context: ExecutionContext): string => {
  const tenant = context.switchToHttp().getRequest<AuthenticatedRequest>().tenant;
  // Only reachable if a route is marked @Public() yet asks for a tenant: a wiring mistake, never a shared scope.
  if (!tenant) throw new InternalServerErrorException('No authenticated tenant on this request.');
  return tenant;
});
