import { DEFAULT_API_KEYS, parseApiKeys, type SampleConfig } from './config.js';

/** A demo key the app accepts, if any: a configured secret is never echoed into logs. */
export function demoKeyOf(config: Pick<SampleConfig, 'apiKeys'>): string | undefined {
  return [...parseApiKeys(DEFAULT_API_KEYS).keys()].find((key) => config.apiKeys.has(key));
}

/** The start-up line that names the operator board and where a browser signs in to it. */
export function boardBannerLine(port: string, config: Pick<SampleConfig, 'apiKeys'>): string {
  const demoKey = demoKeyOf(config);
  return (
    `Operator board: http://localhost:${port}/board (in a browser, sign in at http://localhost:${port}/board/login ` +
    `with an API key${demoKey ? `, such as ${demoKey}` : ''}; scripts send it as "Authorization: Bearer <key>")`
  );
}
