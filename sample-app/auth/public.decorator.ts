import { SetMetadata } from '@nestjs/common';

export const PUBLIC_ROUTE = 'sample-app:public-route';

/** Lets a route (or controller) through `ApiKeyGuard` without an API key, e.g. health checks. */
export const Public = () => SetMetadata(PUBLIC_ROUTE, true);
