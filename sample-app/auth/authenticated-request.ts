/** The part of an Express or Fastify request the sample app relies on once the API key guard has run. */
export interface AuthenticatedRequest {
  headers: Record<string, string | string[] | undefined>;
  /** Set by `ApiKeyGuard` from the caller's API key; absent on public routes. */
  tenant?: string;
}
