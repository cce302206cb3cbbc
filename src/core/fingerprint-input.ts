/**
 * What identifies "the same request" for one key. `route` is the route that matched (its pattern, or a stand-in
 * name), never the target as the client spelled it; `body` is what the platform parsed: JSON, or raw bytes/text.
 */
export interface FingerprintInput {
  method: string;
  route: string;
  params: Record<string, unknown>;
  query: unknown;
  body: unknown;
}
