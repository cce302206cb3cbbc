import { describe, expect, it } from '@jest/globals';
import { boardKey } from './board-key.js';

describe('boardKey: a key as the board lists it', () => {
  it('tells apart keys that share their start and their length', () => {
    expect(boardKey('err-1')).toMatch(/^e…1 \(5\) #[0-9a-f]{6}$/);
    expect(boardKey('err-2')).toMatch(/^e…2 \(5\) #[0-9a-f]{6}$/);
    expect(boardKey('err-1')).not.toBe(boardKey('err-2'));
  });

  it('tells apart keys alike at both ends by their tag', () => {
    expect(boardKey('order-123-x')).not.toBe(boardKey('order-456-x'));
  });

  it('reads the same for the same key, wherever it is shown', () => {
    expect(boardKey('3f2a0c1e-9b7d-4e5f-8a6b-1c2d3e4f9c1d')).toBe(boardKey('3f2a0c1e-9b7d-4e5f-8a6b-1c2d3e4f9c1d'));
  });

  it('never shows the middle of a long key, nor more than a third of a short one at each end', () => {
    const secret = 'sk_live_51HxQ2eLkdIwHu7ix0n9';
    expect(boardKey(secret)).toMatch(/^sk_l…x0n9 \(28\) #[0-9a-f]{6}$/);
    expect(boardKey(secret)).not.toContain('51HxQ2');
    expect(boardKey('ab')).toMatch(/^… \(2\) #[0-9a-f]{6}$/);
    expect(boardKey('abcdef')).toMatch(/^ab…ef \(6\) #[0-9a-f]{6}$/);
  });

  it('counts and cuts characters, not UTF-16 units', () => {
    expect(boardKey('clé ✓ 😀😀😀')).toMatch(/^clé…😀😀😀 \(9\) #[0-9a-f]{6}$/);
  });
});
