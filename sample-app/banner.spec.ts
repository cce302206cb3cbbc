import { describe, expect, it } from '@jest/globals';
import { readFileSync } from 'node:fs';
import { boardBannerLine } from './banner.js';
import { loadConfig } from './config.js';

describe("the sample's start-up lines", () => {
  it('name the operator board and where a browser signs in to it', () => {
    const line = boardBannerLine('3000', loadConfig({}));
    expect(line).toContain('http://localhost:3000/board ');
    expect(line).toContain('sign in at http://localhost:3000/board/login');
    expect(line).toContain('such as demo-key-tenant-a');
  });

  it('never echo a configured key', () => {
    const line = boardBannerLine('3000', loadConfig({ SAMPLE_API_KEYS: 'secret-key-1:tenant-x' }));
    expect(line).not.toContain('secret-key-1');
    expect(line).toContain('/board/login');
  });

  it('are printed by main.ts', () => {
    expect(readFileSync(new URL('./main.ts', import.meta.url), 'utf8')).toContain('logger.log(boardBannerLine(port, config));');
  });
});
